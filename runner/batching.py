"""Batch mode (issue 18): an exam's calls go through the provider's Batch API, at its discount.

One pass (`run_pass`, the Celery task `examforge.batches` every BATCH_POLL_S, and the loop of
`producer run --batch`) does four things, each safe to run in several processes at once:

1. recover submissions whose submitter died in the middle of the protocol (below);
2. poll submitted batches, renewing their slices' leases;
3. process the ones that ended: every line booked and committed like a synchronous reply;
4. submit a round for each batch-mode exam with slices to do.

A submission holds the slices it submits with the ordinary leases (owner `batch/<id>`) and
records every request line as an ordinary call row, reserved against the budget at the
discounted worst case, before anything is uploaded. So the sync path's rules hold unchanged:
no other holder can claim those slices while the batch may still answer, the dead-call sweep
leaves its calls alone (their holder's lease is live), and a result is committed through the
same fence, parser, numbering, near-duplicate check and ledger.

The submission protocol, exactly once across any crash:

1. the `batch` row is written (state `preparing`) with the submitter's short lease;
2. slices are claimed and their calls recorded; the lines are built (custom_id `call-<id>`);
3. the file is uploaded and its id recorded (`uploaded`);
4. `creating` and `create_attempts + 1` are recorded, THEN the batch is created with the
   submission's id in its metadata; its id is recorded (`submitted`).

A submission whose submitter lease lapsed is recovered by another pass: in `creating` it lists
the provider's batches newest first back to the submission's time and adopts the one whose
metadata names it; when there is none, it reads the input file back, deletes it at the
provider (a create still on its way from a frozen submitter is refused from then on), lists
again (adopting a create that landed before the delete), and only then uploads the lines
under a new file id, records it (`uploaded`) and creates with it. In `uploaded` no create was
ever sent naming the recorded file (`creating` is written first): it creates. In `preparing`
nothing was uploaded: it is abandoned (calls booked not sent, $0; slices back to the next
round). A create naming a file is therefore sent once at most unless a listing in between
found nothing, and no create naming an older file of the submission can be accepted after
the delete that precedes a new file.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from examforge.batch_api import TERMINAL, BatchAPI, jsonl, parse_jsonl, sent_maybe
from examforge.errors import (
    ErrorKind,
    LeaseLost,
    OutputInvalid,
    PauseCode,
    ProviderError,
    Rejection,
    RetryableProviderError,
    SliceReason,
)
from examforge.levels import (Levels, apportion, ask, ask_types, keep_types, lacking_types,
                              type_counts)
from examforge.llm import LLMClient
from examforge.output import normalise, parse_questions
from runner.pipeline import drop_restated, keyed_signatures, near_dup_checker, steer_of
from examforge.prompt import build_messages
from examforge.sources import Passage, ground, slice_material
from examforge.tokens import count_text
from examforge.retry import Action, decide
from examforge.settings import Settings
from examforge.sizing import Sizer
from examforge.syllabus import Chapter as ChapterSpec
from storage.models import BatchState, CallOutcome, CallReason, ExamMode
from storage.neardup import Steering
from storage.store import (BatchRow, CallPlan, ChapterView, Claimed, NoRoom, NotClaimed, Store,
                           Usage, owner_of)

log = logging.getLogger("examforge.batching")

# How many creates one submission may send, each after a listing that found nothing, before
# it is abandoned (its file is refused again and again, or the provider never lists it).
MAX_CREATE_ATTEMPTS = 5
# Rounds one pass submits for one exam at most (each up to BATCH_MAX_REQUESTS lines).
MAX_ROUNDS_PER_PASS = 20
# The most a top-up round over-asks: for a slice whose calls brought back this share of
# repeats or more, it asks lacking / (1 - OVER_ASK_MAX).
OVER_ASK_MAX = 0.6
# The submitter renews its lease on a submission every this many slices it claims.
RENEW_EVERY = 50
# The line's URL (OpenAI's batch endpoint for chat completions).
LINE_URL = "/v1/chat/completions"


# A finished batch's output or error file that the provider answers 404 (or 410) for is
# asked again at this many passes of one process (BATCH_POLL_S apart) before its lines are
# booked at their worst case: a file listed by a batch but not yet readable is given time.
BATCH_FILE_TRIES = 3


@dataclass
class BatchRuntime:
    """What a batch pass needs, built once per process."""

    settings: Settings
    store: Store
    client: LLMClient
    api: BatchAPI
    sizer: Sizer = field(default_factory=Sizer)
    # This process's token as a submitter (the `batch` row's lease_owner).
    ident: str = field(default_factory=lambda: (
        f"{socket.gethostname()[:40]}/{os.getpid()}/{uuid.uuid4().hex[:12]}"))
    stopping: threading.Event = field(default_factory=threading.Event)
    # Submissions whose create went unanswered in this process: their submitter lease is
    # left to lapse (not released), so no listing decides before that create has ended.
    unanswered: set[str] = field(default_factory=set)
    # Submissions whose output or error file the provider answered 404 for, and how many
    # passes of this process have asked (BATCH_FILE_TRIES).
    missing_files: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, settings: Settings, store: Store, client: LLMClient | None = None,
              api: BatchAPI | None = None) -> "BatchRuntime":
        return cls(settings, store, client or LLMClient(settings), api or BatchAPI(settings))

    def close(self) -> None:
        self.client.close()
        self.api.close()


@dataclass
class PassResult:
    """What one pass did (logged, returned by the Celery task)."""

    submitted: int = 0  # provider batches created (or adopted)
    lines: int = 0  # request lines in them
    polled: int = 0
    processed: int = 0  # batches whose results were booked
    committed: int = 0  # questions stored
    recovered: int = 0
    abandoned: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def run_pass(rt: BatchRuntime, exams: Sequence[str] | None = None) -> PassResult:
    """One pass over the batch-mode exams (or `exams` only)."""
    result = PassResult()
    wanted = set(exams) if exams is not None else None
    for row in rt.store.live_batches():
        if wanted is not None and row.exam not in wanted:
            continue
        if rt.stopping.is_set():
            return result
        try:
            _advance(rt, row, result)
        except ProviderError as exc:
            log.warning("batch step failed; next pass tries again",
                        extra={"exam": row.exam, "submission": row.id, "error": str(exc)[:300]})
    for exam in rt.store.batch_exams():
        if wanted is not None and exam not in wanted:
            continue
        if rt.store.exam_mode(exam) is not ExamMode.batch:
            continue
        for _ in range(MAX_ROUNDS_PER_PASS):
            if rt.stopping.is_set() or not submit_round(rt, exam, result):
                break
    return result


# ---------------------------------------------------------------------- submitting a round
@dataclass
class _Line:
    call_id: int
    body: dict[str, Any]
    size: int


@dataclass
class _SliceCalls:
    """The calls a round asks of one slice: what it lacks, QUESTIONS_PER_CALL a call, each
    steered to its own question numbers and listing what the chapter stored before the
    round (a batch cannot list what its own other lines will write)."""

    rt: BatchRuntime
    view: ChapterView | None = None
    planned: list[tuple[CallPlan, dict[str, Any], int]] = field(default_factory=list)
    # The share of what the slice's earlier batch calls asked that did not come back as new
    # questions (repeats of the chapter, invalid ones): a top-up asks that much more, as the
    # sync path's over-ask does, so that one top-up round usually finishes the slice.
    shortfall: float = 0.0
    # The chapter's course material (examforge.sources), read before the claim.
    passages: list[Passage] = field(default_factory=list)

    def build(self, view: ChapterView) -> None:
        rt, settings = self.rt, self.rt.settings
        self.view = view
        lacking = view.target - view.stored
        if lacking <= 0:
            self.planned = []
            return
        per_call = settings.questions_per_call
        asked = lacking
        if self.shortfall > 0:
            asked = max(lacking + 1, math.ceil(lacking / (1 - min(OVER_ASK_MAX,
                                                                    self.shortfall))))
        calls = math.ceil(asked / per_call)
        # The calls share the lacking numbers in order; each asks for its share of `asked`.
        wants = [asked // calls + (1 if k < asked % calls else 0) for k in range(calls)]
        ranges = [lacking // calls + (1 if k < lacking % calls else 0) for k in range(calls)]
        spec = ChapterSpec.model_construct(id=view.chapter_id, title=view.title,
                                           questions=view.chapter_target or view.target,
                                           prompt=view.prompt, language=view.language,
                                           types=view.levels.types)
        stored_types = Counter(view.levels.stored_types)
        base = view.recent if isinstance(view.recent, Steering) else Steering(
            newest=view.recent)
        avoid = base.with_fresh([], settings.avoid_questions)
        per_question = rt.sizer.cached(settings, view.exam, rt.client.model
                                       ).in_language(settings, view.language)
        stored_levels = dict(view.levels.stored)
        planned = []
        first = view.first_number + view.stored
        for k in range(calls):
            want, span = wants[k], max(1, ranges[k])
            numbers = None
            if calls > 1 or view.chapter_target > view.target:
                numbers = (first, first + span - 1, view.chapter_target or view.target)
            levels = Levels(None, view.levels.bloom)
            if view.levels.difficulty is not None:
                mix = ask(view.levels.difficulty, view.first_number, view.target,
                          stored_levels, want)
                levels = Levels(mix, view.levels.bloom)
                for level, n in mix.items():  # the next call asks for what this one does not
                    stored_levels[level] = stored_levels.get(level, 0) + n
            if view.levels.types is not None:  # each call its share of the types, likewise
                type_mix, trues = ask_types(view.levels.types, view.first_number, view.target,
                                            stored_types, want)
                levels = dataclasses.replace(levels, types=type_mix, true_count=trues)
                stored_types.update(type_mix)
                stored_types.update({"truefalse:true": trues,
                                     "truefalse:false": type_mix.get("truefalse", 0) - trues})
            material = slice_material(
                self.passages, view.first_number, view.target,
                view.chapter_target or view.target, settings.source_prompt_tokens,
                lambda text: count_text(text, rt.client.model)) if self.passages else None
            messages = build_messages(view.exam, view.exam_title, spec, want, avoid,
                                      numbers=numbers, levels=levels,
                                      material=material.block if material else None)
            prompt_tokens = rt.client.count_prompt(messages)
            max_tokens = settings.max_tokens(want, per_question)
            body = rt.client.batch_body(messages, max_tokens)
            plan = CallPlan(first, want, prompt_tokens, max_tokens,
                            rt.client.batch_worst_case_usd(prompt_tokens, max_tokens),
                            rt.client.model, rt.client.prices_known)
            size = len(jsonl([{"custom_id": "call-000000000000", "method": "POST",
                               "url": LINE_URL, "body": body}]))
            planned.append((plan, body, size))
            first += span
        self.planned = planned


class _Round:
    """The lines of one submission as they are recorded, within the size limits."""

    def __init__(self, settings: Settings) -> None:
        self.max_requests = settings.batch_max_requests
        self.max_bytes = settings.batch_max_bytes
        self.max_tokens = settings.batch_max_tokens  # None: no cap
        self.lines: list[_Line] = []
        self.size = 0
        self.tokens = 0
        self.full = False
        self.no_room: NoRoom | None = None

    def fits(self, size: int, tokens: int = 0) -> bool:
        if len(self.lines) + 1 > self.max_requests or self.size + size > self.max_bytes or (
                self.max_tokens is not None and self.tokens + tokens > self.max_tokens):
            self.full = True
            return False
        return True

    def add(self, call_id: int, body: dict[str, Any], size: int, tokens: int = 0) -> None:
        self.lines.append(_Line(call_id, body, size))
        self.size += size
        self.tokens += tokens


def submit_round(rt: BatchRuntime, exam: str, result: PassResult) -> bool:
    """Build and submit one batch of the exam's claimable slices. True when a batch was
    submitted and more slices may be left for another."""
    store, settings = rt.store, rt.settings
    candidates = store.batch_candidates(exam, settings.max_attempts,
                                        limit=settings.batch_max_requests)
    if not candidates:
        return False
    rt.sizer.refresh(store, settings, exam, rt.client.model)
    sub = uuid.uuid4().hex
    owner = owner_of(sub)
    store.new_submission(sub, exam, rt.ident, settings.batch_submit_lease_s, rt.client.model)
    round_ = _Round(settings)
    if round_.max_tokens is not None:
        # The cap holds the exam's live batches together, as the provider's enqueued-token
        # limit counts every batch in progress: a round gets what they leave.
        round_.tokens = store.batch_enqueued_tokens(exam)
    for n, (chapter_id, slice_no) in enumerate(candidates):
        if round_.full or round_.no_room is not None or rt.stopping.is_set():
            break
        if n and n % RENEW_EVERY == 0 and not store.submission_step(
                sub, rt.ident, settings.batch_submit_lease_s):
            # Too slow to keep its lease: a recovery may be abandoning it already.
            log.warning("submitter lease lapsed while claiming; the submission is left to "
                        "recovery", extra={"exam": exam, "submission": sub})
            _left_behind(rt, sub)
            return False
        _add_slice(rt, exam, chapter_id, slice_no, owner, round_)
    if not round_.lines:
        store.drop_submission(sub)
        room = round_.no_room
        if room is not None and room.in_flight == 0:
            reason = (f"budget: ${room.spent_usd:.4f} spent and ${room.reserved_usd:.4f} "
                      f"reserved of ${room.budget_usd:.4f}; the next batch call needs up to "
                      f"${room.needed_usd:.4f}")
            if store.pause_exam(exam, reason, PauseCode.budget):
                log.error("exam paused: no batch call fits its budget", extra={"exam": exam})
        return False
    return _upload_and_create(rt, sub, exam, round_, result) and round_.full


def _add_slice(rt: BatchRuntime, exam: str, chapter_id: str, slice_no: int, owner: str,
               round_: _Round) -> None:
    store, settings = rt.store, rt.settings
    asked, stored = store.batch_yield(exam, chapter_id, slice_no)
    calls = _SliceCalls(rt, shortfall=1 - stored / asked if asked else 0.0,
                        passages=store.chapter_passages(exam, chapter_id))
    first_line: list[tuple[dict[str, Any], int, int]] = []
    oversized: list[str] = []

    def plan_first(view: ChapterView) -> CallPlan | None:
        calls.build(view)
        if not calls.planned:
            return None
        plan, body, size = calls.planned[0]
        tokens = _tokens(plan)
        if size > round_.max_bytes:
            # No batch file can ever hold this request: waiting does not fix it.
            oversized.append(f"a batch request of {size:,} bytes is over BATCH_MAX_BYTES "
                             f"({round_.max_bytes:,})")
            return None
        if round_.max_tokens is not None and tokens > round_.max_tokens:
            oversized.append(f"a batch request of {tokens:,} tokens is over BATCH_MAX_TOKENS "
                             f"({round_.max_tokens:,})")
            return None
        if not round_.fits(size, tokens):
            return None
        first_line[:] = [(body, size, tokens)]
        return plan

    claim = store.claim(exam, chapter_id, owner, settings.batch_lease_s, settings.max_attempts,
                        slice_no=slice_no, plan_first=plan_first, steer=steer_of(settings))
    if isinstance(claim, NotClaimed):
        return
    if isinstance(claim.first_call, NoRoom):
        round_.no_room = claim.first_call
    if oversized:
        store.fail(claim, SliceReason.too_large,
                   f"{oversized[0]}: raise it, or lower QUESTIONS_PER_CALL")
        return
    if not isinstance(claim.first_call, int):
        store.release_held(owner, [(exam, chapter_id, slice_no)], count_attempt=False)
        return
    round_.add(claim.first_call, *first_line[0])
    for plan, body, size in calls.planned[1:]:
        if not round_.fits(size, _tokens(plan)):
            return
        try:
            booked = store.start_call(
                claim, plan.first_number, plan.requested, lease_s=settings.batch_lease_s,
                prompt_tokens=plan.prompt_tokens, max_tokens=plan.max_tokens,
                reserve_usd=plan.reserve_usd, model=plan.model, price_known=plan.price_known)
        except LeaseLost:
            return
        if isinstance(booked, NoRoom):
            round_.no_room = booked
            return
        round_.add(booked, body, size, _tokens(plan))


def _tokens(plan: CallPlan) -> int:
    """A line's enqueued tokens, as providers count them against the model's limit: its
    prompt and its max_tokens."""
    return plan.prompt_tokens + (plan.max_tokens or 0)


def _upload_and_create(rt: BatchRuntime, sub: str, exam: str, round_: _Round,
                       result: PassResult) -> bool:
    store, settings, api = rt.store, rt.settings, rt.api
    content = jsonl([{"custom_id": f"call-{line.call_id}", "method": "POST", "url": LINE_URL,
                      "body": line.body} for line in round_.lines])
    fields = {"exam": exam, "submission": sub, "lines": len(round_.lines),
              "bytes": len(content)}
    try:
        file_id = api.upload(f"examforge-{sub}.jsonl", content)
    except ProviderError as exc:
        # Nothing refers to a file that failed to upload (at worst a stray file): the
        # calls were never sent. The slices go to a later round.
        why = f"not sent: the batch file's upload failed ({exc})"
        store.abandon_submission(sub, why, retry_in_s=settings.retry_base_s)
        result.abandoned += 1
        log.warning("batch upload failed; its slices go to a later round",
                    extra={**fields, "error": str(exc)[:300]})
        decision = decide(exc, streak=1, settings=settings, rand=random.random())
        if decision.action in (Action.pause, Action.fail):
            # Refused for good (a key, a purpose the provider does not take): every round
            # would be, so the exam waits for a person (as for a refused create).
            store.pause_exam(exam, f"batch upload refused: {decision.reason}",
                             decision.pause_code or PauseCode.provider)
        return False
    if not store.submission_step(sub, rt.ident, settings.batch_submit_lease_s,
                                 state=BatchState.uploaded.value, input_file_id=file_id,
                                 requests=len(round_.lines), bytes=len(content)):
        log.warning("submitter lease lapsed after the upload; recovery takes it", extra=fields)
        _left_behind(rt, sub)
        return False
    log.info("batch file uploaded", extra={**fields, "file": file_id})
    _test_hook("after_upload", sub)
    return _create(rt, sub, exam, file_id, result)


def _left_behind(rt: BatchRuntime, sub: str) -> None:
    """The submitter lost its lease while preparing (a freeze): if a recovery has abandoned
    the submission already, what this submitter claimed after that (it claimed on until it
    noticed) is abandoned too, or those slices would stay held by a submission nobody
    advances for BATCH_LEASE_S, their never-sent calls then booked at their worst case. If
    the recovery has not run yet, it abandons everything, this submitter having stopped."""
    row = rt.store.batch(sub)
    if row is not None and row.state == BatchState.abandoned.value:
        rt.store.abandon_submission(sub, "its submitter lost the lease (a freeze) while "
                                         "preparing, and a recovery abandoned it")


def _create(rt: BatchRuntime, sub: str, exam: str, file_id: str, result: PassResult) -> bool:
    """Step 4: record the attempt, then create. True when the batch's id is recorded."""
    store, settings, api = rt.store, rt.settings, rt.api
    fields = {"exam": exam, "submission": sub, "file": file_id}
    row = store.batch(sub)
    if row is not None and row.cancel_requested:
        # Cancelled (producer cancel, the API) before its batch existed: never created. No
        # create is in flight here (a recovery creates only after a listing found nothing).
        store.abandon_submission(sub, "not sent: cancelled before its batch was created")
        result.abandoned += 1
        log.warning("submission cancelled before its create; not sent", extra=fields)
        return False
    if not store.submission_step(sub, rt.ident, settings.batch_submit_lease_s,
                                 state=BatchState.creating.value, create_attempts="+1"):
        return False
    _test_hook("before_create", sub)
    try:
        batch = api.create(file_id, {"examforge_submission": sub,
                                     "examforge_database": store.database_id(),
                                     "examforge_exam": exam[:512]})
    except ProviderError as exc:
        if sent_maybe(exc):
            # It may exist at the provider: keep the submitter's lease until it lapses, so
            # that only a listing (after any create in flight has ended) decides.
            rt.unanswered.add(sub)
            log.warning("batch create unanswered; recovery lists the provider's batches "
                        "once the submitter lease lapses",
                        extra={**fields, "error": str(exc)[:300]})
            return False
        now = store.batch(sub)
        if now is None or (now.lease_owner, now.input_file_id) != (rt.ident, file_id):
            # Refused after a recovery took the submission over (this process was frozen
            # past its lease): the recovery deleted the file this create named, and adopted,
            # created again or abandoned on its own. Nothing was created; nothing to do.
            log.warning("a late batch create was refused: its submission was taken over",
                        extra={**fields, "state": now and now.state,
                               "error": str(exc)[:300]})
            return False
        why = f"not sent: the batch create was refused ({exc})"
        decision = decide(exc, streak=1, settings=settings, rand=random.random())
        store.abandon_submission(sub, why, retry_in_s=decision.delay_s or settings.retry_base_s)
        result.abandoned += 1
        if decision.action in (Action.pause, Action.fail):
            # A create refused for good (a model or key without the Batch API, a file the
            # provider will never take) says nothing about any one chapter, and every round
            # would be refused the same: the exam waits for a person, with the reason.
            store.pause_exam(exam, f"batch create refused: {decision.reason}",
                             decision.pause_code or PauseCode.provider)
        log.error("batch create refused", extra={**fields, "error": str(exc)[:300]})
        return False
    _test_hook("after_create", sub)
    return _submitted(rt, sub, exam, batch, result)


def _submitted(rt: BatchRuntime, sub: str, exam: str, batch: dict[str, Any],
               result: PassResult) -> bool:
    store, settings = rt.store, rt.settings
    counts = batch.get("request_counts") or {}
    recorded = store.submission_step(
        sub, rt.ident, settings.batch_submit_lease_s, state=BatchState.submitted.value,
        provider_batch_id=str(batch["id"]), provider_status=str(batch.get("status") or ""),
        expires_at=_float(batch.get("expires_at")), submitted_at=_float(batch.get("created_at")),
        request_total=int(counts.get("total") or 0),
        request_completed=int(counts.get("completed") or 0),
        request_failed=int(counts.get("failed") or 0))
    if not recorded:
        # Our lease lapsed during the create (a frozen process): someone may be recovering
        # this submission. Unless it recorded this very batch, ours is cancelled: if it
        # adopted or created another, ours would pay each line twice; if it abandoned the
        # submission (its calls booked not sent, its slices given back), ours would be paid
        # and never booked; and if it is still deciding, a cancelled batch only sends its
        # lines to a later round (what finished before the cancel is still committed).
        row = store.batch(sub)
        if row is None or row.provider_batch_id != batch["id"]:
            log.error("a batch was created after its submitter lost the submission; "
                      "cancelling it", extra={"exam": exam, "submission": sub,
                                              "batch": batch["id"],
                                              "state": row and row.state})
            try:
                rt.api.cancel(str(batch["id"]))
            except ProviderError as exc:
                log.error("cancelling the late batch failed", extra={
                    "exam": exam, "submission": sub, "batch": batch["id"],
                    "error": str(exc)[:300]})
        return False
    store.release_submission(sub, rt.ident)
    result.submitted += 1
    result.lines += int(counts.get("total") or 0)
    log.info("batch submitted", extra={"exam": exam, "submission": sub, "batch": batch["id"]})
    return True


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _test_hook(step: str, sub: str) -> None:
    """EXAMFORGE_TEST_BATCH_CRASH=<step>: a test's SIGKILL at that step of the protocol,
    once per process (tests/e2e/test_batch_crash.py). Unset in production: a no-op."""
    if os.environ.get("EXAMFORGE_TEST_BATCH_CRASH") == step:
        os.kill(os.getpid(), 9)


# ---------------------------------------------------------------------- advancing a submission
def _advance(rt: BatchRuntime, row: BatchRow, result: PassResult) -> None:
    """Recover, poll or process one live submission, if nobody else holds it now."""
    store, settings = rt.store, rt.settings
    taken = store.take_submission(row.id, rt.ident, settings.batch_submit_lease_s)
    if taken is None:
        return
    rt.unanswered.discard(taken.id)  # an older unanswered create of ours has ended by now
    try:
        if taken.state == BatchState.submitted.value:
            _poll(rt, taken, result)
        else:
            _recover(rt, taken, result)
    finally:
        if taken.id in rt.unanswered:
            rt.unanswered.discard(taken.id)  # its lease lapses by itself
        else:
            store.release_submission(taken.id, rt.ident)


def _recover(rt: BatchRuntime, row: BatchRow, result: PassResult) -> None:
    fields = {"exam": row.exam, "submission": row.id, "state": row.state}
    result.recovered += 1
    if row.state == BatchState.preparing.value or not row.input_file_id:
        why = "not sent: its submitter stopped before the batch file was uploaded"
        rt.store.abandon_submission(row.id, why)
        result.abandoned += 1
        log.warning("submission abandoned before upload; its slices go to a later round",
                    extra=fields)
        return
    if row.state == BatchState.creating.value:
        found = _find(rt, row)
        content: bytes | None = None
        if found is None:
            # A create may still be on its way: its submitter frozen (not dead) between
            # recording `creating` and sending it. Its file is deleted at the provider, so
            # that such a create is refused from now on; a create that landed before the
            # delete is in the second listing. The file's lines are read first, to upload
            # them again under a new id (None when the provider does not give them back).
            content = _read_input(rt, row)
            if rt.api.delete_file(row.input_file_id):
                log.warning("submission's batch not at the provider; its input file deleted",
                            extra={**fields, "file": row.input_file_id})
            found = _find(rt, row)
        if found is not None:
            log.warning("submission's batch found at the provider; adopted",
                        extra={**fields, "batch": found["id"]})
            _submitted(rt, row.id, row.exam, found, result)
            return
        given_up: str | None = None
        if row.cancel_requested:
            given_up = "not sent: cancelled before its batch was created"
        elif row.create_attempts >= MAX_CREATE_ATTEMPTS:
            given_up = f"not sent: {row.create_attempts} creates, none listed by the provider"
        elif content is None:
            given_up = "not sent: its input file could not be read back to upload it again"
        if given_up is not None:
            rt.store.abandon_submission(row.id, given_up)
            result.abandoned += 1
            log.warning("submission abandoned; its slices go to a later round",
                        extra={**fields, "why": given_up})
            return
        assert content is not None
        file_id = _upload_again(rt, row, content, result)
        if file_id is None:
            return
        log.warning("submission's batch not at the provider; creating it again with a new "
                    "file", extra={**fields, "file": file_id})
        _create(rt, row.id, row.exam, file_id, result)
        return
    _create(rt, row.id, row.exam, row.input_file_id, result)


def _read_input(rt: BatchRuntime, row: BatchRow) -> bytes | None:
    """The submission's input file as uploaded, or None when the provider refuses it (a 4xx:
    gone, or a provider that does not give input files back). A failure that may pass (a
    timeout, a 5xx) raises: nothing is deleted, the next pass tries again."""
    assert row.input_file_id
    try:
        return rt.api.content(row.input_file_id)
    except ProviderError as exc:
        if sent_maybe(exc):
            raise
        log.warning("the submission's input file could not be read back", extra={
            "exam": row.exam, "submission": row.id, "error": str(exc)[:300]})
        return None


def _upload_again(rt: BatchRuntime, row: BatchRow, content: bytes,
                  result: PassResult) -> str | None:
    """The submission's lines under a new file id, recorded (state `uploaded`: no create was
    ever sent naming it) before any create. None when the upload failed (the submission is
    abandoned, as a failed first upload) or the lease was lost."""
    store, settings = rt.store, rt.settings
    try:
        file_id = rt.api.upload(f"examforge-{row.id}.jsonl", content)
    except ProviderError as exc:
        why = f"not sent: the batch file's upload failed ({exc})"
        store.abandon_submission(row.id, why, retry_in_s=settings.retry_base_s)
        result.abandoned += 1
        log.warning("batch upload failed at recovery; its slices go to a later round",
                    extra={"exam": row.exam, "submission": row.id, "error": str(exc)[:300]})
        return None
    if not store.submission_step(row.id, rt.ident, settings.batch_submit_lease_s,
                                 state=BatchState.uploaded.value, input_file_id=file_id):
        log.warning("lease lost at recovery after the upload; the next recovery takes it",
                    extra={"exam": row.exam, "submission": row.id})
        return None
    return file_id


def _find(rt: BatchRuntime, row: BatchRow) -> dict[str, Any] | None:
    """The provider's batch whose metadata names this submission, or whose input file is
    the submission's own (a provider or gateway that drops metadata still echoes the file, and
    the file was uploaded for this submission alone), paging the list newest first back to
    the submission's own time (less the clock skew margin)."""
    since = row.created_at - rt.settings.batch_clock_skew_s
    found = [batch for batch in rt.api.batches_since(since)
             if (batch.get("metadata") or {}).get("examforge_submission") == row.id or (
                 row.input_file_id and batch.get("input_file_id") == row.input_file_id)]
    if not found:
        return None
    # More than one (a gateway or an SDK that retried the create on its own): one is
    # adopted, preferably one that ran (its lines are paid), else one still running; the
    # others are cancelled, or every line they run would be paid twice and booked once.
    ended = ("cancelling", "cancelled", "failed", "expired")
    rank = {"completed": 0, "finalizing": 0, "in_progress": 1, "validating": 1}
    adopted = min(found, key=lambda b: rank.get(str(b.get("status")), 2))
    for batch in found:
        if batch is not adopted and batch.get("status") not in (*ended, "completed",
                                                                "finalizing"):
            log.error("a second batch of one submission at the provider; cancelling it",
                      extra={"exam": row.exam, "submission": row.id, "batch": batch.get("id"),
                             "adopted": adopted.get("id")})
            try:
                rt.api.cancel(str(batch["id"]))
            except ProviderError as exc:
                log.error("cancelling the second batch failed", extra={
                    "submission": row.id, "batch": batch.get("id"), "error": str(exc)[:300]})
    return adopted


def _poll(rt: BatchRuntime, row: BatchRow, result: PassResult) -> None:
    store, settings, api = rt.store, rt.settings, rt.api
    assert row.provider_batch_id is not None
    batch = api.retrieve(row.provider_batch_id)
    result.polled += 1
    store.renew_batch_slices(row.owner, settings.batch_lease_s)
    status = str(batch.get("status") or "")
    if row.cancel_requested and status not in TERMINAL and status != "cancelling":
        try:
            batch = api.cancel(row.provider_batch_id)
            status = str(batch.get("status") or status)
        except ProviderError as exc:
            log.warning("batch cancel failed", extra={"submission": row.id, "error": str(exc)})
    counts = batch.get("request_counts") or {}
    store.submission_step(row.id, rt.ident, settings.batch_submit_lease_s,
                          provider_status=status, polled_at=store.now(),
                          request_total=int(counts.get("total") or 0),
                          request_completed=int(counts.get("completed") or 0),
                          request_failed=int(counts.get("failed") or 0),
                          output_file_id=batch.get("output_file_id"),
                          error_file_id=batch.get("error_file_id"))
    if status in TERMINAL:
        process_results(rt, row, batch, result)


# ---------------------------------------------------------------------- results
@dataclass
class _SliceOutcome:
    """What a batch's lines did to one slice, decided after all of them are booked."""

    progressed: bool = False
    done: bool = False  # a line completed it: later lines of the slice store nothing
    delay_s: float = 0.0
    count_attempt: bool = False
    # Why, as a code and its detail (slice.last_error_code, last_error): the latest line's
    # error, and the first permanent one, which fails the slice.
    error: tuple[SliceReason, str] | None = None
    fail: tuple[SliceReason, str] | None = None
    pause_after: int | None = None  # with fail: an auth failure, counted against the exam
    pause: str | None = None
    pause_code: PauseCode = PauseCode.manual
    # The questions its lines stored per item type (examforge.item_types), beyond what the
    # claim read: what the next line may still store of each type.
    types_stored: Counter[str] = field(default_factory=Counter)


def process_results(rt: BatchRuntime, row: BatchRow, batch: dict[str, Any],
                    result: PassResult) -> None:
    """Book every call of an ended batch: output lines committed like synchronous replies,
    error lines and missing lines failed ($0) and classified; then give the slices not done
    back for a later round. Calls already settled are skipped, so a second run over the same
    batch (a crash mid-way, two pollers) does nothing twice."""
    store, settings, api, client = rt.store, rt.settings, rt.api, rt.client
    owner = row.owner
    lines: dict[str, dict[str, Any]] = {}
    lost: list[str] = []
    for file_id in (batch.get("error_file_id"), batch.get("output_file_id")):
        if file_id:
            try:
                content = api.content(str(file_id))
            except ProviderError as fetch_error:
                if fetch_error.status_code not in (404, 410):
                    raise
                lost.append(str(file_id))
                continue
            for entry in parse_jsonl(content):
                lines[str(entry.get("custom_id"))] = entry
    if lost:
        tries = rt.missing_files[row.id] = rt.missing_files.get(row.id, 0) + 1
        if tries < BATCH_FILE_TRIES:
            raise RetryableProviderError(
                f"batch {batch.get('id')}: file {', '.join(lost)} not found at the provider "
                f"(try {tries} of {BATCH_FILE_TRIES})", status_code=404)
        log.error("a finished batch's files are gone at the provider; its unread lines are "
                  "booked at their worst case and their slices given back for another round",
                  extra={"exam": row.exam, "submission": row.id, "batch": batch.get("id"),
                         "files": lost})
    status = str(batch.get("status"))
    batch_error = _batch_error(rt, batch) if status == "failed" else None
    claims: dict[tuple[str, str, int], Claimed | None] = {}
    known: dict[tuple[str, str, int], set[str]] = {}
    # Per chapter with item types: its questions' signatures with their keys (drop_restated).
    keyed: dict[tuple[str, str], list[Any]] = {}
    outcomes: dict[tuple[str, str, int], _SliceOutcome] = defaultdict(_SliceOutcome)
    near_dup = near_dup_checker(settings)
    booked_prompt = booked_completion = 0
    renewed = time.monotonic()

    def still_ours() -> bool:
        # Booking tens of thousands of lines outlasts the submitter's lease: renewed, so that
        # no other pass takes the submission and books it at the same time (its release of
        # the slices would throw away the lines this one has not committed yet).
        nonlocal renewed
        if time.monotonic() - renewed < settings.batch_submit_lease_s / 4:
            return True
        renewed = time.monotonic()
        if store.submission_step(row.id, rt.ident, settings.batch_submit_lease_s):
            return True
        log.warning("submitter lease lost while booking a batch; another pass finishes it",
                    extra={"exam": row.exam, "submission": row.id})
        return False

    for call in store.submission_calls(owner):
        if not still_ours():
            return
        key = (call.exam, call.chapter_id, call.slice_no)
        if call.outcome != CallOutcome.in_flight.value:
            if call.outcome in (CallOutcome.used.value, CallOutcome.wasted.value):
                booked_prompt += call.prompt_tokens
                booked_completion += call.completion_tokens
            continue
        line = lines.get(f"call-{call.id}")
        response: dict[str, Any] | None = (line or {}).get("response") or None
        if response is not None and response.get("status_code") == 200:
            if key not in claims:
                claims[key] = store.held_claim(*key, owner)
                if claims[key] is not None:
                    known[key] = set(claims[key].known)  # type: ignore[union-attr]
            stored, usage = _commit_line(rt, call, response.get("body"), claims[key],
                                         known.get(key, set()), near_dup, outcomes[key],
                                         keyed)
            result.committed += stored
            booked_prompt += usage.prompt_tokens
            booked_completion += usage.completion_tokens
            continue
        if line is None and lost:
            # Its reply was in a file the provider no longer has: the line ran and was
            # billed, so it is booked at its worst case (as a reply cut off is), and its
            # slice goes back for another round, counted against the attempt cap.
            worst = client.batch_worst_case_usd(call.prompt_tokens, call.max_tokens or 0)
            gone = RetryableProviderError(
                f"the batch's {'output' if batch.get('output_file_id') in lost else 'error'} "
                f"file is gone at the provider ({batch.get('id')}): the reply was paid and "
                "cannot be read")
            gone.kind = ErrorKind.batch_output_lost
            store.finish_call(call.id, CallOutcome.wasted, gone.kind, str(gone),
                              usage=Usage(call.prompt_tokens, call.max_tokens or 0, worst,
                                          "primary", True))
            booked_prompt += call.prompt_tokens
            booked_completion += call.max_tokens or 0
            _note_error(rt, outcomes[key], gone)
            outcomes[key].count_attempt = True
            continue
        if response is not None:
            exc: ProviderError = client.batch_error(int(response.get("status_code") or 0),
                                                    response.get("body") or {})
        elif line is not None and line.get("error"):
            exc = client.batch_error(0, line["error"])
        elif batch_error is not None:
            exc = batch_error
        else:
            exc = RetryableProviderError(
                f"missing from the batch's files (batch {status})")
            exc.kind = ErrorKind.batch_expired if status == "expired" else (
                ErrorKind.batch_cancelled if status == "cancelled" else ErrorKind.server_error)
        # Not billed: an error line, an expired or cancelled line, a batch that failed.
        store.finish_call(call.id, CallOutcome.failed, exc.kind, str(exc),
                          status_code=exc.status_code or None, usage=Usage(endpoint="primary"))
        _note_error(rt, outcomes[key], exc)
    if not still_ours():
        return
    for key in store.held_slices(owner):
        _settle_slice(rt, owner, key, outcomes.get(key, _SliceOutcome()))
    theirs_usage = batch.get("usage") if isinstance(batch.get("usage"), dict) else None
    if theirs_usage is not None:
        theirs = (theirs_usage.get("input_tokens"), theirs_usage.get("output_tokens"))
        if theirs != (booked_prompt, booked_completion):
            log.warning("the batch's usage differs from the ledger's", extra={
                "exam": row.exam, "submission": row.id, "batch": batch.get("id"),
                "provider_input": theirs[0], "provider_output": theirs[1],
                "ledger_prompt": booked_prompt, "ledger_completion": booked_completion})
    store.finish_submission(row.id, provider_status=status, usage=theirs_usage,
                            counts=batch.get("request_counts") or None,
                            detail=str(batch_error) if batch_error is not None else (
                                f"files gone at the provider ({', '.join(lost)}): unread "
                                "lines booked at their worst case" if lost else None))
    rt.missing_files.pop(row.id, None)
    result.processed += 1
    log.info("batch results booked", extra={"exam": row.exam, "submission": row.id,
                                            "batch": batch.get("id"), "status": status})


def _batch_error(rt: BatchRuntime, batch: dict[str, Any]) -> ProviderError:
    """A failed batch's own error (validation, the enqueued-token limit) as the table names
    it; every line of it failed with it."""
    errors = ((batch.get("errors") or {}).get("data") or [])
    first = errors[0] if errors and isinstance(errors[0], dict) else {
        "code": "batch_failed", "message": "the batch failed with no error listed"}
    exc = rt.client.batch_error(0, {"error": first})
    if exc.kind is ErrorKind.bad_request:
        # A batch refused whole (a line the provider would not validate) says nothing
        # permanent about any one chapter: retried, its attempts counted towards the cap.
        retry = RetryableProviderError(f"batch failed: {exc}")
        retry.kind = ErrorKind.bad_request
        return retry
    return exc


def _commit_line(rt: BatchRuntime, call: Any, body: Any, claim: Claimed | None,
                 known: set[str], near_dup: Any, outcome: _SliceOutcome,
                 keyed: dict[tuple[str, str], list[Any]]) -> tuple[int, Usage]:
    """One output line, committed like a synchronous reply. Returns (questions stored, the
    usage booked)."""
    store, client = rt.store, rt.client
    try:
        completion = client.batch_completion(200, body, call.prompt_tokens, call.max_tokens)
    except ProviderError as exc:
        billed = exc.billed
        usage = Usage(billed.prompt_tokens, billed.completion_tokens, billed.cost_usd,
                      "primary", billed.estimated, billed.cached_tokens) if billed else Usage()
        store.finish_call(call.id, CallOutcome.wasted, CallReason.invalid_output, str(exc),
                          usage=usage)
        outcome.count_attempt = True
        outcome.error = (SliceReason.invalid_output, str(exc))
        return 0, usage
    usage = Usage(completion.prompt_tokens, completion.completion_tokens, completion.cost_usd,
                  completion.endpoint, completion.usage_estimated, completion.cached_tokens)
    if claim is None:
        # The slice is not this submission's any more: completed by its earlier lines (a
        # pass that stopped mid-way), or (after a day without a poll) taken by another
        # holder. Paid for, and nothing of it can be committed.
        store.finish_call(call.id, CallOutcome.wasted, CallReason.lease_lost,
                          "the batch no longer held its slice (complete, or taken) when this "
                          "line was read", usage=usage)
        return 0, usage
    try:
        parsed = parse_questions(completion.content, completion.finish_reason, None, known,
                                 language=claim.language)
    except OutputInvalid as exc:
        store.finish_call(call.id, CallOutcome.wasted, CallReason.invalid_output, str(exc),
                          usage=usage)
        outcome.count_attempt = True
        outcome.error = (SliceReason.invalid_output, f"invalid output: {exc}")
        return 0, usage
    note = ", ".join(f"{n} {k.value} rejected" for k, n in parsed.rejected.items())
    if outcome.done:
        # The round asked this slice for more than it lacked (a top-up's over-ask), and the
        # lines read before this one completed it: billed, nothing more to store.
        store.finish_call(call.id, CallOutcome.wasted, CallReason.invalid_output,
                          f"its slice was complete: {len(parsed.questions)} beyond the target "
                          "not stored", usage=usage)
        return 0, usage
    shares = claim.levels.difficulty
    levels = Levels(apportion(call.requested, shares) if shares else None, claim.levels.bloom)
    questions = levels.resolve(parsed.questions)
    if claim.levels.types is not None and near_dup is not None:
        # No item restating another type's question of the chapter (as the sync pipeline).
        chapter = (claim.exam, claim.chapter_id)
        if chapter not in keyed:
            keyed[chapter] = keyed_signatures(store, claim.exam, claim.chapter_id,
                                              claim.title, claim.language)
        questions, across = drop_restated(keyed[chapter], questions, near_dup, claim.title,
                                          claim.language)
        if across:
            note = ", ".join(filter(None, [
                note, f"{across} {Rejection.near_duplicate.value} rejected across types"]))
        if not questions:
            return _none_kept(store, call, usage, outcome, Rejection.near_duplicate,
                              "every question restated one of another type")
    if claim.levels.types is not None:
        # No more of a type than the slice lacks, with what earlier lines stored.
        questions, surplus = keep_types(questions, lacking_types(
            claim.levels.types, claim.first_number, claim.target,
            Counter(claim.levels.stored_types) + outcome.types_stored))
        if surplus:
            note = ", ".join(filter(None, [note, f"{surplus} {Rejection.surplus_type.value} "
                                                 "rejected"]))
        if not questions:
            return _none_kept(store, call, usage, outcome, Rejection.surplus_type,
                              "every question was of a type the slice has enough of")
    passages = rt.store.chapter_passages(claim.exam, claim.chapter_id)
    if passages:  # the passage each cites (examforge.sources), as stored
        questions = ground(questions, {p.pid: p for p in passages})
    try:
        committed = store.commit_batch(claim, rt.settings.batch_lease_s, call.id, questions,
                                       model=completion.model, note=note, usage=usage,
                                       near_dup=near_dup)
    except LeaseLost:
        return 0, usage  # booked wasted by the commit
    for text in committed.kept:
        known.add(normalise(text))
    if claim.levels.types is not None:
        kept = Counter(committed.kept)
        for q in questions:
            if kept[q.question] > 0:
                kept[q.question] -= 1
                outcome.types_stored.update(type_counts([q]))
    outcome.done = committed.done
    if committed.kept:
        outcome.progressed = True
    elif not committed.done:
        outcome.count_attempt = True
        outcome.error = (SliceReason.duplicates,
                         "every question was one the chapter already had")
    return len(committed.kept), usage


def _none_kept(store: Any, call: Any, usage: Usage, outcome: _SliceOutcome, kind: Rejection,
               why: str) -> tuple[int, Usage]:
    """A line none of whose questions the item-type checks kept: billed, booked wasted with
    the rejection, and counted against its slice's attempts."""
    store.finish_call(call.id, CallOutcome.wasted, CallReason.invalid_output,
                      f"{kind.value}: {why}", usage=usage)
    outcome.count_attempt = True
    outcome.error = (SliceReason.invalid_output, why)
    return 0, usage


def _note_error(rt: BatchRuntime, outcome: _SliceOutcome, exc: ProviderError) -> None:
    decision = decide(exc, streak=1, settings=rt.settings, rand=random.random())
    if decision.action is Action.fail:
        outcome.fail = outcome.fail or (decision.code, decision.detail)
        outcome.pause_after = outcome.pause_after or decision.pause_exam_after
    elif decision.action is Action.pause:
        if outcome.pause is None:
            outcome.pause, outcome.pause_code = decision.reason, decision.pause_code or PauseCode.manual
    else:
        outcome.delay_s = max(outcome.delay_s, decision.delay_s)
        outcome.count_attempt = outcome.count_attempt or decision.count_attempt
        outcome.error = (decision.code, decision.detail)


def _settle_slice(rt: BatchRuntime, owner: str, key: tuple[str, str, int],
                  outcome: _SliceOutcome) -> None:
    """After all of a batch's lines: a slice still held (not done) fails on a permanent
    error, else goes back to the next round (after the backoff its errors ask for)."""
    store = rt.store
    exam = key[0]
    if outcome.pause is not None and store.pause_exam(exam, outcome.pause, outcome.pause_code):
        log.error("exam paused by a batch line", extra={"exam": exam, "reason": outcome.pause})
    if outcome.fail is not None:
        claim = store.held_claim(*key, owner)
        if claim is not None:
            code, detail = outcome.fail
            store.fail(claim, code, detail, pause_exam_after=outcome.pause_after)
            log.error("chapter failed by a batch line", extra={
                "exam": exam, "chapter": key[1], "slice": key[2], "code": code.value,
                "reason": code.describe(detail)})
            return
    store.release_held(owner, [key], retry_in_s=outcome.delay_s, error=outcome.error,
                       count_attempt=outcome.count_attempt and not outcome.progressed)


__all__ = ["BatchRuntime", "PassResult", "process_results", "run_pass", "submit_round"]
