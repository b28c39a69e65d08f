"""The ledger of paid calls: each is recorded (and its worst case reserved against the exam's
budget) before it is sent, and settled with its real usage when it ends. A batch of questions
is committed together with its call's usage, only while the lease is held (fencing)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from typing import Any, Sequence

from sqlalchemy import and_, bindparam, case, func, insert, literal, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from examforge.balance import balanced
from examforge.errors import LeaseLost, PauseCode, Rejection
from examforge.neardup import Checker, Scope
from examforge.output import Question as ParsedQuestion
from examforge.output import text_hash
from storage import fastpath, neardup
from storage.base import (BUDGET_SPENT_REASON, IN_FLIGHT_CALL, SLICE_KEY, E, K, Q, S, StoreBase,
                          lease_fence)
from storage.db import READ_ONLY
from storage.models import CallOutcome, CallReason, ChapterState, ExamState, Verdict
from storage.types import (CallPlan, ChapterView, Claimed, Committed, NoRoom, Planner, SendCheck,
                           Steer, Usage)

# What a prompt shows of the questions a chapter already has when no steering is asked for
# (see examforge.prompt and storage.neardup.steering).
RECENT_QUESTIONS = 20
# What ending a call sets (Ledger._finish).
_FINISHED = ("outcome", "reason", "detail", "status_code", "questions_stored", "prompt_tokens",
             "completion_tokens", "cost_usd", "endpoint", "usage_estimated", "cached_tokens",
             "service_tier")
# Why a call whose holder lost its lease mid-call was booked at its worst case.
CRASH_DETAIL = "its holder lost the lease mid-call (a crash, a freeze, a partition)"
# A commit that loses a race with another slice storing the same question checks again.
_DUPLICATE_RACE_RETRIES = 3
# Why a settled call paused its exam (Ledger._settle): a raised budget resumes it.


def once(plan_next: Planner | None) -> Planner | None:
    """`plan_next` asked at most once: the same plan again for the state it was made for,
    none for another (a plan taken twice would be admitted twice)."""
    if plan_next is None:
        return None
    made: list[tuple[tuple[int, int], CallPlan | None]] = []

    def planner(view: ChapterView) -> CallPlan | None:
        if not made:
            made.append(((view.stored, view.target), plan_next(view)))
        when, plan = made[0]
        return plan if (view.stored, view.target) == when else None
    return planner


def question_row(q: ParsedQuestion, prefix: str = "") -> dict[str, Any]:
    """The columns of a question row that come from the question itself (their names after
    `prefix`)."""
    return {f"{prefix}question": q.question,
            f"{prefix}choices": json.dumps(list(q.choices), ensure_ascii=False),
            f"{prefix}answer_index": q.answer_index, f"{prefix}explanation": q.explanation,
            f"{prefix}difficulty": q.difficulty, f"{prefix}bloom": q.bloom,
            f"{prefix}source": q.source if q.passage is not None else None,
            f"{prefix}passage": q.passage, f"{prefix}type": q.type,
            f"{prefix}answer": q.answer}


# The columns a commit writes of each question (the rest: their defaults).
_QUESTION_COLUMNS = ("exam", "chapter_id", "number", "norm_hash", "model", "call_id",
                     "created_at", "verdict", "question", "choices", "answer_index",
                     "explanation", "difficulty", "bloom", "source", "passage", "type",
                     "answer")


def _insert_questions() -> Any:
    """A commit's insert of one question, its values bound as `q_<column>`."""
    return insert(Q).values({c: bindparam(f"q_{c}") for c in _QUESTION_COLUMNS})


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """What a general-path commit computes before its transaction, outside the write lock
    (SQLite's one writer, which a group commit's members wait behind), on assumptions the
    transaction checks, computing again what they got wrong: each question's columns at the
    number it takes if the slice's range has no gap and nothing is dropped (`rows`, by the
    question's place in the reply and its number: the balanced order of its choices depends
    on both), and the near-duplicate check against the process's index of the scope as it
    stands (`local`: the verdict and the highest id the index held, good while the
    transaction finds no question of the scope above it)."""

    rows: dict[tuple[int, int], dict[str, Any]]
    local: tuple[neardup.Verdict, int] | None = None


@dataclasses.dataclass(frozen=True)
class _After:
    """What a general-path commit leaves for after its transaction, outside the write lock
    (SQLite's one writer, which a group commit's members wait behind): its questions added
    to the process's near-duplicate index of the scope (`own`: the scope, the index's epoch
    and highest id as its check saw them, the new ids and their signatures), and the
    stored questions the next prompts list, read then (`recent`). Returned with the commit's
    result, so only a transaction that committed leaves it (a group's rolled-back attempt
    leaves nothing)."""

    own: tuple[Scope, int | None, int, list[int], list[neardup.Signed]] | None = None
    recent: bool = False


class Ledger(StoreBase):
    """Calls: started, finished, committed with their batch; budgets reserved and settled."""

    @staticmethod
    def _crashed_values(now: Any) -> dict[str, Any]:
        """What settling a call whose holder lost its lease sets: its worst case (its prompt
        and its max_tokens, which is what it reserved), estimated."""
        return dict(outcome=CallOutcome.wasted.value, finished_at=now,
                    reason=CallReason.crash_before_commit.value,
                    detail=CRASH_DETAIL,
                    completion_tokens=func.coalesce(K.c.max_tokens, 0),
                    cost_usd=K.c.reserved_usd, usage_estimated=True)

    def _holder_live(self) -> Any:
        """Whether a call's own holder still holds its slice's live lease (correlated with the
        call row). A slice cancelled while its holder is in a call keeps that lease
        (Planning.cancel); a regenerated chapter's slices are gone, so its calls have none."""
        return select(S.c.exam).where(
            S.c.exam == K.c.exam, S.c.chapter_id == K.c.chapter_id,
            S.c.slice_no == K.c.slice_no,
            lease_fence(self._now, owner=S.c.lease_owner == K.c.worker, states=None)).exists()

    def _holder_busy(self) -> Any:
        """Whether a call's own holder is inside a transaction on its slice row right now
        (PostgreSQL: the row is its holder's and locked; correlated with the call row).

        A holder's commit locks its slice row with the fence and holds it until it commits.
        If that commit then waits (behind another commit of the exam that a frozen or
        descheduled worker holds open), the lease's timestamp can pass while the holder is
        alive and its fenced commit still valid: nobody can take the row from it before it
        ends. Such a call is not an orphan, and settling it would book a reply that is about
        to be stored as a crash. SKIP LOCKED tells a locked row without waiting for it; an
        unlocked one stays locked by the sweep until its transaction ends, so the holder
        cannot start a commit in between. SQLite has one writer at a time: no holder is
        ever mid-transaction while the sweep writes."""
        if self.engine.dialect.name != "postgresql":
            return None
        mine = (S.c.exam == K.c.exam, S.c.chapter_id == K.c.chapter_id,
                S.c.slice_no == K.c.slice_no, S.c.lease_owner == K.c.worker)
        return and_(select(S.c.exam).where(*mine).exists(),
                    ~select(S.c.exam).where(*mine).with_for_update(skip_locked=True).exists())

    def _settle_orphans(self, conn: Connection, slug: str,
                        chapter_ids: Sequence[str] | None = None) -> int:
        """Settle every call of the exam (of `chapter_ids`, or all) still in flight whose own
        holder has no live lease, whatever its slice's state now (pending, done, trimmed,
        cancelled, failed, or deleted by --regenerate): nobody will ever commit its reply. It
        is booked at its worst case, marked estimated, and its reservation moved to spent
        (`_settle`), in the caller's transaction, which must hold the exam row first
        (`_exam_first`; the planning commands hold it already). A call under a live lease is
        left to its holder, which settles it when its reply comes back. A holder that was
        only frozen and comes back later re-books its call at its real usage (`_finish`)."""
        where = [K.c.exam == slug, IN_FLIGHT_CALL, ~self._holder_live()]
        busy = self._holder_busy()
        if busy is not None:
            where.append(~busy)
        if chapter_ids is not None:
            if not chapter_ids:
                return 0
            where.append(K.c.chapter_id.in_(list(chapter_ids)))
        rows = conn.execute(update(K).where(*where).values(**self._crashed_values(self._now))
                            .returning(K.c.reserved_usd)).scalars().all()
        if rows:
            self._settle(conn, slug, reserved_usd=sum(rows), cost_usd=sum(rows))
        return len(rows)

    def _waste_orphaned_calls(self, conn: Connection, slug: str, chapter_id: str,
                              slice_no: int, budgeted: bool | None = None) -> int:
        """Calls still in flight when nobody holds the lease belong to a holder whose lease
        expired (a crash, a freeze, a partition): their output can no longer be committed.
        Their reply never came back, so each is booked at its worst case (its prompt and its
        max_tokens: the provider may have generated and billed all of it), marked estimated,
        and its reservation settled. `budgeted`: whether the exam has a budget, when the
        caller read it in this transaction already (None: read it here)."""
        rows = self._run(conn, "waste_orphans", lambda: (
            update(K).where(K.c.exam == bindparam("k_exam"),
                            K.c.chapter_id == bindparam("k_chapter"),
                            K.c.slice_no == bindparam("k_slice"),
                            IN_FLIGHT_CALL)
            .values(**self._crashed_values(self._now))
            .returning(K.c.reserved_usd)),
            {"k_exam": slug, "k_chapter": chapter_id, "k_slice": slice_no}).scalars().all()
        if rows:
            self._settle(conn, slug, reserved_usd=sum(rows), cost_usd=sum(rows),
                         budgeted=budgeted)
        return len(rows)

    def _budgeted(self, conn: Connection, slug: str) -> bool:
        """Whether the exam has a budget. On PostgreSQL this holds the exam row FOR KEY SHARE
        until the transaction ends: starting and settling calls never wait for each other on
        it, while setting a budget (FOR UPDATE) waits for all of them, so the totals it
        computes from the ledger miss no call. An exam without a budget keeps no running
        totals, so its workers never queue on its row."""
        def build() -> Any:
            query = select(E.c.budget_usd).where(E.c.slug == bindparam("k_exam"))
            if self.engine.dialect.name == "postgresql":
                query = query.with_for_update(read=True, key_share=True)  # FOR KEY SHARE
            return query

        return self._run(conn, "budgeted", build,
                            {"k_exam": slug}).scalar_one_or_none() is not None

    def _exam_first(self, conn: Connection, slug: str) -> None:
        """Lock order for transactions that may change a budgeted exam's totals: the exam row
        first, then the chapter's. Workers of a budgeted exam queue on its row (the budget
        check and the reservation must be one atomic step); taken first, that queue holds no
        chapter row, so the heartbeat's renewal never waits behind it."""
        if self.engine.dialect.name == "postgresql" and self._budgeted(conn, slug):
            conn.execute(select(E.c.slug).where(E.c.slug == slug)
                         .with_for_update(key_share=True))  # FOR NO KEY UPDATE

    def _settle(self, conn: Connection, slug: str, *, reserved_usd: float,
                cost_usd: float, budgeted: bool | None = None) -> None:
        """Move calls from reserved to spent on a budgeted exam's running totals. When that
        takes spent to or past the budget (a reply that reported more than its reservation:
        a provider whose tokenizer counts the prompt higher than ours, one that ignores
        max_tokens), the same statement pauses the exam with a reason naming the budget, so
        that no further call is reserved (the reservation's check fails too) and nothing is
        sent until a person raises the budget. `budgeted`: whether the exam has a budget,
        when the caller read it in this transaction already (None: read it here)."""
        if self._budgeted(conn, slug) if budgeted is None else budgeted:
            self._run(conn, "settle", self._settle_stmt,
                         {"k_exam": slug, "p_reserved": reserved_usd, "p_cost": cost_usd})

    @staticmethod
    def _settle_stmt() -> Any:
        # Every SET sees the row as it was: `over` reads the old state and spent.
        over = and_(E.c.state == ExamState.active.value,
                    E.c.spent_usd + bindparam("p_cost") >= E.c.budget_usd - 1e-12)
        return update(E).where(E.c.slug == bindparam("k_exam")).values(
            reserved_usd=E.c.reserved_usd - bindparam("p_reserved"),
            spent_usd=E.c.spent_usd + bindparam("p_cost"),
            state=case((over, ExamState.paused.value), else_=E.c.state),
            pause_reason=case((over, literal(BUDGET_SPENT_REASON)), else_=E.c.pause_reason),
            pause_code=case((over, literal(PauseCode.budget.value)), else_=E.c.pause_code))

    def start_call(self, claim: Claimed, first_number: int, requested: int, *,
                   lease_s: float, prompt_tokens: int = 0,
                   max_tokens: int | None = None, reserve_usd: float = 0.0,
                   model: str | None = None, price_known: bool = True,
                   kind: str | None = None) -> int | NoRoom:
        """Record a call before it is sent, in a transaction of its own, only while the lease
        is held (the same fence as the commit: a holder frozen past its lease between two
        calls must not send one more); raises LeaseLost. The usual path records calls in the
        claim's and the commits' own transactions instead (`plan_first`, `plan_next`): this is
        for a call that had to wait for the rate limiter, or to shrink to fit the budget."""
        def start(conn: Connection) -> int | NoRoom:
            self._exam_first(conn, claim.exam)
            held = self._run(conn, "start_call_fence", lambda: (
                update(S).where(*SLICE_KEY, lease_fence(self._now, states=(ChapterState.running.value,)))
                .values(lease_expires_at=self._now + bindparam("p_lease"))),
                {**claim.fence_params(), "p_lease": lease_s}).rowcount
            if held != 1:
                raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost before a call")
            started = self._start_planned(conn, claim, CallPlan(
                first_number, requested, prompt_tokens, max_tokens, reserve_usd, model,
                price_known, kind))
            assert started is not None
            return started
        return self.group.run((claim.exam, claim.chapter_id, claim.slice_no), start,
                              kind="call")

    def _start_planned(self, conn: Connection, claim: Claimed,
                       plan: CallPlan | None, budgeted: bool | None = None
                       ) -> int | NoRoom | None:
        """Record `plan` and reserve its worst case against the exam's budget, in the caller's
        transaction (which holds the lease). The budget check and the reservation are one
        conditional UPDATE of the exam row, so any number of workers can never reserve past
        the budget together. Returns the call's id, NoRoom (nothing recorded) when the worst
        case does not fit, or None when nothing was planned. `budgeted`: as `_settle`."""
        if plan is None:
            return None

        def reserve() -> bool:
            return conn.execute(update(E).where(
                E.c.slug == claim.exam,
                E.c.spent_usd + E.c.reserved_usd + plan.reserve_usd <= E.c.budget_usd + 1e-12)
                .values(reserved_usd=E.c.reserved_usd + plan.reserve_usd)).rowcount == 1

        if budgeted is None:
            budgeted = self._budgeted(conn, claim.exam)
        fits = not budgeted or reserve()
        if not fits and self._settle_orphans(conn, claim.exam):
            # Dead holders' calls held part of the room: settled at their worst case (which
            # is what they held), so try once more; usually still no room, but now no
            # reservation without a live holder is left to wait for.
            fits = reserve()
        if not fits:
            exam = conn.execute(select(E.c.budget_usd, E.c.spent_usd, E.c.reserved_usd)
                                .where(E.c.slug == claim.exam)).one()
            in_flight = conn.execute(select(func.count()).select_from(K).where(
                K.c.exam == claim.exam,
                IN_FLIGHT_CALL)).scalar_one()
            return NoRoom(exam.budget_usd, exam.spent_usd, exam.reserved_usd, plan.reserve_usd,
                          in_flight)
        names = ("exam", "chapter_id", "slice_no", "attempt", "first_number", "requested",
                 "worker", "prompt_tokens", "max_tokens", "reserved_usd", "model",
                 "price_known", "kind")
        return self._run(conn, "start_call", lambda: (
            insert(K).values(outcome=CallOutcome.in_flight.value, started_at=self._now,
                             **{n: bindparam(f"p_{n}") for n in names})
            .returning(K.c.id)), {
                "p_exam": claim.exam, "p_chapter_id": claim.chapter_id,
                "p_slice_no": claim.slice_no, "p_attempt": claim.attempt,
                "p_first_number": plan.first_number, "p_requested": plan.requested,
                "p_worker": claim.owner, "p_prompt_tokens": plan.prompt_tokens,
                "p_max_tokens": plan.max_tokens, "p_reserved_usd": plan.reserve_usd,
                "p_model": plan.model, "p_price_known": plan.price_known,
                "p_kind": plan.kind}).scalar_one()

    def _finish(self, conn: Connection, call_id: int, values: dict[str, Any],
                usage: Usage, budgeted: bool | None = None) -> bool:
        """End an in-flight call with `values` and its usage, settling its reservation; False
        (nothing changed) when it had already ended (the takeover settled it first).
        `budgeted`: as `_settle`."""
        booked = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "cost_usd": usage.cost_usd, "endpoint": usage.endpoint,
                  "usage_estimated": usage.estimated, "cached_tokens": usage.cached_tokens,
                  "service_tier": usage.service_tier}
        # Every column an ending sets, in one statement built once: a column `values` leaves
        # out keeps the default an in-flight row has (no status code, nothing stored).
        params = {"p_status_code": None, "p_questions_stored": 0, "p_detail": None,
                  "p_reason": None, **{f"p_{k}": v for k, v in {**values, **booked}.items()},
                  "k_id": call_id}
        row = self._run(conn, "finish_call", lambda: (
            update(K).where(K.c.id == bindparam("k_id"),
                            IN_FLIGHT_CALL)
            .values(finished_at=self._now, **{n: bindparam(f"p_{n}") for n in _FINISHED})
            .returning(K.c.exam, K.c.reserved_usd)), params).one_or_none()
        if row is not None:
            self._settle(conn, row.exam, reserved_usd=row.reserved_usd, cost_usd=usage.cost_usd,
                         budgeted=budgeted)
            return True
        if not usage.estimated and values.get("outcome") in (CallOutcome.wasted.value,
                                                             CallOutcome.failed.value):
            # A holder that lost its lease mid-call (frozen, partitioned) came back: the
            # takeover booked the call at its worst case, and what really happened (the real
            # usage of its reply, or that it was never sent) and why are now known. Book
            # those instead.
            old = conn.execute(select(K.c.exam, K.c.cost_usd).where(
                K.c.id == call_id, K.c.outcome == CallOutcome.wasted.value,
                K.c.usage_estimated.is_(True)).with_for_update()).one_or_none()
            if old is not None:
                conn.execute(update(K).where(K.c.id == call_id).values(**values, **booked))
                self._settle(conn, old.exam, reserved_usd=0.0,
                             cost_usd=usage.cost_usd - old.cost_usd)
        return False

    def finish_call(self, call_id: int, outcome: CallOutcome, reason: str, detail: str = "",
                    *, status_code: int | None = None, usage: Usage = Usage()) -> None:
        """Record how a call that stored nothing ended: failed or wasted, with its reason (a
        CallReason or an ErrorKind) and the text that explains it."""
        def finish(conn: Connection) -> None:
            # The exam row before the call's (lock order, `_exam_first`): a sweep of dead
            # calls (`_settle_orphans`) holds it and then updates call rows.
            exam = conn.execute(select(K.c.exam).where(K.c.id == call_id)).scalar_one_or_none()
            if exam is not None:
                self._exam_first(conn, exam)
            self._finish(conn, call_id, {"outcome": outcome.value, "reason": getattr(reason, "value", reason),
                                         "detail": detail[:1000] or None,
                                         "status_code": status_code}, usage)
        self.group.run(("", "", call_id), finish, kind="finish")

    def may_send(self, claim: Claimed, call_id: int) -> SendCheck:
        """The last step before a recorded call is sent: whether its slice is still `running`
        under this lease, in one read of the slice row (no write, no lock: the cheapest check
        that orders every send against a cancel). A cancel or a takeover that committed
        before this read wins: the call is booked as never sent ($0, reservation released,
        `not_sent`) and nothing goes to the provider. One that commits after it finds the
        call already on its way, as if it had been sent a moment earlier; it settles when
        its reply comes back, like any call in flight at a cancel. This costs one short read
        per paid call; folding it into the transaction that records the call (the commit)
        would not do, since a cancel can commit between that and the send."""
        # One statement needs no snapshot: on PostgreSQL it runs in autocommit (one round
        # trip: no BEGIN before it, no ROLLBACK after); on SQLite a deferred read that never
        # waits for the writer's lock.
        def build() -> Any:
            return select(S.c.state).where(*SLICE_KEY, lease_fence(self._now, states=None))

        if self.engine.dialect.name == "postgresql":
            state = self._auto(self.engine, *self._pg_text("may_send", build,
                                                           claim.fence_params())
                               ).scalar_one_or_none()
        else:
            with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn:
                state = self._run(conn, "may_send", build,
                                  claim.fence_params()).scalar_one_or_none()
        if state == ChapterState.running.value:
            return SendCheck.send
        return self.not_sent(claim, call_id)

    def not_sent(self, claim: Claimed, call_id: int) -> SendCheck:
        """Book a recorded call that will not be sent (its slice was cancelled, or the lease
        lost, before it left): failed, $0, its reservation released. A cancelled slice whose
        lease this holder kept for the call is let go. Returns why."""
        with self._write() as conn:
            self._exam_first(conn, claim.exam)
            cancelled = conn.execute(update(S).where(
                *claim.where(), S.c.lease_owner == claim.owner,
                S.c.state == ChapterState.cancelled.value)
                .values(lease_owner=None, lease_expires_at=None, updated_at=self._now)
            ).rowcount == 1
            why = ("the slice was cancelled" if cancelled
                   else "the lease was lost (expired or taken)")
            self._finish(conn, call_id, {
                "outcome": CallOutcome.failed.value, "reason": CallReason.lease_lost.value,
                "detail": f"not sent: {why} after the call was recorded"}, Usage())
        return SendCheck.cancelled if cancelled else SendCheck.lost

    _group_sql = fastpath.COMMIT_SQL

    def _group_aborted(self) -> None:
        # A member may have read another's uncommitted questions into the scope's index.
        neardup.INDEXES.clear()

    def commit_batch(self, claim: Claimed, lease_s: float, call_id: int,
                     questions: Sequence[ParsedQuestion], *, model: str, usage: Usage,
                     note: str = "", plan_next: Planner | None = None,
                     near_dup: Checker | None = None, steer: Steer | None = None,
                     verify: bool = False) -> Committed:
        """Store one call's questions and its usage atomically, only while holding the lease.

        The questions take the lowest numbers of the slice's range that no question holds, as
        read inside the transaction (the lease holder is the only writer of its range; a
        withdrawn question's number is free again, see `Store.withdraw`). With `verify`,
        they are stored with the verdict `pending`, awaiting their blind solve. A question whose normalised text the chapter already has, stored by
        another of its slices since this one's claim, is dropped (UNIQUE(exam, chapter_id,
        norm_hash) makes storing it twice impossible whichever slices race); a batch left with
        none stores nothing and its call is booked as wasted (invalid output).

        With `near_dup`, a question that is a near-duplicate of one the scope (chapter or
        exam) has, or of an earlier one of the batch, is dropped the same way, and counted in
        the call's detail; the check and the insert are atomic for the scope (storage.neardup).
        With `steer`, the result carries what the next prompts list (`recent`).

        Returns the slice's stored count and its target as they are now (the target may have
        been raised by an `enqueue` while it ran). Raises LeaseLost (after recording the call
        as wasted) when the lease is gone: the result is discarded, never mixed in. Any other
        database failure records the call as wasted too, with its tokens, and re-raises.
        """
        fast = self._fast_commit and not verify
        # A PostgreSQL group may wait (GROUP_COMMIT_WAIT_MS) for commits being prepared: its
        # one-statement commits go in one pipeline, each one more saves a round trip. The
        # general path does not announce its commits: on SQLite a commit costs little more
        # than its own statements (WAL, no sync at COMMIT), and a leader waiting for more
        # measured slower than taking who queued.
        with self.fast_group.coming() if fast else contextlib.nullcontext():
            hashes = [text_hash(q.question) for q in questions]
            # Outside the transaction: the signatures cost CPU, not locks.
            signed = (neardup.Signed.many([q.question for q in questions], claim.title,
                                          claim.language)
                      if near_dup is not None else None)
            # VERIFY's commits (questions pending a solve, no next call) take the general
            # path.
            if fast:
                done, plan_next = self._commit_fast(claim, lease_s, call_id, questions,
                                                    hashes, model=model, usage=usage,
                                                    note=note, plan_next=plan_next,
                                                    near_dup=near_dup, signed=signed,
                                                    steer=steer)
                if done is not None:
                    return done
            # Also outside: the rows' question columns at the numbers they will most likely
            # take, and the near-duplicate check against the process's index as it stands
            # (the transaction uses both when the chapter is where they assumed it).
            ahead = self._ahead(claim, questions, near_dup, signed)
        # A group commit (storage.group) may run this commit again after a rollback: the
        # planner is asked once (asking admits the next call at the rate limiter).
        plan_next = once(plan_next)
        key = (claim.exam, claim.chapter_id, claim.slice_no)
        try:
            for attempt in range(_DUPLICATE_RACE_RETRIES + 1):
                try:
                    result, after = self.group.run(key, functools.partial(
                        self._commit, claim=claim, lease_s=lease_s, call_id=call_id,
                        questions=questions, hashes=hashes, model=model, usage=usage,
                        note=note, plan_next=plan_next, recheck=attempt > 0,
                        near_dup=near_dup, signed=signed, steer=steer, verify=verify,
                        ahead=ahead), kind="commit")
                    self._expect(claim.owner, result)
                    return self._after(claim, result, after, steer, call_id)
                except IntegrityError as exc:
                    # Another slice committed one of these questions after our check read
                    # the chapter (PostgreSQL: its transaction was open): check again.
                    if "norm_hash" not in str(exc) and "uq_question_text" not in str(exc):
                        raise
                    if attempt == _DUPLICATE_RACE_RETRIES:
                        raise
            raise AssertionError("unreachable")
        except (LeaseLost, IntegrityError) as exc:
            detail = ("the lease expired or was taken before the commit" if
                      isinstance(exc, LeaseLost) else "duplicate question number")
            self.finish_call(call_id, CallOutcome.wasted, CallReason.lease_lost, detail,
                             usage=usage)
            raise LeaseLost(str(exc).splitlines()[0]) from None
        except SQLAlchemyError as exc:
            self._book_commit_failed(call_id, exc, usage)
            raise

    def _ahead(self, claim: Claimed, questions: Sequence[ParsedQuestion],
               near_dup: Checker | None, signed: Sequence[neardup.Signed] | None) -> _Ahead:
        """What a general-path commit can compute before its transaction (`_Ahead`)."""
        stored, _ = self._expected.get(claim.owner, (claim.stored, claim.target))
        first = claim.first_number + stored
        rows = {(j, first + j): question_row(balanced(q, claim.exam, claim.chapter_id,
                                                      first + j), "q_")
                for j, q in enumerate(questions)}
        local = None
        if near_dup is not None and signed is not None:
            local = neardup.check_local(str(self.engine.url), claim.exam, claim.chapter_id,
                                        near_dup, claim.index_epoch, list(signed))
        return _Ahead(rows, local)

    def _after(self, claim: Claimed, result: Committed, after: _After, steer: Steer | None,
               call_id: int) -> Committed:
        """A general-path commit's work left for after it (`_After`)."""
        if after.own is not None:
            scope, epoch, max_id, ids, signed = after.own
            neardup.add_own(str(self.engine.url), claim.exam, claim.chapter_id, scope, epoch,
                            max_id, ids, signed, ())
        if not after.recent:
            return result
        try:
            with self._read() as conn:
                recent = self._recent(conn, claim, steer, call_id)
        except SQLAlchemyError:
            # The questions are stored: the next prompts keep the list they had, with the
            # batch just received (runner.pipeline's `fresh`).
            return result
        return dataclasses.replace(result, recent=recent)

    @staticmethod
    def _recent(conn: Connection, claim: Claimed, steer: Steer | None,
                call_id: int) -> tuple[str, ...]:
        """The chapter's stored questions the next prompts list: as `steer` asks, or, with
        other slices writing the chapter too, its newest."""
        return neardup.steered(conn, steer or Steer(RECENT_QUESTIONS, "recent"), claim.exam,
                               claim.chapter_id, claim.chapter_target, seed=call_id)

    def _book_commit_failed(self, call_id: int, exc: SQLAlchemyError, usage: Usage) -> None:
        """The reply (and its bill) arrived but the database failed its commit: say so with
        its tokens, so the takeover does not book it as a crash with none."""
        try:
            self.finish_call(call_id, CallOutcome.wasted, CallReason.commit_failed,
                             str(exc).splitlines()[0][:300], usage=usage)
        except SQLAlchemyError:
            pass  # still down: the takeover will mark it wasted

    def _free_numbers(self, conn: Connection, exam: str, chapter_id: str, first: int,
                      target: int) -> list[int]:
        """The numbers of the range `first`..`first + target - 1` no question holds, lowest
        first: the range's count is `target` minus these. A withdrawn question holds none
        (its number is NULL), so its number is the first a replacement takes."""
        taken = set(self._run(conn, "slice_numbers", lambda: (
            select(Q.c.number).where(
                Q.c.exam == bindparam("k_exam"), Q.c.chapter_id == bindparam("k_chapter"),
                Q.c.number >= bindparam("k_first"),
                Q.c.number < bindparam("k_first") + bindparam("k_target"))),
            {"k_exam": exam, "k_chapter": chapter_id, "k_first": first,
             "k_target": target}).scalars())
        return [n for n in range(first, first + target) if n not in taken]

    def _commit_fast(self, claim: Claimed, lease_s: float, call_id: int,
                     questions: Sequence[ParsedQuestion], hashes: list[str], *, model: str,
                     usage: Usage, note: str, plan_next: Planner | None,
                     near_dup: Checker | None, signed: Sequence[neardup.Signed] | None,
                     steer: Steer | None) -> tuple[Committed | None, Planner | None]:
        """The commit in one round trip (PostgreSQL, storage.fastpath): the
        result, or None and the planner the general path must use (the plan already taken,
        offered again for the state it was made for: taking it twice would admit the call
        twice)."""
        stored, target = self._expected.get(claim.owner, (claim.stored, claim.target))
        url = str(self.engine.url)
        prepared = fastpath.prepare(
            url, claim, stored, target, lease_s, call_id, questions, hashes, model=model,
            usage=usage, note=note, plan_next=plan_next, near_dup=near_dup, signed=signed,
            steer=steer, recent_default=RECENT_QUESTIONS)
        if prepared is None:
            return None, plan_next
        if prepared.plan is not None or prepared.params["p_plan_stored"] < target:
            # The planner was asked (or would have been): the general path gets that answer.
            plan, when = prepared.plan, (prepared.params["p_plan_stored"], target)

            def plan_next(view: ChapterView) -> CallPlan | None:
                return plan if (view.stored, view.target) == when else None
        params = prepared.params
        try:
            row = self.fast_group.run(
                (claim.exam, claim.chapter_id, claim.slice_no),
                lambda _: self._auto(self.engine, fastpath.COMMIT_SQL, params).one(), params,
                kind="commit")
        except IntegrityError:
            return None, plan_next  # a duplicate stored meanwhile: the general path checks
        except SQLAlchemyError as exc:
            self._book_commit_failed(call_id, exc, usage)
            raise
        if row.status != "ok":
            return None, plan_next
        result = fastpath.committed(url, claim, prepared, row, len(questions), steer, call_id)
        self._expect(claim.owner, result)
        return result, plan_next

    def _expect(self, owner: str, result: Committed) -> None:
        """Remember where a holder's slice stands after its commit (the fast path numbers on
        from it); forgotten once the slice needs no more."""
        if result.done or result.cancelled:
            self._expected.pop(owner, None)
            return
        if len(self._expected) > 10_000:
            self._expected.clear()
        self._expected[owner] = (result.stored, result.target)

    def _commit(self, conn: Connection, claim: Claimed, lease_s: float, call_id: int,
                questions: Sequence[ParsedQuestion], hashes: list[str], *, model: str,
                usage: Usage, note: str, plan_next: Planner | None,
                recheck: bool = False, near_dup: Checker | None = None,
                signed: Sequence[neardup.Signed] | None = None,
                steer: Steer | None = None, verify: bool = False,
                ahead: _Ahead | None = None) -> tuple[Committed, _After]:
        self._exam_first(conn, claim.exam)
        # Under VERIFY, each question is stored awaiting its blind solve (runner.verify).
        pending = Verdict.pending.value if verify else None
        key = {"k_exam": claim.exam, "k_chapter": claim.chapter_id, "k_slice": claim.slice_no}
        # The fence: this row is ours only while the lease is. It also locks the row, so the
        # target it returns cannot change before we commit.
        # A slice cancelled while this call was in flight keeps its holder's lease until the
        # reply is committed (the call is paid for either way; see Planning.cancel): its
        # questions are stored, and no next call is planned.
        held = self._run(conn, "fence", lambda: (
            update(S)
            .where(*SLICE_KEY, lease_fence(self._now))
            .values(lease_expires_at=self._now + bindparam("p_lease"), updated_at=self._now)
            .returning(S.c.target, S.c.first_number, S.c.updated_at, S.c.state)),
            {**claim.fence_params(), "p_lease": lease_s}).one_or_none()
        if held is None:
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id}/{claim.slice_no} "
                            "lost before commit")
        target, first, now, state = held
        cancelled = state == ChapterState.cancelled.value
        # SQLite: what the commit needs of the exam row (its budget, its failed logins, its
        # index epoch), read once: no other process writes before this transaction ends (one
        # writer at a time, BEGIN IMMEDIATE), and the other members of a group commit change
        # none of the three (a commit settles spent and reserved, and resets failed logins
        # only to 0). PostgreSQL reads each where it is needed (the budget's read also locks
        # the row: `_budgeted`).
        exam_row = None if self._raw is None else self._run(conn, "commit_exam", lambda: (
            select(E.c.budget_usd, E.c.auth_failures, E.c.index_epoch)
            .where(E.c.slug == bindparam("k_exam"))), key).one_or_none()
        budgeted = None if exam_row is None else exam_row.budget_usd is not None
        shared = claim.chapter_target > claim.target
        if near_dup is not None and (shared or near_dup.scope is Scope.exam):
            # Others commit into the scope too: check and insert as one step (lock order:
            # the exam row, the slice's, then this one).
            neardup.lock(conn, claim.exam, claim.chapter_id, near_dup.scope)
        taken: set[str] = set()
        if hashes and (claim.chapter_target > claim.target or recheck):
            # Other slices write this chapter too (a chapter of one slice has one writer, and
            # its reply was already checked against what it had): what did they store since?
            taken = set(conn.execute(select(Q.c.norm_hash).where(
                Q.c.exam == claim.exam, Q.c.chapter_id == claim.chapter_id,
                Q.c.norm_hash.in_(hashes))).scalars())
        keep = [i for i, h in enumerate(hashes) if h not in taken]
        if len(keep) < len(hashes):
            note = ", ".join(filter(None, [note, f"{len(hashes) - len(keep)} "
                                                 f"{Rejection.duplicate.value} rejected at commit"]))
        near = 0
        slice_done = False
        seen: neardup.Verdict | None = None
        if near_dup is not None and signed is not None and keep:
            verdict = neardup.check(conn, claim.exam, claim.chapter_id, near_dup,
                                    [signed[i] for i in keep],
                                    epoch=neardup.UNREAD if exam_row is None
                                    else exam_row.index_epoch,
                                    local=None if ahead is None or len(keep) < len(hashes)
                                    else ahead.local)
            keep = [i for i, ok in zip(keep, verdict.keep) if ok]
            near = verdict.rejected
            seen = verdict
            neardup.record_repeats(conn, verdict.repeated)
            if near:
                note = ", ".join(filter(None, [note, f"{near} {Rejection.near_duplicate.value} "
                                                     "rejected"]))
        kept = [(questions[i], hashes[i]) for i in keep]
        made = {} if ahead is None else ahead.rows
        free = self._free_numbers(conn, claim.exam, claim.chapter_id, first, target)
        stored = target - len(free)
        # A reply may hold more new questions than the slice lacks: the first ones it needs.
        surplus = max(0, len(kept) - max(0, target - stored))
        if surplus:
            kept, keep = kept[:len(kept) - surplus], keep[:len(keep) - surplus]
            note = ", ".join(filter(None, [note, f"{surplus} beyond the target not stored"]))
        own = None
        if kept:
            # The lowest free numbers of the range: a withdrawn question's number is one.
            rows = [
                {"q_exam": claim.exam, "q_chapter_id": claim.chapter_id,
                 "q_number": n, "q_norm_hash": hashes[i], "q_model": model,
                 "q_call_id": call_id, "q_created_at": now, "q_verdict": pending,
                 **(made.get((i, n)) or question_row(
                     balanced(questions[i], claim.exam, claim.chapter_id, n), "q_"))}
                for n, i in zip(free, keep)]
            self._questions_in_order(conn, claim.exam)
            if signed is None:
                self._run_many(conn, "insert_questions", _insert_questions, rows)
            else:
                # The number second: SQLite's RETURNING of a multi-row INSERT has no order.
                ids = self._run_many(conn, "insert_questions_ids", lambda: _insert_questions()
                                     .returning(Q.c.id, Q.c.number, sort_by_parameter_order=True),
                                     rows, returning=True, key="q_number")
                signed_kept = [signed[i] for i in keep]
                neardup.index(conn, claim.exam, claim.chapter_id, ids, signed_kept)
                if seen is not None and near_dup is not None:
                    own = (near_dup.scope, seen.epoch, seen.max_id, list(ids), signed_kept)
            stored += len(kept)
            if stored >= target and not verify:
                # Progress that completes the slice: it is done in the same statement (see
                # below), and its lease ends.
                slice_done = True
                self._run(conn, "progress_done", lambda: update(S).where(*SLICE_KEY).values(
                    attempts_since_progress=0, last_error_code=None, last_error=None,
                    state=ChapterState.done.value, lease_owner=None, lease_expires_at=None),
                    key)
            else:
                # The lease again from now: this transaction may have waited for the exam's
                # question order or the scope's check (behind another worker's commit), and
                # the row, locked since the fence, is still ours.
                self._run(conn, "progress", lambda: update(S).where(*SLICE_KEY).values(
                    attempts_since_progress=0, last_error_code=None, last_error=None,
                    lease_expires_at=self._now + bindparam("p_lease")),
                    {**key, "p_lease": lease_s})
            values: dict[str, Any] = {"outcome": CallOutcome.used.value, "reason": None,
                                      "detail": note or None, "questions_stored": len(kept)}
        elif surplus:  # the slice needed none of them (its target was lowered meanwhile)
            values = {"outcome": CallOutcome.wasted.value,
                      "reason": CallReason.invalid_output.value, "detail": note}
        else:
            values = {"outcome": CallOutcome.wasted.value,
                      "reason": CallReason.invalid_output.value,
                      "detail": "every question was one the chapter already had (stored by "
                                "another slice)" if not near else
                                f"every question was one the chapter already had ({note})"}
        if not self._finish(conn, call_id, values, usage, budgeted=budgeted):
            # Settled by a takeover in the meantime: the fence above makes that impossible
            # while we hold the lease, so this is a bug, not a race.
            raise LeaseLost(f"call {call_id} was already settled")
        if exam_row is None or exam_row.auth_failures > 0:  # (SQLite: it has none to reset)
            self._run(conn, "auth_reset", lambda: update(E).where(
                E.c.slug == bindparam("k_exam"), E.c.auth_failures > 0).values(auth_failures=0),
                key)
        result = Committed(stored=stored, target=target,
                           duplicates=len(questions) - len(kept) - surplus,
                           recent=(), kept=tuple(q.question for q, _ in kept),
                           near_duplicates=near, surplus=surplus)
        if stored >= target and not verify:
            # Done, even if it was cancelled meanwhile: nothing is missing. Under VERIFY the
            # slice is done once its questions' verdicts are in (Verdicts.commit_verdicts).
            # No next prompt: nothing to read for its list.
            if not slice_done:  # (else with its progress, above)
                self._run(conn, "slice_done", lambda: update(S).where(*SLICE_KEY).values(
                    state=ChapterState.done.value, lease_owner=None, lease_expires_at=None),
                    key)
            # The index keeps this commit's questions only where other slices still check
            # against it: the chapter's other slices, or the exam's other chapters.
            return result, _After(own=own if shared or (near_dup is not None and
                                                        near_dup.scope is Scope.exam)
                                  else None)
        # The next prompts' list is read after the commit, outside the write lock: it shows
        # what the chapter has then, this batch included (with other slices writing it too,
        # what they stored). The next call is prepared before this commit (runner.pipeline),
        # so it is the call after it that lists them.
        after = _After(own=own, recent=(steer is not None or claim.chapter_target > claim.target)
                       and not cancelled)
        if cancelled:
            # Let go, unless the holder has more calls of this slice in flight: a provider
            # batch (runner.batching) may hold several lines of one slice, each paid for,
            # whose replies must still be committed through this lease (the batch runner
            # lets the slice go once all its lines are booked). A synchronous holder has
            # one call in flight at a time: this one.
            others = conn.execute(select(func.count()).select_from(K).where(
                K.c.exam == claim.exam, K.c.chapter_id == claim.chapter_id,
                K.c.slice_no == claim.slice_no, K.c.worker == claim.owner,
                IN_FLIGHT_CALL, K.c.id != call_id)).scalar_one()
            if not others:
                self._run(conn, "slice_let_go", lambda: update(S).where(
                    *SLICE_KEY).values(lease_owner=None, lease_expires_at=None), key)
            return dataclasses.replace(result, cancelled=True), after
        if not kept or verify:
            # Re-asked through the slow path, like any invalid output; under VERIFY the
            # batch's blind solve comes first (runner.verify), then the next call.
            return result, after
        # The next call is recorded in this same transaction: one write per paid call.
        following = None if plan_next is None else self._start_planned(
            conn, claim, plan_next(claim.view(stored, target)), budgeted=budgeted)
        return dataclasses.replace(result, next_call=following), after
