"""The plain function behind every chapter task: claim, call, validate, commit.

Celery tasks and the embedded `producer run` both call `process_chapter`; it never raises for
the outcomes of the work itself, it returns a `ChapterResult` saying what happened and when
(if ever) to come back. What to do after an error is `examforge.retry.decide`.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from examforge.errors import (
    BudgetExceeded,
    LeaseLost,
    OutputInvalid,
    PauseCode,
    ProviderError,
    Rejection,
    ReplyTooLarge,
    ReplyUnusable,
    SliceReason,
)
from runner.heartbeat import LeaseKeeper
from examforge.levels import (Levels, ask, ask_types, keep_types, lacking_types,
                              type_counts)
from examforge.llm import Admission, Completion, LLMClient
from examforge import neardup
from examforge import item_types
from examforge.neardup import Checker, Scope, Signature, signature
from examforge.output import Question, normalise, parse_questions
from examforge.prompt import build_messages
from examforge.retry import Action, Decision, HandBack, decide
from examforge.settings import MAX_TOKENS_OVERHEAD, Settings
from examforge.languages import DEFAULT_LANGUAGE
from examforge.sizing import Sizer, fixed_allowance
from examforge.sources import Passage, SliceMaterial, ground, slice_material
from examforge.tokens import count_text
from examforge.syllabus import Chapter as ChapterSpec
from storage.models import CallOutcome, CallReason
from runner.verify import solve_pending, test_hook
from storage.neardup import Steering
from storage.store import (
    CallPlan,
    ChapterView,
    Claimed,
    FirstCall,
    Judged,
    NoRoom,
    NotClaimed,
    NotClaimedReason,
    SendCheck,
    Steer,
    Store,
    Usage,
    submission_of,
)

log = logging.getLogger("examforge.pipeline")

# The longest a chapter waits in its thread for the shared rate limiter; past that it is handed
# back to the queue for the wait (uncounted), and the thread takes other work.
RATE_WAIT_MAX_S = 60.0
# A slice asks for more questions than it lacks (up to QUESTIONS_PER_CALL) once this run has
# seen at least REPEATS_SEEN of the model's questions and at least REPEATS_OVER_ASK of them
# came back as repeats (exact or near-duplicates of what the chapter has).
REPEATS_SEEN = 5
REPEATS_OVER_ASK = 0.2

__all__ = ["ChapterResult", "HandBack", "Runtime", "new_owner", "process_chapter"]


class Outcome(str, Enum):
    """How one delivery of a chapter ended."""

    done = "done"  # the chapter has all its questions
    failed = "failed"  # it cannot succeed without a person (see its last error)
    skipped = "skipped"  # nothing to do here: done, cancelled, or its exam paused
    lost = "lost"  # the lease went to someone else; their result counts
    retry = "retry"  # come back after `retry_in_s`


@dataclass(frozen=True)
class ChapterResult:
    """`retry_in_s` is set for Outcome.retry."""

    outcome: Outcome
    detail: str = ""  # for people: the reason's label and its detail
    retry_in_s: float | None = None
    calls: int = 0
    reason: SliceReason | None = None  # why an attempt ended early: what code compares
    not_claimed: NotClaimedReason | None = None  # why no attempt was made


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
    # max_tokens per question, sized from the database's history (examforge.sizing).
    sizer: Sizer = field(default_factory=Sizer)
    # The blind solver's client (VERIFY), built on first use (`solver`).
    verifier: LLMClient | None = None
    _verifier_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, settings: Settings, store: Store, client: LLMClient | None = None) -> "Runtime":
        store.configure_group(settings.group_commit, settings.group_commit_wait_ms / 1000,
                              settings.group_commit_max)
        rt = cls(settings, store, client or LLMClient(settings),
                 LeaseKeeper(store, settings.lease_s, settings.heartbeat_interval_s))
        rt.warm_up()
        return rt

    def warm_up(self) -> None:
        """Load the tokenizers (and what the near-duplicate check imports) before the first
        claim. Loading one takes 1 to 2.5 s on two busy cores; left to the first call's
        planning, that time is spent inside the claim's transaction (which plans the first
        call), holding the slice row, and on SQLite the one write lock, while leases run: in
        the chaos test, long enough for a new worker's first lease to lapse before its first
        beat."""
        settings = self.settings
        for model in {settings.llm_model, settings.llm_fallback_model or settings.llm_model}:
            try:
                count_text("warm-up", model)
            except Exception as exc:  # the first call loads it, or says why it cannot
                log.warning("tokenizer for %s not loaded in advance: %s", model, exc)
        neardup.warm_up()

    def solver(self) -> LLMClient:
        """The blind solver's client (VERIFY_MODEL at VERIFY_BASE_URL): built on the
        generation client's limiter factory, so that an endpoint both call (the default)
        is under one shared rate limiter."""
        with self._verifier_lock:
            if self.verifier is None:
                self.verifier = LLMClient(self.settings.verify_settings(),
                                          limiters=getattr(self.client, "limiters", None))
            return self.verifier

    def close(self) -> None:
        """Stop the heartbeat and close the provider's connections."""
        self.keeper.stop()
        self.client.close()
        if self.verifier is not None:
            self.verifier.close()


def keyed_signatures(store: Any, exam: str, chapter_id: str, title: str,
                     language: str) -> list[tuple[str, Signature]]:
    """A chapter's numbered questions as (type, signature of the text with its key), in the
    chapter's language: what `drop_restated` compares a new item with."""
    return [(kind, signature(text, title, language))
            for kind, text in store.keyed_texts(exam, chapter_id)]


def drop_restated(keyed: list[tuple[str, Signature]], batch: Sequence[Question],
                  checker: Checker, title: str,
                  language: str) -> tuple[list[Question], int]:
    """The batch without the items that restate, in another type, a question of `keyed` (a
    true/false statement of an mcq's key, an mcq whose key is a stored statement): compared
    with their keys (examforge.item_types.with_key) at the near-duplicate threshold, and
    how many were dropped. `keyed` grows by each item kept, so a later item of the batch is
    compared with it too. Pairs of four-choice questions are the commit's check. The sync
    pipeline and batch mode both use it."""
    kept, near = [], 0
    for q in batch:
        sig = signature(item_types.with_key(q.type, q.question, q.choices, q.answer_index,
                                            item_types.load(q.answer)), title, language)
        if any((kind != "mcq" or q.type != "mcq") and checker.is_near(sig, other)
               for kind, other in keyed):
            near += 1
            continue
        kept.append(q)
        keyed.append((q.type, sig))
    return kept, near


def near_dup_checker(settings: Settings) -> Checker | None:
    if settings.near_dup_scope == "off":
        return None
    return Checker(settings.near_dup_threshold, Scope(settings.near_dup_scope))


def steer_of(settings: Settings) -> Steer:
    return Steer(settings.avoid_questions, settings.steer_prompt)


def new_owner() -> str:
    """A fencing token unique to one claim: who holds the lease, and which claim it was."""
    return f"{socket.gethostname()[:60]}/{os.getpid()}/{uuid.uuid4().hex[:16]}"


def process_chapter(rt: Runtime, exam: str, chapter_id: str, slice_no: int = 0) -> ChapterResult:
    """Generate whatever the slice of the chapter is missing, committing each call's questions
    as they come. (One slice: the unit of work; a chapter of one slice is the whole chapter.)"""
    store, settings = rt.store, rt.settings
    lost = threading.Event()  # replaced by the lease keeper's flag once the lease is held

    def check() -> None:
        if rt.stopping.is_set():
            raise HandBack()
        if lost.is_set():
            raise LeaseLost(f"lease on {exam}/{chapter_id} lost during the run")

    calls = _Calls(rt, check)
    try:
        calls.size(exam)
        # The claim plans the first call, except under a verifying policy (the exam's, read
        # by the claim: never this worker's VERIFY) for a slice with questions stored: its
        # pending blind solves (a dead holder's) come first (storage.leases._solves_first).
        first = None
        fresh = store.fresh_view(exam, chapter_id, slice_no)
        if fresh is not None:
            # Planned before the claim for the slice as its spec says with nothing stored;
            # the claim records it if that is what it finds (PostgreSQL: in its own
            # statement; SQLite: without planning inside its write transaction).
            planned_first = calls.plan(fresh[0])
            # Nothing counted from that view (nothing stored) may outlive it: the claim's is
            # what the slice holds (a takeover solving first, a replan, a multi-call slice).
            calls.forget_view()
            if planned_first is not None:
                # A stop that comes before the claim records it: planned again inside, where
                # planning sees the stop and records nothing (no call booked as never sent).
                first = FirstCall(planned_first, fresh[1],
                                  wanted=lambda: not rt.stopping.is_set())
        claim = store.claim(exam, chapter_id, new_owner(), settings.lease_s,
                            settings.max_attempts, slice_no=slice_no,
                            plan_first=calls.replan,
                            steer=steer_of(settings), first=first)
    except BaseException:
        calls.discard()
        raise
    if isinstance(claim, NotClaimed):
        calls.discard()
        return _not_claimed(claim, exam, chapter_id, slice_no)
    calls.passages = list(claim.passages)  # the chapter's course material, read by the claim
    fields = {"exam": exam, "chapter": chapter_id, "slice": slice_no, "attempt": claim.attempt}
    if claim.took_over_calls:
        log.warning("took over chapter; previous holder's calls marked wasted",
                    extra={**fields, "wasted": claim.took_over_calls})
    lost = rt.keeper.hold(claim.owner)
    run = _Run()
    try:
        if not _generate(rt, claim, lost, run, calls, claim.verify):
            return ChapterResult(Outcome.skipped, "cancelled", calls=run.calls)
        return ChapterResult(Outcome.done, calls=run.calls)
    except BaseException as exc:
        calls.discard()
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
    extra = {**fields, "code": decision.code.value, "reason": decision.reason[:300]}
    if decision.action is Action.lost:
        log.warning("lease lost; result discarded", extra=extra)
        return ChapterResult(Outcome.lost, decision.reason, reason=decision.code)
    if decision.action is Action.fail:
        store.fail(claim, decision.code, decision.detail,
                   pause_exam_after=decision.pause_exam_after)
        log.error("chapter failed", extra=extra)
        return ChapterResult(Outcome.failed, decision.reason, reason=decision.code)
    if decision.action is Action.pause:
        if store.pause_exam(claim.exam, decision.reason,
                            decision.pause_code or PauseCode.manual):
            log.error("exam paused", extra=extra)
        store.release(claim, retry_in_s=0, code=decision.code, detail=decision.detail,
                      count_attempt=False)
        return ChapterResult(Outcome.skipped, f"paused: {decision.reason}", calls=run.calls,
                             reason=decision.code)
    if decision.action is Action.reraise:
        try:
            store.release(claim, retry_in_s=decision.delay_s, code=decision.code,
                          detail=decision.detail)
        except Exception:  # the database itself may be what failed; the lease will expire
            pass
        raise exc
    store.release(claim, retry_in_s=decision.delay_s, code=decision.code,
                  detail=decision.detail, count_attempt=decision.count_attempt)
    log.info("chapter handed back; retry scheduled",
             extra={**extra, "retry_in_s": round(decision.delay_s, 2)})
    return ChapterResult(Outcome.retry, decision.reason, retry_in_s=decision.delay_s,
                         calls=run.calls, reason=decision.code)


def _not_claimed(claim: NotClaimed, exam: str, chapter_id: str, slice_no: int) -> ChapterResult:
    if claim.reason is NotClaimedReason.busy and submission_of(claim.holder) is not None:
        # A provider batch holds it (runner.batching) for up to a day: the batch runner
        # commits its results; a countdown that long would outlive the broker's visibility
        # timeout. If the exam went back to sync mode, the reconciler re-publishes the slice
        # once the batch gives it back.
        log.info("slice held by a provider batch; left to it",
                 extra={"exam": exam, "chapter": chapter_id, "slice": slice_no})
        return ChapterResult(Outcome.skipped, f"{claim.reason.value}: {claim.detail}",
                             not_claimed=claim.reason)
    if claim.retry_in_s is not None:
        # Busy (a live lease elsewhere) or in backoff: make no call, check back when it ends.
        log.info("slice not claimable now; checking back",
                 extra={"exam": exam, "chapter": chapter_id, "slice": slice_no,
                        "reason": claim.reason.value,
                        "retry_in_s": round(claim.retry_in_s, 2)})
        return ChapterResult(Outcome.retry, f"{claim.reason.value}: {claim.detail}",
                             retry_in_s=claim.retry_in_s + 0.5, not_claimed=claim.reason)
    outcome = Outcome.failed if claim.reason is NotClaimedReason.cap else Outcome.skipped
    log.info("slice needs no work here",
             extra={"exam": exam, "chapter": chapter_id, "slice": slice_no,
                    "reason": claim.reason.value})
    return ChapterResult(outcome, f"{claim.reason.value} {claim.detail}".strip(),
                         not_claimed=claim.reason)


@dataclass
class _Run:
    """What one attempt did so far (read after an exception, too)."""

    calls: int = 0
    committed: int = 0


@dataclass
class _Next:
    """The next call as it will be sent: its messages, cap and rate-limit admission."""

    want: int
    messages: list[dict[str, str]]
    prompt_tokens: int
    max_tokens: int
    reserve_usd: float
    admission: Admission | None = None
    view: ChapterView | None = None  # the chapter's state it was prepared for
    levels: Levels = Levels()  # the difficulty counts and Bloom levels it asks for
    material: SliceMaterial = SliceMaterial()  # the course material it offers


class _Calls:
    """Plans a chapter's calls. `plan` runs inside the store's transactions (the claim, each
    commit) so that a call is recorded in the same transaction that frees its slot: one write
    per paid call. It never waits: when the shared rate limiter asks to wait, it plans nothing
    and the call is started afterwards, outside any transaction (`start`)."""

    def __init__(self, rt: Runtime, check: Callable[[], None]) -> None:
        self.rt = rt
        self.check = check
        # What the next prompts list: the store's pick (the claim's, then the last commit's)
        # and the questions received since, which replace its newest (Steering.with_fresh).
        self.steering: Sequence[str] | None = None
        self.fresh: list[str] = []
        self.next: _Next | None = None
        self.prepared: _Next | None = None
        # The limiter's last answer (`_admitted`) was to wait: planning inside the transaction
        # that follows (the claim's, the commit's) asks it nothing more (`plan`).
        self.refused = False
        # The slice's stored questions per difficulty, once a commit has changed them from
        # what the claim read (view.levels.stored).
        self.stored_levels: Counter[str] | None = None
        # The same per item type (examforge.item_types), for a chapter with types.
        self.types_stored: Counter[str] | None = None
        # A chapter with types: its questions' signatures with their keys (`across_types`).
        self.keyed: list[tuple[str, Signature]] | None = None
        # After a reply cut at max_tokens (`after_cut`): the room per question, or the most
        # questions a call asks; each reply that is not cut eases them back (`not_cut`).
        self.room: int | None = None
        self.most: int | None = None
        # The language of the chapter's views (`per_question` reads it): its fixed allowance.
        self.language = DEFAULT_LANGUAGE
        # The model's valid questions this run has seen, and how many were repeats.
        self.delivered = 0
        self.repeats = 0
        # The chapter's passages (examforge.sources), and the slice's share of them as its
        # prompts carry it: the same on every call of the slice (the cached prefix).
        self.passages: list[Passage] = []
        self._material: dict[tuple[int, int, int], SliceMaterial] = {}

    def material(self, view: ChapterView) -> SliceMaterial:
        key = (view.first_number, view.target, view.chapter_target or view.target)
        if key not in self._material:
            model = self.rt.client.model
            self._material[key] = slice_material(
                list(view.passages), *key, self.rt.settings.source_prompt_tokens,
                lambda text: count_text(text, model))
        return self._material[key]

    def per_question(self, view: ChapterView) -> int:
        """max_tokens per question asked: the room a cut reply asked for, else the allowance
        sized from history (examforge.sizing: as last read, since this may run inside a
        transaction; `size` reads it again when due, outside)."""
        self.language = view.language
        if self.room is not None:
            return self.room
        return self.rt.sizer.cached(self.rt.settings, view.exam, self.rt.client.model
                                    ).in_language(self.rt.settings, view.language)

    def size(self, exam: str) -> None:
        """Read the allowance from the database's history when due (outside transactions)."""
        self.rt.sizer.refresh(self.rt.store, self.rt.settings, exam, self.rt.client.model)

    def want(self, view: ChapterView) -> int:
        """How many questions the next call asks for: what the slice lacks, up to
        QUESTIONS_PER_CALL (or fewer after a cut reply). When this run saw the model repeat
        itself often, a few more, bounded the same way: the commit stores the first new
        ones the slice needs (storage.ledger), so a repeat costs a few completion tokens
        instead of a whole re-ask."""
        cap = min(self.rt.settings.questions_per_call, self.most or 10**9)
        need = view.target - view.stored
        want = min(cap, need)
        if 0 < need < cap and self.delivered >= REPEATS_SEEN:
            rate = min(0.8, self.repeats / self.delivered)
            if rate >= REPEATS_OVER_ASK:
                want = min(cap, max(need + 1, math.ceil(need / (1 - rate))))
        return want

    def seen(self, delivered: int, repeats: int) -> None:
        self.delivered += delivered
        self.repeats += repeats

    def after_cut(self, nxt: _Next, recovered: int) -> str:
        """Size the next calls after a reply cut at max_tokens, never as the cut one was: more
        room per question while the allowance is below LLM_MAX_TOKENS_PER_QUESTION (the
        allowance sized from history was too tight), or when the call asked for one
        question; else fewer questions a call (as many as the reply held whole, or half).
        The budget check of the next call still applies (`fitting` asks for fewer when more
        room does not fit). Returns what was done, for the call's detail in the ledger."""
        per_question = max(1, (nxt.max_tokens - MAX_TOKENS_OVERHEAD) // max(1, nxt.want))
        fixed = fixed_allowance(self.rt.settings, self.language)
        if per_question < fixed or nxt.want <= 1:
            self.room = min(fixed, 2 * per_question) if per_question < fixed else 2 * per_question
            return (f"cut at max_tokens {nxt.max_tokens}: next calls ask with more room "
                    f"({self.room} tokens a question, was {per_question})")
        self.most = max(1, min(recovered, nxt.want - 1)) if recovered else max(1, nxt.want // 2)
        return (f"cut at max_tokens {nxt.max_tokens}: next calls ask for fewer "
                f"(at most {self.most} questions a call, was {nxt.want})")

    def not_cut(self, exam: str) -> None:
        """A reply arrived whole: ease the sizes a cut set back towards the usual ones (half
        the extra room, twice the count), so that a cut that had nothing to do with the size
        (a provider's hiccup) does not shrink the rest of the run, while a model that
        really needs the room meets the cut again and is sized again."""
        if self.most is not None:
            self.most = None if 2 * self.most >= self.rt.settings.questions_per_call \
                else 2 * self.most
        if self.room is not None:
            usual = self.rt.sizer.cached(self.rt.settings, exam, self.rt.client.model
                                         ).in_language(self.rt.settings, self.language)
            self.room = None if self.room // 2 <= usual else self.room // 2

    def levels(self, view: ChapterView, want: int) -> Levels:
        """What the next call asks of the chapter's difficulty mix and Bloom levels: the
        counts its slice still lacks (examforge.levels)."""
        chapter = view.levels
        types, true_count = None, 0
        if chapter.types is not None:
            types, true_count = ask_types(chapter.types, view.first_number, view.target,
                                          self.stored_types(view), want)
        if chapter.difficulty is None:
            return Levels(None, chapter.bloom, types, true_count)
        stored = chapter.stored if self.stored_levels is None else self.stored_levels
        return Levels(ask(chapter.difficulty, view.first_number, view.target, stored, want),
                      chapter.bloom, types, true_count)

    def across_types(self, view: ChapterView,
                     batch: Sequence[Question]) -> tuple[list[Question], int]:
        """The batch without the items that restate, in another type, a question the
        chapter has (`drop_restated`). Only in a chapter with types, against its numbered
        questions, read once a run and kept up with what it stores."""
        checker = near_dup_checker(self.rt.settings)
        if view.levels.types is None or checker is None:
            return list(batch), 0
        if self.keyed is None:
            self.keyed = keyed_signatures(self.rt.store, view.exam, view.chapter_id,
                                          view.title, view.language)
        return drop_restated(self.keyed, batch, checker, view.title, view.language)

    def stored_types(self, view: ChapterView) -> Counter[str]:
        """The slice's stored questions per item type: what the claim read, and each batch
        since, counted before its commit as difficulties are."""
        if self.types_stored is None:
            self.types_stored = Counter(view.levels.stored_types)
        return self.types_stored

    def keep_types(self, view: ChapterView,
                   batch: Sequence[Question]) -> tuple[list[Question], int]:
        """The batch's questions of the types the slice still lacks, and how many were
        beyond them (examforge.levels.keep_types)."""
        chapter = view.levels
        if chapter.types is None:
            return list(batch), 0
        return keep_types(batch, lacking_types(chapter.types, view.first_number, view.target,
                                               self.stored_types(view)))

    def count_levels(self, view: ChapterView, batch: Sequence[Question]) -> None:
        """Count a batch's difficulties as stored before its commit: the next call is
        prepared (`prepare`) before the commit that records it."""
        if view.levels.types is not None:
            self.stored_types(view).update(type_counts(batch))
        if view.levels.difficulty is None:
            return
        if self.stored_levels is None:
            self.stored_levels = Counter(view.levels.stored)
        self.stored_levels.update(q.difficulty for q in batch if q.difficulty is not None)

    def not_kept(self, batch: Sequence[Question], kept: Sequence[str]) -> None:
        """Take back the counts of a batch's questions its commit dropped (duplicates)."""
        if self.stored_levels is None and self.types_stored is None:
            return
        left = Counter(kept)
        for q in batch:
            if left[q.question] > 0:
                left[q.question] -= 1
                continue
            if self.types_stored is not None:
                self.types_stored.subtract(type_counts([q]))
            if q.difficulty is not None and self.stored_levels is not None:
                self.stored_levels[q.difficulty] -= 1

    def _build(self, view: ChapterView, want: int) -> _Next:
        rt = self.rt
        spec = ChapterSpec.model_construct(id=view.chapter_id, title=view.title,
                                           questions=view.chapter_target or view.target,
                                           prompt=view.prompt, language=view.language,
                                           types=view.levels.types)
        # What the chapter has: read by the store in the transaction before this call (the
        # claim, or the last commit, which sees every slice's questions), plus the batch
        # just received. Slices of one chapter are also steered to their own numbers.
        numbers = None
        if view.chapter_target > view.target:
            numbers = (view.first_number, view.first_number + view.target - 1,
                       view.chapter_target)
        levels = self.levels(view, want)
        limit = rt.settings.avoid_questions
        base = view.recent if self.steering is None else self.steering
        if not isinstance(base, Steering):  # the newest only (STEER_PROMPT=recent)
            base = Steering(newest=base)
        avoid = base.with_fresh(self.fresh, limit)
        material = self.material(view)
        messages = build_messages(view.exam, view.exam_title, spec, want, avoid,
                                  numbers=numbers, levels=levels, material=material.block)
        prompt_tokens = rt.client.count_prompt(messages)
        max_tokens = rt.settings.max_tokens(want, self.per_question(view))
        return _Next(want, messages, prompt_tokens, max_tokens,
                     rt.client.worst_case_usd(prompt_tokens, max_tokens), levels=levels,
                     material=material)

    def _plan(self, view: ChapterView, nxt: _Next) -> CallPlan:
        return CallPlan(view.next_number, nxt.want, nxt.prompt_tokens, nxt.max_tokens,
                        nxt.reserve_usd, self.rt.client.model, self.rt.client.prices_known)

    def _admitted(self, view: ChapterView) -> _Next | None:
        want = self.want(view)
        if want <= 0 or self.rt.stopping.is_set():
            return None
        nxt = self._build(view, want)
        nxt.admission = self.rt.client.try_admit(nxt.messages, nxt.max_tokens,
                                                 prompt_tokens=nxt.prompt_tokens)
        self.refused = nxt.admission is None
        return nxt if nxt.admission is not None else None

    def plan(self, view: ChapterView) -> CallPlan | None:
        """The planner the store calls inside its transaction. A call prepared beforehand for
        exactly this state of the chapter (`prepare`) costs nothing here; otherwise (the claim,
        whose state is only known inside) it is built now."""
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            assert prepared.view is not None
            if (prepared.view.stored, prepared.view.target) != (view.stored, view.target):
                self._cancel(prepared)  # the target changed under us: the slow path re-plans
                return None
            self.next = prepared
            return self._plan(view, prepared)
        if self.refused:
            # The limiter said wait moments ago, outside: asked again here, it would hold the
            # transaction (on SQLite, the one writer) for its round trip to say the same. The
            # call is started afterwards, outside (`start` waits for the limiter).
            self.refused = False
            return None
        nxt = self._admitted(view)
        if nxt is None:
            return None
        self.next = nxt
        return self._plan(view, nxt)

    def replan(self, view: ChapterView) -> CallPlan | None:
        """`plan`, after letting go of a call planned before the claim that the claim did not
        record (the slice was not as its spec said: Leases.fresh_view)."""
        self.discard()
        return self.plan(view)

    def forget_view(self) -> None:
        """Drop what planning counted from a view read before the claim (nothing stored in
        the slice): its counts per item type, and its course material (the slice may have
        had none when the view was read). What the claim reads is the slice's."""
        self.types_stored = None
        self._material.clear()

    def prepare(self, view: ChapterView) -> None:
        """Build and admit the next call before the transaction that will record it: the
        prompt, its token count and the limiter's answer are computed outside it, so the
        transaction (and, on SQLite, the one write lock) is held only for the writes."""
        nxt = self._admitted(view)
        if nxt is not None:
            nxt.view = view
        self.prepared = nxt

    def _cancel(self, nxt: _Next | None) -> None:
        if nxt is not None and nxt.admission is not None:
            self.rt.client.cancel(nxt.admission)

    def discard(self) -> None:
        """The planned call was not recorded (no room in the budget, a failed transaction)."""
        self._cancel(self.next)
        self._cancel(self.prepared)
        self.next = self.prepared = None

    def start(self, claim: Claimed, view: ChapterView) -> int:
        """The slow path: wait for the rate limiter, then record the call in a transaction of
        its own. When the budget has room for fewer questions, ask for fewer."""
        rt = self.rt
        want = self.want(view)
        while True:
            nxt = self._build(view, want)
            nxt.admission = rt.client.admit(nxt.messages, nxt.max_tokens,
                                            max_wait_s=RATE_WAIT_MAX_S, check=self.check,
                                            prompt_tokens=nxt.prompt_tokens)
            self.next = nxt
            plan = self._plan(view, nxt)
            try:
                booked = rt.store.start_call(
                    claim, plan.first_number, plan.requested, lease_s=rt.settings.lease_s,
                    prompt_tokens=plan.prompt_tokens, max_tokens=plan.max_tokens,
                    reserve_usd=plan.reserve_usd, model=plan.model,
                    price_known=plan.price_known)
            except BaseException:
                self.discard()
                raise
            if not isinstance(booked, NoRoom):
                return booked
            self.discard()
            want = self.fitting(booked, nxt.prompt_tokens, want, self.per_question(view))

    def fitting(self, room: NoRoom, prompt_tokens: int, want: int,
                per_question: int | None = None) -> int:
        """The most questions below `want` whose call still fits the budget's headroom."""
        client, settings = self.rt.client, self.rt.settings
        fits = max((n for n in range(want - 1, 0, -1)
                    if client.worst_case_usd(prompt_tokens, settings.max_tokens(n, per_question))
                    <= room.headroom_usd), default=0)
        if fits:
            return fits
        raise BudgetExceeded(
            f"${room.spent_usd:.4f} spent and ${room.reserved_usd:.4f} reserved of "
            f"${room.budget_usd:.4f}; the next call needs up to ${room.needed_usd:.4f}",
            others_in_flight=room.in_flight > 0)


def _generate(rt: Runtime, claim: Claimed, lost: threading.Event, run: _Run,
              calls: _Calls, policy: str = "off") -> bool:
    """Call the model batch by batch until the chapter has its questions (True), or until a
    commit finds the slice cancelled while its call ran (False: that call's questions are
    stored, and no more is sent). `policy`: the exam's blind-solve policy."""
    settings, store = rt.settings, rt.store
    stored, known = claim.stored, set(claim.known)
    invalid_in_row = 0
    target = claim.target
    planned = claim.first_call
    verifying = policy != "off"

    def solve() -> Judged | None:
        judged = solve_pending(rt, claim, calls.check, lost, lambda client, call_id, messages,
                               cap, admission: _call(rt, call_id, messages, cap, admission,
                                                     client), stored, target,
                               replace=policy == "replace")
        if policy == "replace" and claim.levels.types is not None and judged is not None:
            # Disputed questions were withdrawn: what the slice holds per type, read again.
            calls.types_stored = Counter(store.stored_types(claim))
        return judged

    if verifying and stored > 0:
        # Questions a dead holder stored and never had solved come first (the takeover). A
        # call planned before the claim (for a slice with nothing stored) is let go: the
        # claim did not record it, and the next call is planned after the solves.
        calls.discard()
        judged = solve()
        if judged is None or judged.cancelled or judged.done:
            return judged is not None and not judged.cancelled
        stored, target = judged.stored, judged.target
    # Whether the call about to be sent was recorded by the step right before its send (the
    # claim, or `calls.start`), rather than by a commit with a reply's work in between.
    just_recorded = isinstance(planned, int)
    while stored < target:
        view = claim.view(stored, target)
        if isinstance(planned, int):
            call_id = planned  # recorded in the last transaction, lease held: send it
        else:
            # Nothing planned (the limiter asked to wait, or a re-ask), or no room in the
            # budget for the planned call: the slow path waits, shrinks or pauses.
            calls.discard()
            calls.check()
            calls.size(claim.exam)
            call_id = calls.start(claim, view)
            just_recorded = True
        planned = None
        if rt.stopping.is_set():
            # Stopped after the call was recorded (in the claim's or the last commit's
            # transaction) and before its request: sending it would make Ctrl-C wait a whole
            # call more than those in flight, and pay for it.
            rt.store.finish_call(call_id, CallOutcome.failed, CallReason.unexpected,
                                 "not sent: stopping (Ctrl-C or a shutdown)")
            raise HandBack()
        # The last step before the send: a cancel or a takeover that committed since the
        # call was recorded wins, and the call is booked as never sent (Store.may_send). A
        # call recorded by the claim or by `calls.start` needs no such read: that record is
        # itself the fenced check of the slice's state and lease, and nothing waits between
        # it and the send. A call a commit recorded has the reply's bookkeeping in between.
        sendable = SendCheck.send if just_recorded else store.may_send(claim, call_id)
        just_recorded = False
        if sendable is not SendCheck.send:
            calls.discard()
            if sendable is SendCheck.cancelled:
                log.info("slice cancelled before its next call was sent; not sent", extra={
                    "exam": claim.exam, "chapter": claim.chapter_id, "slice": claim.slice_no})
                return False
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost before a call")
        nxt = calls.next
        assert nxt is not None and nxt.admission is not None
        calls.next = None
        run.calls += 1
        try:
            completion = _call(rt, call_id, nxt.messages, nxt.max_tokens, nxt.admission)
        except (ReplyTooLarge, ReplyUnusable) as exc:
            # A broken endpoint's reply, billed and booked as wasted (_call), not a transient
            # fault: re-asked like invalid output, up to MAX_REASKS.
            invalid_in_row += 1
            log.warning("reply refused", extra={"exam": claim.exam,
                        "chapter": claim.chapter_id, "error": str(exc)})
            if invalid_in_row > settings.max_reasks:
                kind = (Rejection.reply_too_large if isinstance(exc, ReplyTooLarge)
                        else Rejection.unreadable)
                raise OutputInvalid(kind, str(exc)) from None
            continue
        usage = Usage(completion.prompt_tokens, completion.completion_tokens,
                      completion.cost_usd, completion.endpoint, completion.usage_estimated,
                      completion.cached_tokens, completion.service_tier)
        try:
            # Every valid question passes: the commit stores the first new ones the slice
            # lacks, whatever count the call asked for.
            parsed = parse_questions(completion.content, completion.finish_reason, None, known,
                                     language=claim.language)
        except OutputInvalid as exc:
            detail = str(exc)
            if exc.kind is Rejection.truncated:
                detail = f"{detail}; {calls.after_cut(nxt, 0)}"
            elif exc.kind is Rejection.duplicate:
                calls.seen(nxt.want, nxt.want)  # every question was one the chapter had
            store.finish_call(call_id, CallOutcome.wasted, CallReason.invalid_output, detail,
                              usage=usage)
            invalid_in_row += 1
            log.warning("invalid model output", extra={"exam": claim.exam,
                        "chapter": claim.chapter_id, "kind": exc.kind.value,
                        "cost_usd": usage.cost_usd})
            if invalid_in_row > settings.max_reasks:
                raise
            continue
        if lost.is_set():
            store.finish_call(call_id, CallOutcome.wasted, CallReason.lease_lost,
                              "the lease expired while the call ran", usage=usage)
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost during the call")
        note = ", ".join(f"{n} {k.value} rejected" for k, n in parsed.rejected.items())
        if parsed.truncated:
            kept = len(parsed.questions)
            note = ", ".join(filter(None, [
                note, f"{kept} complete question{'s' if kept != 1 else ''} kept from a reply "
                      f"{calls.after_cut(nxt, kept)}"]))
        else:
            calls.not_cut(claim.exam)
        batch = nxt.levels.resolve(parsed.questions)  # the levels each is stored with
        # No item restating another type's question, and no more of an item type than the
        # slice lacks: its counts are the chapter's.
        batch, across = calls.across_types(claim.view(), batch)
        if across:
            note = ", ".join(filter(None, [
                note, f"{across} {Rejection.near_duplicate.value} rejected across types"]))
        batch, surplus = calls.keep_types(claim.view(), batch)
        if surplus:
            note = ", ".join(filter(None, [
                note, f"{surplus} {Rejection.surplus_type.value} rejected"]))
        if not batch:
            kind, why = ((Rejection.surplus_type,
                          "every question was of a type the slice has enough of") if surplus
                         else (Rejection.near_duplicate,
                               "every question restated one of another type"))
            store.finish_call(call_id, CallOutcome.wasted, CallReason.invalid_output,
                              f"{kind.value}: {why}", usage=usage)
            invalid_in_row += 1
            if invalid_in_row > settings.max_reasks:
                raise OutputInvalid(kind, why)
            continue
        if calls.passages:  # the passage each cites, as stored
            batch = ground(batch, nxt.material.offered, {p.pid: p for p in calls.passages})
        calls.count_levels(claim.view(), batch)
        for q in parsed.questions:  # the next call's prompt already avoids this batch
            calls.fresh.append(q.question)
        if len(calls.fresh) > settings.avoid_questions:  # no prompt lists more of them
            del calls.fresh[:len(calls.fresh) - settings.avoid_questions]
        # What the reply repeated of what this slice knew; the commit's own rejections are
        # added after it (the next call is prepared before it).
        repeats = parsed.rejected.get(Rejection.duplicate, 0)
        calls.seen(len(parsed.questions) + repeats, repeats)
        expect = min(target, stored + len(batch))  # the commit stores no more
        if expect < target and not verifying:  # under VERIFY the blind solve comes first
            calls.size(claim.exam)
            calls.prepare(claim.view(expect, target))
        try:
            committed = store.commit_batch(claim, settings.lease_s, call_id,
                                           batch, model=completion.model,
                                           note=note, usage=usage, plan_next=calls.plan,
                                           near_dup=near_dup_checker(settings),
                                           steer=steer_of(settings), verify=verifying)
        except BaseException:
            calls.discard()
            raise
        if committed.cancelled:
            calls.discard()
            log.info("slice cancelled; the call in flight was kept", extra={
                "exam": claim.exam, "chapter": claim.chapter_id, "slice": claim.slice_no,
                "stored": committed.stored, "target": committed.target})
            return False
        # The target may have been raised by an enqueue while this slice ran.
        stored, target = committed.stored, committed.target
        planned = committed.next_call
        if committed.recent:
            # What every slice of the chapter stored, this batch included.
            calls.steering, calls.fresh = committed.recent, []
        if committed.near_duplicates:
            log.info("near-duplicates rejected", extra={
                "exam": claim.exam, "chapter": claim.chapter_id, "slice": claim.slice_no,
                "near_duplicates": committed.near_duplicates})
        for text in committed.kept:
            known.add(normalise(text))
        calls.seen(0, committed.duplicates)
        calls.not_kept(batch, committed.kept)
        if not committed.kept:
            # Every question was one another slice had just stored: re-asked like any
            # invalid output (the call is booked as wasted).
            invalid_in_row += 1
            log.warning("every question already stored by another slice", extra={
                "exam": claim.exam, "chapter": claim.chapter_id, "slice": claim.slice_no})
            if invalid_in_row > settings.max_reasks:
                raise OutputInvalid(Rejection.duplicate,
                                    "every question was one the chapter already had")
            continue
        invalid_in_row = 0
        run.committed += len(committed.kept)
        if verifying:
            test_hook("after_commit")
            judged = solve()
            if judged is None or judged.cancelled:
                return False
            stored, target = judged.stored, judged.target
            if judged.done:
                return True
        if log.isEnabledFor(logging.INFO):
            log.info("batch committed", extra={
                "exam": claim.exam, "chapter": claim.chapter_id, "slice": claim.slice_no,
                "attempt": claim.attempt,
                "stored": stored, "target": target, "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens, "cost_usd": usage.cost_usd})
    return True


def _call(rt: Runtime, call_id: int, messages: list[dict[str, str]], max_tokens: int,
          admission: Admission, client: LLMClient | None = None) -> Completion:
    try:
        return (client or rt.client).complete(messages, max_tokens=max_tokens,
                                              admission=admission)
    except ProviderError as exc:
        billed = exc.billed
        if billed is not None:
            # The provider billed it, or may have: a reply read but unusable, at its usage
            # (invalid output); or one sent and never received whole (a deadline, a body cut
            # off, a body too large), at its worst case, our count of its prompt and all of
            # max_tokens, marked estimated. Never at $0; settled like any call (the budget).
            reason = CallReason.invalid_output if isinstance(exc, ReplyUnusable) else exc.kind
            rt.store.finish_call(call_id, CallOutcome.wasted, reason, str(exc),
                                 status_code=exc.status_code,
                                 usage=Usage(billed.prompt_tokens, billed.completion_tokens,
                                             billed.cost_usd, exc.endpoint, billed.estimated,
                                             billed.cached_tokens, billed.service_tier))
        else:
            rt.store.finish_call(call_id, CallOutcome.failed, exc.kind, str(exc),
                                 status_code=exc.status_code,
                                 usage=Usage(endpoint=exc.endpoint))
        raise
    except BaseException as exc:
        rt.store.finish_call(call_id, CallOutcome.failed, CallReason.unexpected,
                             f"{type(exc).__name__}: {exc}")
        raise
