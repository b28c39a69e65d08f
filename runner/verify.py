"""The blind solve of a slice's new questions (VERIFY), inside the slice's lease.

Where it runs: in the chapter task itself, right after each commit of generated questions,
under the same lease (README, "Verification"). The commit stores the questions with the
verdict `pending` (and, under VERIFY, never marks the slice done); then, for the pending
questions of the slice's range, one solve call per committed batch is recorded (reserved
against the budget, fenced by the lease), checked for a cancel or a takeover right before
its send, sent through the shared rate limiter, and its verdicts are booked with its usage
in one transaction fenced by the lease (`Store.commit_verdicts`). The slice is done once
its range is full and no verdict of it is pending.

Exactly once: a verdict is booked only with its call, and only while `pending`. A holder
killed anywhere leaves either pending verdicts with no call (after the commit: the takeover
solves them), a recorded call in flight (booked by the takeover at its worst case, as any
call of a dead holder; the questions are still pending and are solved again: what was in
flight is all that is lost), or booked verdicts (nothing more to do).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from examforge import item_types, verify
from examforge.errors import BudgetExceeded, LeaseLost, OutputInvalid, SolverDisputes
from examforge.llm import Admission, Completion, LLMClient
from examforge.retry import HandBack
from storage.models import CallKind, CallOutcome, CallReason
from storage.store import Claimed, Judged, NoRoom, SendCheck, Usage

log = logging.getLogger("examforge.verify")

# The longest a solve waits in its thread for the shared rate limiter (as a generation call).
RATE_WAIT_MAX_S = 60.0

Call = Callable[[LLMClient, int, list[dict[str, str]], int, Admission], Completion]


def test_hook(step: str) -> None:
    """EXAMFORGE_TEST_VERIFY_CRASH=<step>: a test's SIGKILL at that step of a solve
    (tests/e2e/test_verify_crash.py). Unset in production: a no-op."""
    if os.environ.get("EXAMFORGE_TEST_VERIFY_CRASH") == step:
        os.kill(os.getpid(), 9)


def check_disputes(settings: Any, claim: Claimed, judged: Judged) -> None:
    """Stop a slice whose replacements keep being disputed (VERIFY=replace): raise
    SolverDisputes, which pauses the exam (PauseCode.disputes), once the slice's solves
    (since its last `resume`) disputed VERIFY_MAX_DISPUTED_IN_ROW keys in a row, or more
    than VERIFY_MAX_DISPUTED_SHARE of at least that many. Each disputed key is withdrawn and
    generated again, each a paid call that counts as progress: without this, a solver (or a
    generator) that is always wrong spends without end. The reason says what to check."""
    in_row, share = settings.verify_max_disputed_in_row, settings.verify_max_disputed_share
    solved, disputed = judged.solved_keys, judged.disputed_keys
    if judged.disputed_in_row >= in_row:
        bound = f"{judged.disputed_in_row} in a row"
    elif solved >= in_row and disputed > share * solved:
        bound = f"more than {share:.0%}"
    else:
        return
    raise SolverDisputes(
        f"the solver disputed {disputed} of {solved} keys ({bound}) in "
        f"{claim.exam}/{claim.chapter_id} slice {claim.slice_no}: check VERIFY_MODEL (the "
        "blind solver; default: LLM_MODEL) and LLM_MODEL (the keys), then run resume")


def solve_pending(rt: Any, claim: Claimed, check: Callable[[], None],
                  lost: threading.Event, call: Call, stored: int, target: int, *,
                  replace: bool = False) -> Judged | None:
    """Solve every pending question of the claimed slice and book the verdicts (`rt`: the
    worker's runner.pipeline.Runtime, not imported: the pipeline imports this); returns the
    slice as the last booking left it (done, cancelled, or still short of its target), or
    None when a cancel came before a solve was sent (nothing more is sent). `stored` and
    `target`: the slice as the caller last read it, for when nothing is pending. `replace`:
    the exam's policy is `replace` (a disputed question is withdrawn)."""
    store, settings = rt.store, rt.settings
    solver = rt.solver()
    unreadable = 0
    judged: Judged | None = None
    while True:
        pending = store.pending_verdicts(claim)
        if not pending:
            break
        check()
        # With sources, each question is solved with the passage it cites, shown once for
        # the questions citing it (grouped; a verdict is booked by question id).
        chunk = sorted(pending[:verify.SOLVE_MAX_QUESTIONS],
                       key=lambda p: (p.passage is not None, p.passage or ""))
        items = [verify.item(p.question, p.choices, p.type,
                             item_types.load(p.answer).get("unit")) for p in chunk]
        messages = verify.build_messages(items, [p.passage for p in chunk],
                                         language=claim.language)
        cap = verify.max_tokens(len(items), items)
        prompt_tokens = solver.count_prompt(messages)
        admission = solver.admit(messages, cap, max_wait_s=RATE_WAIT_MAX_S, check=check,
                                 prompt_tokens=prompt_tokens)
        try:
            booked = store.start_call(
                claim, chunk[0].number, len(chunk), lease_s=settings.lease_s,
                prompt_tokens=prompt_tokens, max_tokens=cap,
                reserve_usd=solver.worst_case_usd(prompt_tokens, cap), model=solver.model,
                price_known=solver.prices_known, kind=CallKind.solve.value)
        except BaseException:
            solver.cancel(admission)
            raise
        if isinstance(booked, NoRoom):
            solver.cancel(admission)
            raise BudgetExceeded(
                f"${booked.spent_usd:.4f} spent and ${booked.reserved_usd:.4f} reserved of "
                f"${booked.budget_usd:.4f}; the blind solve needs up to "
                f"${booked.needed_usd:.4f}", others_in_flight=booked.in_flight > 0)
        call_id = booked
        test_hook("solve_recorded")
        if rt.stopping.is_set():
            solver.cancel(admission)
            store.finish_call(call_id, CallOutcome.failed, CallReason.unexpected,
                              "not sent: stopping (Ctrl-C or a shutdown)")
            raise HandBack()
        sendable = store.may_send(claim, call_id)
        if sendable is not SendCheck.send:
            solver.cancel(admission)
            if sendable is SendCheck.cancelled:
                return None
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost before a solve")
        completion = call(solver, call_id, messages, cap, admission)
        usage = Usage(completion.prompt_tokens, completion.completion_tokens,
                      completion.cost_usd, completion.endpoint, completion.usage_estimated,
                      completion.cached_tokens, completion.service_tier)
        try:
            picked = verify.parse_answers(completion.content, items)
        except OutputInvalid as exc:
            store.finish_call(call_id, CallOutcome.wasted, CallReason.invalid_output, str(exc),
                              usage=usage)
            unreadable += 1
            if unreadable > settings.max_reasks:
                raise
            continue
        if lost.is_set():
            store.finish_call(call_id, CallOutcome.wasted, CallReason.lease_lost,
                              "the lease expired while the solve ran", usage=usage)
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost during a solve")
        test_hook("solve_answered")
        judged = store.commit_verdicts(claim, settings.lease_s, call_id,
                                       [(p.id, pick) for p, pick in zip(chunk, picked)],
                                       usage=usage, withdraw_disputed=replace)
        test_hook("verdicts_committed")
        if judged.disputed:
            log.info("blind solve disputed keys", extra={
                "exam": claim.exam, "chapter": claim.chapter_id, "slice": claim.slice_no,
                "disputed": judged.disputed, "agreed": judged.agreed,
                "withdrawn": judged.withdrawn})
            if replace:
                check_disputes(settings, claim, judged)
        if judged.done or judged.cancelled:
            return judged
    if judged is not None:
        return judged
    if stored < target:  # nothing was pending and the slice lacks questions: go on
        return Judged(stored, target)
    # Nothing was pending and the range is full (as the caller last read it): done.
    return store.commit_verdicts(claim, settings.lease_s, None, [])
