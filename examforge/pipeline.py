"""The plain function behind every chapter task: claim, call, validate, commit.

Celery tasks and the embedded `producer run` both call `process_chapter`; it never raises for
the outcomes of the work itself, it returns a `ChapterResult` saying what happened and when
(if ever) to come back. What to do after an error is `examforge.retry.decide`.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Callable

from examforge.errors import (
    BudgetExceeded,
    DeadlineExceeded,
    LeaseLost,
    OutputInvalid,
    ProviderError,
    ReplyTooLarge,
)
from examforge.heartbeat import LeaseKeeper
from examforge.llm import Admission, Completion, LLMClient
from examforge.output import normalise, parse_questions
from examforge.prompt import build_messages
from examforge.retry import Action, Decision, HandBack, decide
from examforge.settings import Settings
from examforge.syllabus import Chapter as ChapterSpec
from storage.models import CallOutcome
from storage.store import Claimed, NoRoom, NotClaimed, Store, Usage

log = logging.getLogger("examforge.pipeline")

# The longest a chapter waits in its thread for the shared rate limiter; past that it is handed
# back to the queue for the wait (uncounted), and the thread takes other work.
RATE_WAIT_MAX_S = 60.0

__all__ = ["ChapterResult", "HandBack", "Runtime", "new_owner", "process_chapter"]


@dataclass(frozen=True)
class ChapterResult:
    """outcome: done | failed | skipped | lost | retry. `retry_in_s` is set for retry."""

    outcome: str
    detail: str = ""
    retry_in_s: float | None = None
    calls: int = 0


@dataclass
class Runtime:
    """What a worker process needs, built once at its edge."""

    settings: Settings
    store: Store
    client: LLMClient
    keeper: LeaseKeeper
    # Set on SIGTERM: running chapters finish the call they are in, commit it, and hand the
    # chapter back instead of starting another call.
    stopping: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def build(cls, settings: Settings, store: Store, client: LLMClient | None = None) -> "Runtime":
        return cls(settings, store, client or LLMClient(settings),
                   LeaseKeeper(store, settings.lease_s, settings.heartbeat_interval_s))


def new_owner() -> str:
    """A fencing token unique to one claim: who holds the lease, and which claim it was."""
    return f"{socket.gethostname()[:60]}/{os.getpid()}/{uuid.uuid4().hex[:16]}"


def process_chapter(rt: Runtime, exam: str, chapter_id: str) -> ChapterResult:
    """Generate whatever the chapter is missing, committing each call's questions as they come."""
    store, settings = rt.store, rt.settings
    store.mark_picked(exam, chapter_id)
    claim = store.claim(exam, chapter_id, new_owner(), settings.lease_s, settings.max_attempts)
    if isinstance(claim, NotClaimed):
        return _not_claimed(claim, exam, chapter_id)
    fields = {"exam": exam, "chapter": chapter_id, "attempt": claim.attempt}
    if claim.took_over_calls:
        log.warning("took over chapter; previous holder's calls marked wasted",
                    extra={**fields, "wasted": claim.took_over_calls})
    lost = rt.keeper.hold(claim.owner)
    run = _Run()
    try:
        _generate(rt, claim, lost, run)
        return ChapterResult("done", calls=run.calls)
    except BaseException as exc:
        # Back off by attempts since the last progress: a chapter that just committed a batch
        # starts again from a short delay.
        streak = 1 if run.committed else claim.attempts_since_progress
        decision = decide(exc, streak=streak, settings=settings, rand=random.random())
        return _carry_out(rt, claim, decision, exc, run, fields)
    finally:
        rt.keeper.drop(claim.owner)


def _carry_out(rt: Runtime, claim: Claimed, decision: Decision, exc: BaseException,
               run: "_Run", fields: dict[str, object]) -> ChapterResult:
    store = rt.store
    extra = {**fields, "reason": decision.reason[:300]}
    if decision.action is Action.lost:
        log.warning("lease lost; result discarded", extra=extra)
        return ChapterResult("lost", decision.reason)
    if decision.action is Action.fail:
        store.fail(claim, decision.reason, pause_exam_after=decision.pause_exam_after)
        log.error("chapter failed", extra=extra)
        return ChapterResult("failed", decision.reason)
    if decision.action is Action.pause:
        if store.pause_exam(claim.exam, decision.reason):
            log.error("exam paused", extra=extra)
        store.release(claim, retry_in_s=0, error=decision.reason, count_attempt=False)
        return ChapterResult("skipped", f"paused: {decision.reason}", calls=run.calls)
    if decision.action is Action.reraise:
        try:
            store.release(claim, retry_in_s=decision.delay_s, error=decision.reason)
        except Exception:  # the database itself may be what failed; the lease will expire
            pass
        raise exc
    store.release(claim, retry_in_s=decision.delay_s, error=decision.reason,
                  count_attempt=decision.count_attempt)
    log.info("chapter handed back; retry scheduled",
             extra={**extra, "retry_in_s": round(decision.delay_s, 2)})
    return ChapterResult("retry", decision.reason, retry_in_s=decision.delay_s, calls=run.calls)


def _not_claimed(claim: NotClaimed, exam: str, chapter_id: str) -> ChapterResult:
    if claim.retry_in_s is not None:
        # Busy (a live lease elsewhere) or in backoff: make no call, check back when it ends.
        log.info("chapter not claimable now; checking back",
                 extra={"exam": exam, "chapter": chapter_id, "reason": claim.reason,
                        "retry_in_s": round(claim.retry_in_s, 2)})
        return ChapterResult("retry", f"{claim.reason}: {claim.detail}",
                             retry_in_s=claim.retry_in_s + 0.5)
    outcome = "failed" if claim.reason == "cap" else "skipped"
    log.info("chapter needs no work here",
             extra={"exam": exam, "chapter": chapter_id, "reason": claim.reason})
    return ChapterResult(outcome, f"{claim.reason} {claim.detail}".strip())


@dataclass
class _Run:
    """What one attempt did so far (read after an exception, too)."""

    calls: int = 0
    committed: int = 0


def _generate(rt: Runtime, claim: Claimed, lost: threading.Event, run: _Run) -> None:
    """Call the model batch by batch until the chapter has its questions."""
    settings, store = rt.settings, rt.store
    spec = ChapterSpec.model_construct(id=claim.chapter_id, title=claim.title,
                                       questions=claim.target, prompt=claim.prompt)
    stored, known = claim.stored, set(claim.known)
    avoid: list[str] = []
    invalid_in_row = 0
    target = claim.target

    def check() -> None:
        if rt.stopping.is_set():
            raise HandBack()
        if lost.is_set():
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost during the run")

    while stored < target:
        check()
        want = min(settings.questions_per_call, target - stored)
        call_id, messages, max_tokens, admission = _start(rt, claim, spec, stored, want, avoid,
                                                          check)
        run.calls += 1
        try:
            completion = _call(rt, call_id, messages, max_tokens, admission)
        except ReplyTooLarge as exc:
            # A broken endpoint's reply, not a transient fault: re-asked like invalid output.
            invalid_in_row += 1
            log.warning("reply too large; refused", extra={"exam": claim.exam,
                        "chapter": claim.chapter_id, "error": str(exc)})
            if invalid_in_row > settings.max_reasks:
                raise OutputInvalid("reply_too_large", str(exc)) from None
            continue
        usage = Usage(completion.prompt_tokens, completion.completion_tokens,
                      completion.cost_usd, completion.endpoint, completion.usage_estimated)
        try:
            parsed = parse_questions(completion.content, completion.finish_reason, want, known)
        except OutputInvalid as exc:
            store.finish_call(call_id, CallOutcome.wasted, f"invalid_output: {exc}"[:500],
                              usage=usage)
            invalid_in_row += 1
            log.warning("invalid model output", extra={"exam": claim.exam,
                        "chapter": claim.chapter_id, "kind": exc.kind,
                        "cost_usd": usage.cost_usd})
            if invalid_in_row > settings.max_reasks:
                raise
            continue
        if lost.is_set():
            store.finish_call(call_id, CallOutcome.wasted,
                              "lease_lost: lease expired while the call ran", usage=usage)
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost during the call")
        note = ", ".join(f"{n} {k} rejected" for k, n in parsed.rejected.items())
        committed = store.commit_batch(claim, settings.lease_s, call_id, stored + 1,
                                       parsed.questions, model=completion.model, note=note,
                                       usage=usage)
        invalid_in_row = 0
        run.committed += len(parsed.questions)
        # The target may have been raised by an enqueue while this chapter ran.
        stored, target = committed.stored, committed.target
        for q in parsed.questions:
            known.add(normalise(q.question))
            avoid.append(q.question)
        log.info("batch committed", extra={"exam": claim.exam, "chapter": claim.chapter_id,
                 "attempt": claim.attempt, "stored": stored, "target": target,
                 "prompt_tokens": usage.prompt_tokens,
                 "completion_tokens": usage.completion_tokens, "cost_usd": usage.cost_usd})


def _start(rt: Runtime, claim: Claimed, spec: ChapterSpec, stored: int, want: int,
           avoid: list[str], check: Callable[[], None],
           ) -> tuple[int, list[dict[str, str]], int, Admission]:
    """Admit the next call under the rate limit, then book it and reserve its worst case
    against the budget. When the budget has room for fewer questions, ask for fewer."""
    settings, client = rt.settings, rt.client
    while True:
        messages = build_messages(claim.exam, claim.exam_title, spec, want, avoid)
        prompt_tokens = client.count_prompt(messages)
        max_tokens = settings.max_tokens(want)
        admission = client.admit(messages, max_tokens, max_wait_s=RATE_WAIT_MAX_S,
                                 check=check, prompt_tokens=prompt_tokens)
        reserve = client.worst_case_usd(prompt_tokens, max_tokens)
        try:
            booked = rt.store.start_call(claim, stored + 1, want, lease_s=settings.lease_s,
                                         prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                         reserve_usd=reserve, model=client.model,
                                         price_known=client.prices_known)
        except BaseException:
            client.cancel(admission)
            raise
        if not isinstance(booked, NoRoom):
            return booked, messages, max_tokens, admission
        client.cancel(admission)
        fits = max((n for n in range(want - 1, 0, -1)
                    if client.worst_case_usd(prompt_tokens, settings.max_tokens(n))
                    <= booked.headroom_usd), default=0)
        if fits:
            want = fits
            continue
        raise BudgetExceeded(
            f"${booked.spent_usd:.4f} spent and ${booked.reserved_usd:.4f} reserved of "
            f"${booked.budget_usd:.4f}; the next call needs up to ${booked.needed_usd:.4f}",
            others_in_flight=booked.reserved_usd > 1e-12)


def _call(rt: Runtime, call_id: int, messages: list[dict[str, str]], max_tokens: int,
          admission: Admission) -> Completion:
    try:
        return rt.client.complete(messages, max_tokens=max_tokens, admission=admission)
    except (DeadlineExceeded, ReplyTooLarge) as exc:
        # Sent, and the reply abandoned: the provider may bill all of it, so it is booked as
        # wasted at its worst case (our count of its prompt, and all of max_tokens).
        prompt = exc.prompt_tokens_estimate or 0
        price = rt.settings.price(fallback=exc.endpoint == "fallback")
        rt.store.finish_call(call_id, CallOutcome.wasted, str(exc), status_code=exc.status_code,
                             usage=Usage(prompt, max_tokens, price.cost_usd(prompt, max_tokens),
                                         exc.endpoint, estimated=True))
        raise
    except ProviderError as exc:
        rt.store.finish_call(call_id, CallOutcome.failed, str(exc), status_code=exc.status_code,
                             usage=Usage(endpoint=exc.endpoint))
        raise
    except BaseException as exc:
        rt.store.finish_call(call_id, CallOutcome.failed, f"{type(exc).__name__}: {exc}")
        raise
