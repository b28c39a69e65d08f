"""The chapter store: every state change of an exam goes through here, in one transaction each.

The rules it enforces:
- a chapter is worked on only by the holder of its lease (owner token + expiry on the database
  clock); claims are conditional UPDATEs, so two workers can never both win;
- a batch of questions is committed only while the lease is still held (fencing): a worker that
  was frozen past its lease changes zero rows and its call is recorded as wasted;
- UNIQUE(exam, chapter_id, number) makes a double commit impossible even if the rest failed;
- every paid call is a row written before the request is sent, so a crash leaves it in_flight
  and the next claim explains it as wasted.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, case, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from examforge.errors import LeaseLost
from examforge.output import Question as ParsedQuestion
from examforge.output import normalise
from examforge.syllabus import Syllabus
from storage.db import READ_ONLY, db_now
from storage.models import Call, CallOutcome, Chapter, ChapterState, Exam, ExamState, Question

E = Exam.__table__  # type: ignore[attr-defined]
C = Chapter.__table__  # type: ignore[attr-defined]
Q = Question.__table__  # type: ignore[attr-defined]
K = Call.__table__  # type: ignore[attr-defined]

ACTIVE_STATES = (ChapterState.pending.value, ChapterState.running.value)
# An exam paused with a reason starting so is resumed by a raised budget.
BUDGET_PAUSE_PREFIX = "budget:"


# ---------------------------------------------------------------- claim results
@dataclass(frozen=True)
class Claimed:
    exam: str
    chapter_id: str
    owner: str
    attempt: int
    target: int
    stored: int
    known: frozenset[str]
    exam_title: str
    title: str
    prompt: str | None
    attempts_since_progress: int = 1
    took_over_calls: int = 0


@dataclass(frozen=True)
class Committed:
    stored: int
    target: int

    @property
    def done(self) -> bool:
        return self.stored >= self.target


@dataclass(frozen=True)
class Usage:
    """What one call consumed, as booked in the ledger."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    endpoint: str | None = None  # "primary" or "fallback"
    estimated: bool = False  # our own count: the provider sent none, or never replied


@dataclass(frozen=True)
class NoRoom:
    """A call's worst case does not fit in what is left of the exam's budget."""

    budget_usd: float
    spent_usd: float
    reserved_usd: float  # by the calls in flight (their real cost may turn out lower)
    needed_usd: float

    @property
    def headroom_usd(self) -> float:
        return max(0.0, self.budget_usd - self.spent_usd - self.reserved_usd)


@dataclass(frozen=True)
class NotClaimed:
    """Why a chapter was not claimed. `retry_in_s` is set when checking back later makes sense."""

    reason: str  # done | failed | cancelled | paused | busy | backoff | missing | cap
    retry_in_s: float | None = None
    detail: str = ""


class RequeueReason(str, Enum):
    """Why the reconciler re-published a chapter."""

    worker_vanished = "worker_vanished"  # a worker took the message, then its lease expired
    broker_epoch_changed = "broker_epoch_changed"  # the broker lost every message it had
    message_lost = "message_lost"  # the queue lost this chapter's message, the epoch survived


@dataclass(frozen=True)
class Orphan:
    exam: str
    chapter_id: str
    reason: RequeueReason


@dataclass(frozen=True)
class LostAudit:
    """What Store.lost_messages found: chapters waiting for a message in the queue's list,
    the messages the list holds, and the chapters to re-publish."""

    waiting: int
    queued: int
    lost: list[tuple[str, str]]


@dataclass
class EnqueuePlan:
    to_enqueue: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # chapter -> why
    exam_paused: str | None = None


class Store:
    """All database access for exams, chapters, questions and calls."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._beat: Engine | None = None
        self._beat_lock = threading.Lock()
        self._now = db_now(engine.dialect.name)
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    def _read(self) -> Connection:
        """A connection for reads that sees one snapshot across all its statements (a report
        must never pair a chapter's new state with its old question count) and blocks no
        writer: REPEATABLE READ on PostgreSQL, a deferred WAL transaction on SQLite."""
        conn = self.engine.connect()
        if self.engine.dialect.name == "postgresql":
            return conn.execution_options(isolation_level="REPEATABLE READ")
        return conn.execution_options(**{READ_ONLY: True})

    # ------------------------------------------------------------ producer side
    def sync_exam(
        self, slug: str, syllabus: Syllabus, regenerate: Iterable[str] = (), *,
        budget_usd: float | None = None, default_budget_usd: float | None = None,
    ) -> EnqueuePlan:
        """Record the exam and its chapters; decide which chapters need a task.

        `budget_usd` sets the exam's budget (a raised one resumes an exam its budget paused);
        a new exam given none gets `default_budget_usd` (BUDGET_USD).

        Safe under concurrent calls: rows are created with INSERT .. ON CONFLICT DO NOTHING and
        changed with conditional UPDATEs.
        """
        regenerate = set(regenerate)
        plan = EnqueuePlan()
        with self.engine.begin() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            conn.execute(
                self._insert(E)
                .values(slug=slug, title=syllabus.title, state=ExamState.active.value,
                        auth_failures=0, created_at=now, updated_at=now,
                        budget_usd=budget_usd if budget_usd is not None else default_budget_usd)
                .on_conflict_do_nothing()
            )
            conn.execute(update(E).where(E.c.slug == slug, E.c.title != syllabus.title)
                         .values(title=syllabus.title, updated_at=now))
            if budget_usd is not None:
                self._set_budget(conn, slug, budget_usd)
            exam = conn.execute(select(E.c.state, E.c.pause_reason).where(E.c.slug == slug)).one()
            if exam.state == ExamState.paused.value:
                plan.exam_paused = exam.pause_reason or "paused"
            for position, ch in enumerate(syllabus.chapters):
                conn.execute(
                    self._insert(C)
                    .values(exam=slug, chapter_id=ch.id, position=position, title=ch.title,
                            prompt=ch.prompt, spec_hash=ch.spec_hash, target=ch.questions,
                            state=ChapterState.pending.value, updated_at=now)
                    .on_conflict_do_nothing()
                )
                row = conn.execute(
                    select(C).where(C.c.exam == slug, C.c.chapter_id == ch.id).with_for_update()
                ).one()
                stored = self._stored(conn, slug, ch.id)
                why = self._plan_chapter(conn, slug, ch, row, stored, ch.id in regenerate, now)
                if why is None and plan.exam_paused is None:
                    plan.to_enqueue.append(ch.id)
                else:
                    plan.skipped[ch.id] = why or f"exam paused: {plan.exam_paused}"
        return plan

    def _plan_chapter(self, conn: Connection, slug: str, ch, row, stored: int,  # type: ignore[no-untyped-def]
                      regenerate: bool, now: float) -> str | None:
        where = and_(C.c.exam == slug, C.c.chapter_id == ch.id)
        changed = row.spec_hash != ch.spec_hash
        if regenerate:
            if row.lease_owner is not None and (row.lease_expires_at or 0) > now:
                return "running: cannot regenerate while a worker holds it; retry later"
            conn.execute(delete(Q).where(Q.c.exam == slug, Q.c.chapter_id == ch.id))
            stored, changed = 0, False
            conn.execute(update(C).where(where).values(
                state=ChapterState.pending.value, attempts_since_progress=0, last_error=None))
        elif changed and stored > 0:
            return (f"changed: title or prompt differs from the {stored} stored questions; "
                    f"rerun with --regenerate {ch.id}")
        values: dict[str, object] = {"position": row.position, "updated_at": now}
        if changed or regenerate:
            values.update(title=ch.title, prompt=ch.prompt, spec_hash=ch.spec_hash)
        values["target"] = ch.questions
        if row.state == ChapterState.cancelled.value:
            conn.execute(update(C).where(where).values(**values))
            return "cancelled"
        if stored >= ch.questions:
            values.update(state=ChapterState.done.value, lease_owner=None, lease_expires_at=None)
            conn.execute(update(C).where(where).values(**values))
            return "done"
        if row.state in (ChapterState.done.value, ChapterState.failed.value):
            # More questions asked for, or a failed chapter enqueued again by the user.
            values.update(state=ChapterState.pending.value, attempts_since_progress=0)
        conn.execute(update(C).where(where).values(**values))
        return None

    def set_budget(self, slug: str, budget_usd: float) -> None:
        """Set the exam's budget; a raised one resumes an exam that its budget paused."""
        with self.engine.begin() as conn:
            self._require_exam(conn, slug)
            self._set_budget(conn, slug, budget_usd)

    def _set_budget(self, conn: Connection, slug: str, budget_usd: float) -> None:
        # FOR UPDATE waits for every call starting or settling (they hold the row in KEY
        # SHARE mode), so the totals computed here from the ledger include all of them.
        conn.execute(select(E.c.slug).where(E.c.slug == slug).with_for_update())
        spent, reserved = conn.execute(
            select(func.coalesce(func.sum(K.c.cost_usd), 0.0),
                   func.coalesce(func.sum(case((K.c.outcome == CallOutcome.in_flight.value,
                                                K.c.reserved_usd), else_=0.0)), 0.0))
            .where(K.c.exam == slug)).one()
        conn.execute(update(E).where(E.c.slug == slug).values(
            budget_usd=budget_usd, spent_usd=spent, reserved_usd=reserved, updated_at=self._now))
        # Paused because the budget ran out, and the new one leaves room: carry on.
        conn.execute(update(E).where(
            E.c.slug == slug, E.c.state == ExamState.paused.value,
            E.c.pause_reason.like(f"{BUDGET_PAUSE_PREFIX}%"),
            E.c.spent_usd + E.c.reserved_usd < budget_usd)
            .values(state=ExamState.active.value, pause_reason=None, updated_at=self._now))

    def mark_enqueued(self, slug: str, chapter_ids: Sequence[str], epoch: str | None,
                      requeue_reason: str | None = None) -> None:
        """Record that a message is about to be published for each chapter. With
        `requeue_reason`, the reconciler is re-publishing them: count it and say why."""
        values: dict[str, Any] = {"enqueued_at": self._now, "enqueue_epoch": epoch}
        if requeue_reason is not None:
            values.update(requeues=C.c.requeues + 1, requeued_at=self._now,
                          requeue_reason=requeue_reason[:500])
        with self.engine.begin() as conn:
            conn.execute(update(C).where(C.c.exam == slug, C.c.chapter_id.in_(chapter_ids))
                         .values(**values))

    def resume(self, slug: str) -> list[str]:
        """Clear a pause and reset failed chapters to pending; returns the chapters to enqueue."""
        with self.engine.begin() as conn:
            self._require_exam(conn, slug)
            conn.execute(update(E).where(E.c.slug == slug).values(
                state=ExamState.active.value, pause_reason=None, auth_failures=0,
                updated_at=self._now))
            conn.execute(update(C).where(C.c.exam == slug, C.c.state == ChapterState.failed.value)
                         .values(state=ChapterState.pending.value, attempts_since_progress=0,
                                 not_before_at=None, updated_at=self._now))
            return list(conn.execute(
                select(C.c.chapter_id).where(C.c.exam == slug, C.c.state.in_(ACTIVE_STATES))
                .order_by(C.c.position)).scalars())

    def cancel(self, slug: str, chapter_ids: Sequence[str] | None = None) -> int:
        """Cancel chapters that are not done; a running holder loses its lease at its next beat."""
        with self.engine.begin() as conn:
            self._require_exam(conn, slug)
            where = [C.c.exam == slug, C.c.state.in_(ACTIVE_STATES + (ChapterState.failed.value,))]
            if chapter_ids:
                where.append(C.c.chapter_id.in_(chapter_ids))
            return conn.execute(update(C).where(*where).values(
                state=ChapterState.cancelled.value, lease_owner=None, lease_expires_at=None,
                updated_at=self._now)).rowcount

    # ------------------------------------------------------------ worker side
    def mark_picked(self, slug: str, chapter_id: str) -> None:
        """A worker received this chapter's message (the reconciler's evidence of delivery)."""
        with self.engine.begin() as conn:
            conn.execute(update(C).where(C.c.exam == slug, C.c.chapter_id == chapter_id)
                         .values(picked_at=self._now))

    def claim(self, slug: str, chapter_id: str, owner: str, lease_s: float,
              max_attempts: int) -> Claimed | NotClaimed:
        """Take the chapter's lease if nobody holds a live one and it still needs work."""
        with self.engine.begin() as conn:
            exam_active = select(E.c.slug).where(
                E.c.slug == slug, E.c.state == ExamState.active.value).exists()
            won = conn.execute(
                update(C)
                .where(
                    C.c.exam == slug, C.c.chapter_id == chapter_id,
                    C.c.state.in_(ACTIVE_STATES),
                    or_(C.c.lease_owner.is_(None), C.c.lease_expires_at <= self._now),
                    or_(C.c.not_before_at.is_(None), C.c.not_before_at <= self._now),
                    C.c.attempts_since_progress < max_attempts,
                    exam_active,
                )
                .values(lease_owner=owner, lease_expires_at=self._now + lease_s,
                        state=ChapterState.running.value, attempts=C.c.attempts + 1,
                        attempts_since_progress=C.c.attempts_since_progress + 1,
                        not_before_at=None, updated_at=self._now)
            ).rowcount
            if won != 1:
                return self._why_not(conn, slug, chapter_id, max_attempts)
            took_over = self._waste_orphaned_calls(conn, slug, chapter_id)
            row = conn.execute(
                select(C, E.c.title.label("exam_title")).join(E, E.c.slug == C.c.exam)
                .where(C.c.exam == slug, C.c.chapter_id == chapter_id)).one()
            texts = conn.execute(select(Q.c.question).where(
                Q.c.exam == slug, Q.c.chapter_id == chapter_id)).scalars().all()
            return Claimed(
                exam=slug, chapter_id=chapter_id, owner=owner, attempt=row.attempts,
                target=row.target, stored=len(texts), known=frozenset(map(normalise, texts)),
                exam_title=row.exam_title, title=row.title, prompt=row.prompt,
                attempts_since_progress=row.attempts_since_progress, took_over_calls=took_over,
            )

    def _waste_orphaned_calls(self, conn: Connection, slug: str, chapter_id: str) -> int:
        """Calls still in flight when nobody holds the lease belong to a holder whose lease
        expired (a crash, a freeze, a partition): their output can no longer be committed.
        Their reply never came back, so each is booked at its worst case (its prompt and its
        max_tokens: the provider may have generated and billed all of it), marked estimated,
        and its reservation settled."""
        rows = conn.execute(
            update(K).where(K.c.exam == slug, K.c.chapter_id == chapter_id,
                            K.c.outcome == CallOutcome.in_flight.value)
            .values(outcome=CallOutcome.wasted.value, finished_at=self._now,
                    reason="crash_before_commit: holder lost its lease mid-call",
                    completion_tokens=func.coalesce(K.c.max_tokens, 0),
                    cost_usd=K.c.reserved_usd, usage_estimated=True)
            .returning(K.c.reserved_usd)).scalars().all()
        if rows:
            self._settle(conn, slug, reserved_usd=sum(rows), cost_usd=sum(rows))
        return len(rows)

    def _budgeted(self, conn: Connection, slug: str) -> bool:
        """Whether the exam has a budget. On PostgreSQL this holds the exam row in KEY SHARE
        mode until the transaction ends: starting and settling calls never wait for each other
        on it, while setting a budget (FOR UPDATE) waits for all of them, so the totals it
        computes from the ledger miss no call. An exam without a budget keeps no running
        totals, so its workers never queue on its row."""
        query = select(E.c.budget_usd).where(E.c.slug == slug)
        if self.engine.dialect.name == "postgresql":
            query = query.with_for_update(key_share=True)
        return conn.execute(query).scalar_one_or_none() is not None

    def _settle(self, conn: Connection, slug: str, *, reserved_usd: float,
                cost_usd: float) -> None:
        """Move calls from reserved to spent on a budgeted exam's running totals."""
        if self._budgeted(conn, slug):
            conn.execute(update(E).where(E.c.slug == slug).values(
                reserved_usd=E.c.reserved_usd - reserved_usd,
                spent_usd=E.c.spent_usd + cost_usd))

    def _why_not(self, conn: Connection, slug: str, chapter_id: str,
                 max_attempts: int) -> NotClaimed:
        row = conn.execute(
            select(C, E.c.state.label("exam_state"), E.c.pause_reason, self._now.label("now"))
            .join(E, E.c.slug == C.c.exam)
            .where(C.c.exam == slug, C.c.chapter_id == chapter_id)).one_or_none()
        if row is None:
            return NotClaimed("missing", detail=f"no chapter {slug}/{chapter_id} in the database")
        if row.state in (ChapterState.done.value, ChapterState.failed.value,
                         ChapterState.cancelled.value):
            return NotClaimed(row.state)
        if row.exam_state == ExamState.paused.value:
            return NotClaimed("paused", detail=row.pause_reason or "")
        if row.lease_owner is not None and (row.lease_expires_at or 0) > row.now:
            return NotClaimed("busy", retry_in_s=row.lease_expires_at - row.now,
                              detail=f"held by {row.lease_owner}")
        if row.not_before_at is not None and row.not_before_at > row.now:
            return NotClaimed("backoff", retry_in_s=row.not_before_at - row.now)
        if row.attempts_since_progress >= max_attempts:
            error = (f"attempt cap: {row.attempts_since_progress} attempts without progress; "
                     f"last error: {row.last_error or 'none recorded (worker crashed?)'}")
            conn.execute(update(C).where(C.c.exam == slug, C.c.chapter_id == chapter_id).values(
                state=ChapterState.failed.value, lease_owner=None, lease_expires_at=None,
                last_error=error, last_error_at=self._now, updated_at=self._now))
            self._waste_orphaned_calls(conn, slug, chapter_id)
            return NotClaimed("cap", detail=error)
        return NotClaimed("busy", retry_in_s=0.5, detail="changed under us; check back")

    def renew(self, owners: Sequence[str], lease_s: float) -> set[str]:
        """Extend the live leases of `owners`; returns the owners that still hold theirs.

        The heartbeat has a connection of its own, so it never waits behind the workers'
        queries for one. On PostgreSQL it also skips rows a transaction has locked: those are
        the holder's own (starting or committing a call, which renews the lease itself; a
        takeover only ever locks an expired lease), so the beat never queues behind them."""
        if not owners:
            return set()
        live = [C.c.lease_owner.in_(owners), C.c.lease_expires_at > self._now,
                C.c.state == ChapterState.running.value]
        with self._heartbeat_engine().begin() as conn:
            if conn.dialect.name != "postgresql":
                return set(conn.execute(
                    update(C).where(*live).values(lease_expires_at=self._now + lease_s)
                    .returning(C.c.lease_owner)).scalars().all())
            alive = set(conn.execute(select(C.c.lease_owner).where(*live)).scalars().all())
            unlocked = (select(C.c.exam, C.c.chapter_id).where(*live)
                        .with_for_update(skip_locked=True))
            conn.execute(update(C).where(tuple_(C.c.exam, C.c.chapter_id).in_(unlocked))
                         .values(lease_expires_at=self._now + lease_s))
        return alive

    def _heartbeat_engine(self) -> Engine:
        with self._beat_lock:
            if self._beat is None:
                from storage.db import connect

                self._beat = connect(self.engine.url.render_as_string(hide_password=False),
                                     pool_size=1)
            return self._beat

    def start_call(self, claim: Claimed, first_number: int, requested: int, *,
                   lease_s: float, prompt_tokens: int = 0,
                   max_tokens: int | None = None, reserve_usd: float = 0.0,
                   model: str | None = None, price_known: bool = True) -> int | NoRoom:
        """Record a call before it is sent, and reserve its worst case against the exam's
        budget, in one transaction, only while the lease is held (the same fence as the
        commit: a holder frozen past its lease between two calls must not send one more).
        The budget check and the reservation are one conditional UPDATE of the exam row, so
        any number of workers can never reserve past the budget together. Returns the call's
        id, or NoRoom (nothing written) when the worst case does not fit; raises LeaseLost."""
        with self.engine.begin() as conn:
            held = conn.execute(
                update(C).where(C.c.exam == claim.exam, C.c.chapter_id == claim.chapter_id,
                                C.c.lease_owner == claim.owner,
                                C.c.lease_expires_at > self._now,
                                C.c.state == ChapterState.running.value)
                .values(lease_expires_at=self._now + lease_s)).rowcount
            if held != 1:
                raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost before a call")
            fits = not self._budgeted(conn, claim.exam) or conn.execute(
                update(E).where(
                    E.c.slug == claim.exam,
                    E.c.spent_usd + E.c.reserved_usd + reserve_usd <= E.c.budget_usd + 1e-12)
                .values(reserved_usd=E.c.reserved_usd + reserve_usd)).rowcount == 1
            if not fits:
                exam = conn.execute(select(E.c.budget_usd, E.c.spent_usd, E.c.reserved_usd)
                                    .where(E.c.slug == claim.exam)).one()
                return NoRoom(exam.budget_usd, exam.spent_usd, exam.reserved_usd, reserve_usd)
            return conn.execute(
                insert(K).values(exam=claim.exam, chapter_id=claim.chapter_id,
                                 attempt=claim.attempt, first_number=first_number,
                                 requested=requested, worker=claim.owner,
                                 outcome=CallOutcome.in_flight.value, started_at=self._now,
                                 prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                 reserved_usd=reserve_usd, model=model,
                                 price_known=price_known)
                .returning(K.c.id)
            ).scalar_one()

    def _finish(self, conn: Connection, call_id: int, values: dict[str, Any],
                usage: Usage) -> bool:
        """End an in-flight call with `values` and its usage, settling its reservation; False
        (nothing changed) when it had already ended (the takeover settled it first)."""
        booked = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "cost_usd": usage.cost_usd, "endpoint": usage.endpoint,
                  "usage_estimated": usage.estimated}
        row = conn.execute(
            update(K).where(K.c.id == call_id, K.c.outcome == CallOutcome.in_flight.value)
            .values(**values, **booked, finished_at=self._now)
            .returning(K.c.exam, K.c.reserved_usd)).one_or_none()
        if row is not None:
            self._settle(conn, row.exam, reserved_usd=row.reserved_usd, cost_usd=usage.cost_usd)
            return True
        if not usage.estimated and values.get("outcome") == CallOutcome.wasted.value:
            # A holder that lost its lease mid-call (frozen, partitioned) came back with the
            # reply: the takeover booked the call at its worst case, and its real usage and
            # the real reason are now known. Book those instead.
            old = conn.execute(select(K.c.exam, K.c.cost_usd).where(
                K.c.id == call_id, K.c.outcome == CallOutcome.wasted.value,
                K.c.usage_estimated.is_(True)).with_for_update()).one_or_none()
            if old is not None:
                conn.execute(update(K).where(K.c.id == call_id).values(**values, **booked))
                self._settle(conn, old.exam, reserved_usd=0.0,
                             cost_usd=usage.cost_usd - old.cost_usd)
        return False

    def finish_call(self, call_id: int, outcome: CallOutcome, reason: str, *,
                    status_code: int | None = None, usage: Usage = Usage()) -> None:
        """Record how a call that stored nothing ended (failed, or wasted with a reason)."""
        with self.engine.begin() as conn:
            self._finish(conn, call_id, {"outcome": outcome.value, "reason": reason[:500],
                                         "status_code": status_code}, usage)

    def commit_batch(self, claim: Claimed, lease_s: float, call_id: int, first_number: int,
                     questions: Sequence[ParsedQuestion], *, model: str, usage: Usage,
                     note: str = "") -> Committed:
        """Store one call's questions and its usage atomically, only while holding the lease.

        Returns the chapter's stored count and its target as they are now (the target may have
        been raised by an `enqueue` while the chapter ran). Raises LeaseLost (after recording
        the call as wasted) when the lease is gone: the result is discarded, never mixed in. Any
        other database failure records the call as wasted too, with its tokens, and re-raises.
        """
        try:
            with self.engine.begin() as conn:
                # The fence: this row is ours only while the lease is. It also locks the row,
                # so the target it returns cannot change before we commit.
                held = conn.execute(
                    update(C)
                    .where(C.c.exam == claim.exam, C.c.chapter_id == claim.chapter_id,
                           C.c.lease_owner == claim.owner, C.c.lease_expires_at > self._now,
                           C.c.state == ChapterState.running.value)
                    .values(attempts_since_progress=0, lease_expires_at=self._now + lease_s,
                            last_error=None, updated_at=self._now)
                    .returning(C.c.target, C.c.updated_at)
                ).one_or_none()
                if held is None:
                    raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost before commit")
                target, now = held
                conn.execute(insert(Q), [
                    {"exam": claim.exam, "chapter_id": claim.chapter_id,
                     "number": first_number + i, "question": q.question,
                     "choices": json.dumps(list(q.choices), ensure_ascii=False),
                     "answer_index": q.answer_index, "explanation": q.explanation,
                     "model": model, "call_id": call_id, "created_at": now}
                    for i, q in enumerate(questions)
                ])
                if not self._finish(conn, call_id, {
                        "outcome": CallOutcome.used.value, "reason": note or None,
                        "questions_stored": len(questions)}, usage):
                    # Settled by a takeover in the meantime: the fence above makes that
                    # impossible while we hold the lease, so this is a bug, not a race.
                    raise LeaseLost(f"call {call_id} was already settled")
                conn.execute(update(E).where(E.c.slug == claim.exam, E.c.auth_failures > 0)
                             .values(auth_failures=0))
                stored = self._stored(conn, claim.exam, claim.chapter_id)
                if stored >= target:
                    conn.execute(update(C).where(C.c.exam == claim.exam,
                                                 C.c.chapter_id == claim.chapter_id).values(
                        state=ChapterState.done.value, lease_owner=None, lease_expires_at=None))
                return Committed(stored=stored, target=target)
        except (LeaseLost, IntegrityError) as exc:
            reason = ("lease_lost: the lease expired or was taken before the commit" if
                      isinstance(exc, LeaseLost) else "lease_lost: duplicate question number")
            self.finish_call(call_id, CallOutcome.wasted, reason, usage=usage)
            raise LeaseLost(str(exc).splitlines()[0]) from None
        except SQLAlchemyError as exc:
            # The reply (and its bill) arrived but the database failed: say so with its tokens,
            # so the takeover does not book it as a crash with none.
            try:
                self.finish_call(call_id, CallOutcome.wasted,
                                 f"commit_failed: {str(exc).splitlines()[0][:300]}",
                                 usage=usage)
            except SQLAlchemyError:
                pass  # still down: the takeover will mark it wasted
            raise

    def release(self, claim: Claimed, *, retry_in_s: float, error: str,
                count_attempt: bool = True) -> bool:
        """Give the lease back after a transient failure; nobody may claim before `retry_in_s`.
        With `count_attempt` false (a rate limit, a budget wait, a shutdown) this attempt is
        taken back from the chapter's streak without progress: it cannot bring it nearer its
        attempt cap."""
        values: dict[str, Any] = {}
        if not count_attempt:
            values["attempts_since_progress"] = case(
                (C.c.attempts_since_progress > 0, C.c.attempts_since_progress - 1), else_=0)
        with self.engine.begin() as conn:
            return conn.execute(
                update(C).where(C.c.exam == claim.exam, C.c.chapter_id == claim.chapter_id,
                                C.c.lease_owner == claim.owner,
                                C.c.state == ChapterState.running.value)
                .values(state=ChapterState.pending.value, lease_owner=None,
                        lease_expires_at=None, not_before_at=self._now + retry_in_s,
                        last_error=error[:1000], last_error_at=self._now, updated_at=self._now,
                        **values)
            ).rowcount == 1

    def pause_exam(self, slug: str, reason: str) -> bool:
        """Stop sending anything for the exam until a person acts (`resume`, a raised budget).
        Running calls finish and are kept. False if it was not active (already paused)."""
        with self.engine.begin() as conn:
            return conn.execute(update(E).where(
                E.c.slug == slug, E.c.state == ExamState.active.value).values(
                state=ExamState.paused.value, pause_reason=reason[:500],
                updated_at=self._now)).rowcount == 1

    def fail(self, claim: Claimed, error: str, *, pause_exam_after: int | None = None) -> None:
        """Fail the chapter now. With `pause_exam_after`, count an auth failure against the exam
        and pause it when that many happened in a row."""
        with self.engine.begin() as conn:
            conn.execute(
                update(C).where(C.c.exam == claim.exam, C.c.chapter_id == claim.chapter_id,
                                C.c.lease_owner == claim.owner)
                .values(state=ChapterState.failed.value, lease_owner=None,
                        lease_expires_at=None, last_error=error[:1000],
                        last_error_at=self._now, updated_at=self._now))
            if pause_exam_after is not None:
                failures = E.c.auth_failures + 1
                conn.execute(update(E).where(E.c.slug == claim.exam).values(
                    auth_failures=failures,
                    state=case((failures >= pause_exam_after, ExamState.paused.value),
                               else_=E.c.state),
                    pause_reason=case((failures >= pause_exam_after, error[:500]),
                                      else_=E.c.pause_reason),
                    updated_at=self._now))

    # ------------------------------------------------------------ reading
    @staticmethod
    def _stored(conn: Connection, slug: str, chapter_id: str) -> int:
        return conn.execute(select(func.count()).select_from(Q).where(
            Q.c.exam == slug, Q.c.chapter_id == chapter_id)).scalar_one()

    @staticmethod
    def _require_exam(conn: Connection, slug: str) -> None:
        from examforge.errors import UnknownExam

        if conn.execute(select(E.c.slug).where(E.c.slug == slug)).first() is None:
            raise UnknownExam(f"unknown exam {slug!r}: not in the database (run enqueue first)")

    def questions_done(self, slug: str) -> int:
        """Stored questions of the exam, up to each chapter's target: a cheap progress figure."""
        with self._read() as conn:
            rows = conn.execute(
                select(func.count(), C.c.target).select_from(Q)
                .join(C, and_(C.c.exam == Q.c.exam, C.c.chapter_id == Q.c.chapter_id))
                .where(Q.c.exam == slug).group_by(Q.c.chapter_id, C.c.target)).all()
        return sum(min(n, target) for n, target in rows)

    def stored_texts(self, slug: str) -> dict[str, list[str]]:
        """The text of every stored question of the exam, by chapter (empty if unknown)."""
        with self._read() as conn:
            rows = conn.execute(select(Q.c.chapter_id, Q.c.question).where(Q.c.exam == slug)
                                .order_by(Q.c.chapter_id, Q.c.number)).all()
        out: dict[str, list[str]] = {}
        for chapter_id, text in rows:
            out.setdefault(chapter_id, []).append(text)
        return out

    def completion_tokens_per_question(self) -> float | None:
        """What this database's calls have really used per question stored (None before any
        call with real usage), for estimates."""
        with self._read() as conn:
            tokens, questions = conn.execute(
                select(func.coalesce(func.sum(K.c.completion_tokens), 0),
                       func.coalesce(func.sum(K.c.questions_stored), 0))
                .where(K.c.outcome == CallOutcome.used.value,
                       K.c.usage_estimated.is_(False))).one()
        return tokens / questions if questions else None

    def exam_exists(self, slug: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(E.c.slug).where(E.c.slug == slug)).first() is not None

    def status(self, slug: str) -> dict[str, object]:
        """The whole picture of one exam, from the database alone."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            exam = conn.execute(select(E, self._now.label("now")).where(E.c.slug == slug)).one()
            stored: dict[str, int] = dict(conn.execute(
                select(Q.c.chapter_id, func.count()).where(Q.c.exam == slug)
                .group_by(Q.c.chapter_id)).all())
            usage_rows = conn.execute(
                select(K.c.chapter_id, K.c.outcome, K.c.endpoint, K.c.usage_estimated,
                       K.c.price_known, K.c.model, func.count(),
                       func.coalesce(func.sum(K.c.prompt_tokens), 0),
                       func.coalesce(func.sum(K.c.completion_tokens), 0),
                       func.coalesce(func.sum(K.c.cost_usd), 0.0),
                       func.coalesce(func.sum(K.c.reserved_usd), 0.0))
                .where(K.c.exam == slug)
                .group_by(K.c.chapter_id, K.c.outcome, K.c.endpoint, K.c.usage_estimated,
                          K.c.price_known, K.c.model)).all()
            chapters = conn.execute(select(C).where(C.c.exam == slug)
                                    .order_by(C.c.position)).all()
        usage: dict[str, Any] = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                 **{f"calls_{o.value}": 0 for o in CallOutcome},
                                 "calls_estimated": 0, "estimated_cost_usd": 0.0}
        cost_usd = 0.0
        calls_by_chapter: dict[str, int] = {}
        by_endpoint: dict[str, dict[str, Any]] = {}
        unpriced: dict[str, int] = {}
        reserved_usd = 0.0
        for (chapter_id, outcome, endpoint, estimated, priced, model, n, p, c, cost,
             reserved) in usage_rows:
            if outcome == CallOutcome.in_flight.value:
                reserved_usd += float(reserved)
            if estimated:
                usage["calls_estimated"] += n
                usage["estimated_cost_usd"] += float(cost)
            if not priced:
                unpriced[model or "unknown"] = unpriced.get(model or "unknown", 0) + n
            usage["calls"] += n
            usage["prompt_tokens"] += int(p)
            usage["completion_tokens"] += int(c)
            usage[f"calls_{outcome}"] = usage.get(f"calls_{outcome}", 0) + n
            cost_usd += float(cost)
            calls_by_chapter[chapter_id] = calls_by_chapter.get(chapter_id, 0) + n
            ep = by_endpoint.setdefault(endpoint or "unknown", {
                "calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0})
            ep["calls"] += n
            ep["prompt_tokens"] += int(p)
            ep["completion_tokens"] += int(c)
            ep["cost_usd"] += float(cost)
        for ep in by_endpoint.values():
            ep["cost_usd"] = round(ep["cost_usd"], 6)
        counts = {s.value: 0 for s in ChapterState}
        listed = []
        for ch in chapters:
            state = ch.state
            if state == ChapterState.running.value and not (
                    ch.lease_owner and (ch.lease_expires_at or 0) > exam.now):
                state = ChapterState.pending.value
            counts[state] += 1
            listed.append({
                "id": ch.chapter_id, "title": ch.title, "state": state,
                "questions": {"target": ch.target, "done": min(stored.get(ch.chapter_id, 0),
                                                               ch.target)},
                "attempts": ch.attempts, "attempts_since_progress": ch.attempts_since_progress,
                "calls": calls_by_chapter.get(ch.chapter_id, 0),
                "last_error": ch.last_error, "last_error_at": ch.last_error_at,
                "lease_owner": ch.lease_owner if state == ChapterState.running.value else None,
                "requeues": ch.requeues, "requeued_at": ch.requeued_at,
                "requeue_reason": ch.requeue_reason,
            })
        return {
            "exam": slug, "title": exam.title, "state": exam.state,
            "pause_reason": exam.pause_reason,
            "chapters": {"total": len(chapters), **counts},
            "questions": {"target": sum(c["questions"]["target"] for c in listed),
                          "done": sum(c["questions"]["done"] for c in listed)},
            "usage": {**usage, "estimated_cost_usd": round(usage["estimated_cost_usd"], 6)},
            "cost_usd": round(cost_usd, 6), "usage_by_endpoint": by_endpoint,
            # Calls booked at $0 because no price was known for their model, by model.
            "unpriced_calls": unpriced,
            "budget_usd": exam.budget_usd, "spent_usd": round(cost_usd, 6),
            "reserved_usd": round(reserved_usd, 6),
            "chapter_list": listed,
        }

    def questions(self, slug: str) -> list[dict[str, object]]:
        """Every stored question of the exam, in syllabus order, up to each chapter's target."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            rows = conn.execute(
                select(Q, C.c.position).join(C, and_(C.c.exam == Q.c.exam,
                                                     C.c.chapter_id == Q.c.chapter_id))
                .where(Q.c.exam == slug, Q.c.number <= C.c.target)
                .order_by(C.c.position, Q.c.number)).all()
        return [{"exam": r.exam, "chapter_id": r.chapter_id, "number": r.number,
                 "question": r.question, "choices": json.loads(r.choices),
                 "answer_index": r.answer_index, "explanation": r.explanation,
                 "model": r.model, "created_at": r.created_at} for r in rows]

    def orphans(self, grace_s: float, epoch: str | None) -> list[Orphan]:
        """Chapters that need work but that no message will bring to a worker.

        A chapter is orphaned when it is pending with no live lease, its backoff (if any)
        ended more than `grace_s` ago, and either its message was consumed by a worker that
        then vanished (picked after its last enqueue), or the broker
        lost its message (the broker's epoch changed since it was enqueued). Chapters never
        enqueued (a changed chapter awaiting --regenerate) are left alone.
        """
        now = self._now
        vanished = and_(C.c.picked_at.is_not(None), C.c.picked_at >= C.c.enqueued_at,
                        func.coalesce(C.c.lease_expires_at, C.c.picked_at) <= now - grace_s)
        lost = [vanished]
        if epoch is not None:
            lost.append(or_(C.c.enqueue_epoch.is_(None), C.c.enqueue_epoch != epoch))
        with self._read() as conn:
            rows = conn.execute(
                select(C.c.exam, C.c.chapter_id, vanished.label("vanished"))
                .join(E, E.c.slug == C.c.exam)
                .where(
                    E.c.state == ExamState.active.value,
                    C.c.state.in_(ACTIVE_STATES),
                    C.c.enqueued_at.is_not(None),  # never enqueued: left out on purpose
                    or_(C.c.lease_owner.is_(None), C.c.lease_expires_at <= now - grace_s),
                    or_(C.c.not_before_at.is_(None), C.c.not_before_at <= now - grace_s),
                    or_(*lost),
                )
                .order_by(C.c.exam, C.c.position)).all()
        return [Orphan(r.exam, r.chapter_id,
                       RequeueReason.worker_vanished if r.vanished
                       else RequeueReason.broker_epoch_changed) for r in rows]

    def lost_messages(self, *, min_age_s: float, queued: int,
                      unacked: Iterable[tuple[str, str]]) -> LostAudit:
        """Chapters whose message the queue has lost while its broker epoch survived.

        A chapter waits for a message in the queue's list when it was enqueued at least
        `min_age_s` ago (so its message was published before the broker was read), no worker
        has picked it since, and no worker holds its message (`unacked`: the chapters of the
        messages delivered to workers and not yet acked). Each such chapter needs a message of
        its own in the list, so when the list holds fewer (`queued`) than their number, at
        least the difference have lost theirs. Those are returned, oldest enqueue first
        (within one enqueue, the last published first: the writes a lagging replica lacks).

        Duplicates and stale messages in the list can only hide a loss, never invent one, so
        a long but complete queue is never re-published; a hidden loss shows once the workers
        have consumed what hid it.
        """
        where = [
            E.c.state == ExamState.active.value,
            C.c.state == ChapterState.pending.value,
            C.c.enqueued_at.is_not(None),
            C.c.enqueued_at <= self._now - min_age_s,
            or_(C.c.picked_at.is_(None), C.c.picked_at < C.c.enqueued_at),
        ]
        pick = select(C.c.exam, C.c.chapter_id).join(E, E.c.slug == C.c.exam)
        held = sorted(set(unacked))
        with self._read() as conn:
            waiting = conn.execute(select(func.count()).select_from(C)
                                   .join(E, E.c.slug == C.c.exam).where(*where)).scalar_one()
            # Most held messages belong to running or retrying chapters, which are not
            # waiting; the few that are (delivered, not started yet) are found in chunks.
            in_workers: set[tuple[str, str]] = set()
            for i in range(0, len(held), 500):
                in_workers.update((r.exam, r.chapter_id) for r in conn.execute(
                    pick.where(*where, tuple_(C.c.exam, C.c.chapter_id).in_(held[i:i + 500]))))
            waiting -= len(in_workers)
            lost: list[tuple[str, str]] = []
            if waiting > queued:
                rows = conn.execute(pick.where(*where)
                                    .order_by(C.c.enqueued_at, C.c.position.desc())
                                    .limit(waiting - queued + len(in_workers))).all()
                lost = [(r.exam, r.chapter_id) for r in rows
                        if (r.exam, r.chapter_id) not in in_workers][:waiting - queued]
        return LostAudit(waiting=waiting, queued=queued, lost=lost)

    def fail_capped(self, max_attempts: int) -> int:
        """Fail chapters that reached their attempt cap without progress."""
        with self.engine.begin() as conn:
            capped = conn.execute(
                select(C.c.exam, C.c.chapter_id).where(
                    C.c.state.in_(ACTIVE_STATES), C.c.attempts_since_progress >= max_attempts,
                    or_(C.c.lease_owner.is_(None), C.c.lease_expires_at <= self._now))).all()
            for exam, chapter_id in capped:
                conn.execute(update(C).where(C.c.exam == exam, C.c.chapter_id == chapter_id)
                             .values(state=ChapterState.failed.value, lease_owner=None,
                                     lease_expires_at=None, updated_at=self._now,
                                     last_error_at=self._now,
                                     last_error=func.coalesce(C.c.last_error, "")
                                     + " [attempt cap reached]"))
                self._waste_orphaned_calls(conn, exam, chapter_id)
            return len(capped)
