"""Runs and stored syllabi: what the HTTP API (producer/api) records.

A run is one POST /exams/SLUG/runs. It owns no work of its own: the work is the exam's
slices, as `enqueue` records them, so a run's progress, state and events are read from the
exam's rows. What the run adds is the request's identity (its Idempotency-Key, UNIQUE in the
database, so two identical requests on two replicas at once insert one row), where its calls
begin (`call_floor`: its cost and its events are the calls above it), and a final state
written once, so that a later run of the same exam never reopens a finished one.

Events (GET /runs/ID/events) are the exam's stored batches in call-id order, each with the
progress and cost as of that call. A call's id is given when the call starts, before its
reply, so batches commit out of id order; an event is therefore only emitted once every call
below it has settled (none is in flight). The events up to an id are then a function of the
database alone: any replica, asked to resume after id N, emits exactly the events above N
that another would have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.engine import Connection

from examforge import item_types
from examforge.errors import IdempotencyKeyReused, PauseCode
from storage.base import ACTIVE_SLICE, ACTIVE_STATES, IN_FLIGHT_CALL, E, K, Q, S
from storage.models import (
    FINAL_RUN_STATES,
    CallOutcome,
    ChapterState,
    ExamMode,
    ExamState,
    Run,
    RunState,
    StoredSyllabus,
)
from storage.ledger import Ledger
from storage.planning import SliceRef
from storage.report_types import ExamReport, ExamStatus

R = Run.__table__  # type: ignore[attr-defined]
Y = StoredSyllabus.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RunRow:
    id: int
    exam: str
    client: str
    idempotency_key: str | None
    fingerprint: str
    budget_usd: float | None
    call_floor: int
    state: str | None
    cancelled_at: float | None
    launched_at: float | None
    launching_until: float | None
    final_view: str | None
    batch: bool
    created_at: float
    updated_at: float
    verify: str | None = None  # the blind-solve policy it asked for (None: the exam's)
    started_by: str | None = None  # the token's name (None: a run from before 0030)


@dataclass(frozen=True)
class RunActivity:
    """The run's calls (those above its floor): how many, their cost, the last change."""

    calls: int
    cost_usd: float
    last_at: float | None


@dataclass(frozen=True)
class RunEvent:
    """One stored batch: the call that stored it, and the run's progress and cost after it."""

    id: int
    done: int
    target: int
    cost_usd: float
    spent_usd: float = 0.0  # the exam's, every run's calls, after it


def run_state(run: RunRow, report: ExamReport, activity: RunActivity) -> tuple[str, str | None]:
    """(state, pause reason) of a run from its exam's report: a final state once recorded
    stays; then cancelled by request; then how the exam stands (queued until one of the run's
    calls started or a slice is held)."""
    if run.state in FINAL_RUN_STATES:
        return run.state, None
    if run.cancelled_at is not None:
        return RunState.cancelled.value, None
    if run.launched_at is None:
        return RunState.queued.value, None  # its request is still recording the work
    state = report.state
    if state == ExamStatus.paused.value:
        return RunState.paused.value, report.pause_reason
    if state in FINAL_RUN_STATES:
        return state, None
    if report.chapters.running or activity.calls:
        return RunState.running.value, None
    return RunState.queued.value, None


def _row(r: Any) -> RunRow:
    values = {k: r._mapping[k] for k in RunRow.__dataclass_fields__}
    values["batch"] = bool(values["batch"])
    return RunRow(**values)


class Runs(Ledger):
    """Stored syllabi, runs and their idempotency keys, the events of a run."""

    # --- syllabi -----------------------------------------------------------------------

    def stored_syllabus(self, slug: str) -> str | None:
        """The syllabus PUT /exams/SLUG stored, as JSON text (None if there is none)."""
        with self._read() as conn:
            return conn.execute(select(Y.c.body).where(Y.c.exam == slug)).scalar()

    def stored_syllabi(self, *, unrun: bool = False) -> dict[str, tuple[str, float]]:
        """Every stored syllabus (`unrun`: only those of exams not in the database yet):
        slug -> (JSON text, last change)."""
        query = select(Y.c.exam, Y.c.body, Y.c.updated_at)
        if unrun:
            query = query.where(~select(E.c.slug).where(E.c.slug == Y.c.exam).exists())
        with self._read() as conn:
            return {r.exam: (r.body, r.updated_at) for r in conn.execute(query)}

    def put_syllabus(self, slug: str, body: str) -> bool:
        """Store the exam's syllabus, replacing any; True if there was none (created)."""
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            created = conn.execute(
                self._insert(Y).values(exam=slug, body=body, created_at=now, updated_at=now)
                .on_conflict_do_nothing().returning(Y.c.exam)).first() is not None
            if not created:
                conn.execute(update(Y).where(Y.c.exam == slug).values(body=body,
                                                                       updated_at=now))
            return created

    # --- runs --------------------------------------------------------------------------

    def create_run(self, slug: str, key: str, fingerprint: str,
                   budget_usd: float | None, client: str = "", batch: bool = False,
                   verify: str | None = None,
                   started_by: str | None = None) -> tuple[RunRow, bool]:
        """The run of `client`'s `key`: a new one (True) or the one an identical earlier
        request made (False). The UNIQUE key decides between concurrent requests: INSERT ..
        ON CONFLICT DO NOTHING inserts for one of them, and the others read its row once it
        commits. Raises IdempotencyKeyReused if the key's run was made by another request."""
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            floor = select(func.coalesce(func.max(K.c.id), 0)).where(
                K.c.exam == slug).scalar_subquery()
            new_id = conn.execute(
                self._insert(R).values(exam=slug, client=client, idempotency_key=key,
                                       fingerprint=fingerprint, budget_usd=budget_usd,
                                       batch=batch, verify=verify, call_floor=floor,
                                       started_by=started_by,
                                       created_at=now, updated_at=now)
                .on_conflict_do_nothing().returning(R.c.id)).scalar()
            row = _row(conn.execute(select(R).where(R.c.client == client,
                                                    R.c.idempotency_key == key)).one())
        if new_id is None and row.fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                "this Idempotency-Key was used for another request (another exam or body); "
                "use a new key for a new request")
        return row, new_id is not None

    def run(self, run_id: int) -> RunRow | None:
        with self._read() as conn:
            r = conn.execute(select(R).where(R.c.id == run_id)).first()
        return _row(r) if r is not None else None

    def exam_runs(self, slug: str, limit: int = 20) -> list[RunRow]:
        """The exam's runs, newest first."""
        with self._read() as conn:
            return [_row(r) for r in conn.execute(
                select(R).where(R.c.exam == slug).order_by(R.c.id.desc()).limit(limit))]

    def open_runs(self) -> list[RunRow]:
        """Runs not known to be final, oldest first (serve --local resumes their work)."""
        with self._read() as conn:
            return [_row(r) for r in conn.execute(
                select(R).where(R.c.state.is_(None), R.c.cancelled_at.is_(None))
                .order_by(R.c.id))]

    def unlaunched_runs(self, grace_s: float) -> list[RunRow]:
        """Open runs stored over `grace_s` ago whose work was never handed on and that no
        one is handing on now (no live claim): their request died or the broker refused.
        Oldest first."""
        with self._read() as conn:
            return [_row(r) for r in conn.execute(
                select(R).where(R.c.launched_at.is_(None), R.c.state.is_(None),
                                R.c.cancelled_at.is_(None),
                                R.c.created_at < self._now - grace_s,
                                R.c.launching_until.is_(None)
                                | (R.c.launching_until < self._now))
                .order_by(R.c.id))]

    def claim_launch(self, run_id: int, lease_s: float) -> bool:
        """Take the right to hand the run's work on, for `lease_s` (the database's clock):
        True for exactly one of any number of callers at once, on any replica, until the
        claim is released or lapses; False once the run is launched, cancelled or final.
        The conditional UPDATE is the lock: the row's write lock serialises the callers and
        the loser's WHERE no longer matches."""
        with self._write() as conn:
            return conn.execute(update(R).where(
                R.c.id == run_id, R.c.launched_at.is_(None), R.c.state.is_(None),
                R.c.cancelled_at.is_(None),
                R.c.launching_until.is_(None) | (R.c.launching_until < self._now))
                .values(launching_until=self._now + lease_s)).rowcount == 1

    def release_launch(self, run_id: int) -> None:
        """Give up a claim whose hand-off failed (the broker refused): the run stays
        queued, and the next repeat of its key or the next sweep tries again."""
        with self._write() as conn:
            conn.execute(update(R).where(R.c.id == run_id, R.c.launched_at.is_(None))
                         .values(launching_until=None))

    def unfinished_slices(self, slug: str) -> list[SliceRef]:
        """The exam's slices still to work on (pending or running), in syllabus order; none
        while the exam is paused (a pause is lifted by a new run or `resume`)."""
        with self._read() as conn:
            paused = conn.execute(select(E.c.slug).where(
                E.c.slug == slug, E.c.state == ExamState.paused.value)).first()
            if paused is not None:
                return []
            return [(r.chapter_id, r.slice_no) for r in conn.execute(
                select(S.c.chapter_id, S.c.slice_no)
                .where(S.c.exam == slug, S.c.state.in_(ACTIVE_STATES))
                .order_by(S.c.position, S.c.chapter_id, S.c.slice_no))]

    def unqueued_slices(self, slug: str | None = None) -> list[tuple[str, str, int]]:
        """The slices of exams with an open run (launched, neither final nor cancelled) that
        wait for work no message will bring: pending, not enqueued since they were reopened
        (a reviewer's rejection, `Store.withdraw`, reopens a done slice with no enqueue
        recorded, for the next `enqueue`), held by no live lease, of an active exam in sync
        mode. The run asked for what is missing: it would otherwise say `running` for ever.
        (exam, chapter_id, slice_no), in syllabus order; of `slug` only, when given."""
        open_run = select(R.c.id).where(
            R.c.exam == S.c.exam, R.c.launched_at.is_not(None), R.c.state.is_(None),
            R.c.cancelled_at.is_(None)).exists()
        where = [ACTIVE_SLICE, S.c.state == ChapterState.pending.value,
                 S.c.enqueued_at.is_(None),
                 E.c.state == ExamState.active.value, E.c.mode == ExamMode.sync.value,
                 S.c.lease_owner.is_(None) | (S.c.lease_expires_at <= self._now), open_run]
        if slug is not None:
            where.append(S.c.exam == slug)
        with self._read() as conn:
            return [(r.exam, r.chapter_id, r.slice_no) for r in conn.execute(
                select(S.c.exam, S.c.chapter_id, S.c.slice_no).join(E, E.c.slug == S.c.exam)
                .where(*where).order_by(S.c.exam, S.c.position, S.c.chapter_id, S.c.slice_no))]

    @staticmethod
    def _window(conn: Connection, run: RunRow) -> tuple[Any, ...]:
        """The run's calls: those of its exam above its floor and, once a later run of the
        exam was launched, up to that run's floor (from then on the exam's calls are the
        later run's: a job is billed its own calls, never its successor's). A later run never
        launched (cancelled first, or still being handed on) did no work and bounds nothing."""
        ceiling = conn.execute(select(func.min(R.c.call_floor)).where(
            R.c.exam == run.exam, R.c.id > run.id, R.c.launched_at.is_not(None))).scalar()
        where = (K.c.exam == run.exam, K.c.id > run.call_floor)
        return where if ceiling is None else (*where, K.c.id <= ceiling)

    def run_activity(self, run: RunRow) -> RunActivity:
        with self._read() as conn:
            if run.launched_at is None:  # nothing handed on: none of the exam's calls is its
                return RunActivity(0, 0.0, None)
            n, cost, last = conn.execute(
                select(func.count(), func.coalesce(func.sum(K.c.cost_usd), 0.0),
                       func.max(func.coalesce(K.c.finished_at, K.c.started_at)))
                .where(*self._window(conn, run),
                       K.c.outcome != CallOutcome.imported.value)).one()
        return RunActivity(int(n), round(float(cost), 6), last)

    def mark_launched(self, run_id: int) -> None:
        """The run's work was handed on: the first hand-off's time is kept, the claim ends."""
        with self._write() as conn:
            conn.execute(update(R).where(R.c.id == run_id, R.c.launched_at.is_(None))
                         .values(launched_at=self._now, launching_until=None,
                                 updated_at=self._now))

    def record_run_state(self, run_id: int, state: str, at: float | None = None,
                         view: str | None = None) -> None:
        """Write a final state once: the first writer wins, later ones change nothing (a
        state written by cancel is kept). `at` is the time the run last changed (default
        now); `view`, the run's view (JSON) then, is written once too."""
        with self._write() as conn:
            conn.execute(update(R).where(R.c.id == run_id, R.c.state.is_(None))
                         .values(state=state, updated_at=self._now if at is None else at))
            if view is not None:
                conn.execute(update(R).where(R.c.id == run_id, R.c.final_view.is_(None))
                             .values(final_view=view))

    def prepare_run(self, slug: str) -> None:
        """What a new run asks beyond `enqueue`: cancelled slices go back to pending (start
        means "generate what is missing"), and a pause that is not the budget's is cleared as
        `resume` clears it (a budget pause ends when a raised budget leaves room)."""
        with self._write() as conn:
            conn.execute(update(E).where(
                E.c.slug == slug, E.c.state == ExamState.paused.value,
                func.coalesce(E.c.pause_code, "") != PauseCode.budget.value)
                .values(state=ExamState.active.value, pause_reason=None, pause_code=None,
                        auth_failures=0,
                        updated_at=self._now))
            self._restart_cancelled(conn, slug)

    def restart_cancelled(self, slug: str) -> list[str]:
        """Put the exam's cancelled slices back to work, as a new run does: what `producer
        enqueue` and `producer run` do first, so they undo `producer cancel`. Returns the
        chapter ids restarted (sorted, once each)."""
        with self._write() as conn:
            return self._restart_cancelled(conn, slug)

    def _restart_cancelled(self, conn: Connection, slug: str) -> list[str]:
        # A slice cancelled while its holder was in a call, and that holder still in it
        # (its lease is live), goes on running: its commit then finds it running again.
        rows = conn.execute(update(S).where(S.c.exam == slug,
                                            S.c.state == ChapterState.cancelled.value)
                            .values(state=case((and_(S.c.lease_owner.is_not(None),
                                                     S.c.lease_expires_at > self._now),
                                                ChapterState.running.value),
                                               else_=ChapterState.pending.value),
                                    attempts_since_progress=0, updated_at=self._now)
                            .returning(S.c.chapter_id)).scalars().all()
        return sorted(set(rows))

    def cancel_run(self, run: RunRow) -> None:
        """Cancel the exam's unfinished slices and mark the run cancelled, in one
        transaction; stored questions are kept."""
        with self._write() as conn:
            self._exam_first(conn, run.exam)  # the lock order of every writer of its totals
            self._cancel_slices(conn, [  # as `producer cancel`: a call in flight is kept
                S.c.exam == run.exam,
                S.c.state.in_(ACTIVE_STATES + (ChapterState.failed.value,))])
            # and, as there, the calls of dead holders are settled in the same transaction.
            self._settle_orphans(conn, run.exam)
            conn.execute(update(R).where(R.c.id == run.id, R.c.state.is_(None)).values(
                cancelled_at=self._now, state=RunState.cancelled.value, updated_at=self._now))

    def forget_idempotency_keys(self, older_than_s: float) -> int:
        """Drop the keys of runs older than `older_than_s` (the runs stay readable); a key
        sent again after that starts a new run. Returns how many were dropped."""
        with self._write() as conn:
            return conn.execute(update(R).where(
                R.c.idempotency_key.is_not(None),
                R.c.created_at < self._now - older_than_s).values(idempotency_key=None)
            ).rowcount

    # --- events ------------------------------------------------------------------------

    def run_events(self, run: RunRow, after: int, final: bool,
                   target: int | None = None) -> list[RunEvent]:
        """The run's stored batches with a call id above `after`, in id order, up to the
        first call still in flight (all of them once the run is `final`: no call of its
        exam can store anything more). `target`: the exam's target the events carry (a
        finished run's, as its kept view has it), default the exam's now. See the module's
        docstring."""
        with self._read() as conn:
            after = max(after, run.call_floor)
            if target is None:
                target = conn.execute(select(func.coalesce(func.sum(S.c.target), 0))
                                      .where(S.c.exam == run.exam)).scalar_one()
            done = conn.execute(select(func.count()).select_from(Q).where(
                Q.c.exam == run.exam,
                # Withdrawn questions (VERIFY=replace) count as their call stored them: an
                # event's figures never change once streamed (a resumed stream's parts
                # equal the whole); `min(done, target)` caps them.
                (Q.c.call_id <= after) | Q.c.call_id.is_(None))).scalar_one()
            window = self._window(conn, run)
            cost = conn.execute(select(func.coalesce(func.sum(K.c.cost_usd), 0.0)).where(
                *window, K.c.id <= after)).scalar_one()
            spent = conn.execute(select(func.coalesce(func.sum(K.c.cost_usd), 0.0)).where(
                K.c.exam == run.exam, K.c.id <= after)).scalar_one()
            calls = conn.execute(select(K.c.id, K.c.outcome, K.c.cost_usd).where(
                *window, K.c.id > after).order_by(K.c.id)).all()
            stored: dict[int, int] = dict(conn.execute(  # type: ignore[arg-type]
                select(Q.c.call_id, func.count()).where(Q.c.exam == run.exam,
                                                        Q.c.call_id > after)
                .group_by(Q.c.call_id)).all())
        events = []
        for call_id, outcome, call_cost in calls:
            if outcome == CallOutcome.in_flight.value and not final:
                break
            done += stored.get(call_id, 0)
            cost += call_cost or 0.0
            spent += call_cost or 0.0
            if stored.get(call_id):
                events.append(RunEvent(call_id, min(done, target), target, round(cost, 6),
                                       round(spent, 6)))
        return events

    def calls_in_flight(self, run: RunRow) -> int:
        """The run's calls still waiting for their reply."""
        with self._read() as conn:
            return conn.execute(select(func.count()).select_from(K).where(
                *self._window(conn, run),
                IN_FLIGHT_CALL)).scalar_one()

    def last_call_id(self, run: RunRow) -> int:
        """The run's highest call id (at least its floor): the id of its final event."""
        with self._read() as conn:
            top = conn.execute(select(func.max(K.c.id)).where(
                *self._window(conn, run))).scalar()
        return max(top or 0, run.call_floor)

    # --- questions ---------------------------------------------------------------------

    def question_page(self, slug: str, after: int, limit: int) -> list[dict[str, Any]]:
        """Stored questions of the exam (up to each chapter's target) with an id above
        `after`, by id: keyset pagination, so pages never repeat or skip a question that
        was stored when its page was read, however many are stored meanwhile."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            rows = conn.execute(
                select(Q.c.id, Q.c.chapter_id, Q.c.number, Q.c.question, Q.c.choices,
                       Q.c.answer_index, Q.c.explanation, Q.c.difficulty, Q.c.bloom,
                       Q.c.source, Q.c.verdict, Q.c.model, Q.c.created_at, S.c.language,
                       Q.c.type, Q.c.answer)
                .join(S, and_(S.c.exam == Q.c.exam, S.c.chapter_id == Q.c.chapter_id,
                              Q.c.number >= S.c.first_number,
                              Q.c.number < S.c.first_number + S.c.target))
                .where(Q.c.exam == slug, Q.c.id > after).order_by(Q.c.id).limit(limit)).all()
        return [{**{k: v for k, v in r._mapping.items() if k != "answer"},
                 "choices": json.loads(r.choices), "type": r.type or "mcq",
                 **item_types.reply_fields(r.type or "mcq", item_types.load(r.answer))}
                for r in rows]

