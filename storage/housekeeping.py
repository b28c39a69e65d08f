"""Housekeeping: delete finished exams, with everything they own, once they are old enough.

An exam can go when none of its slices is pending or running and its last change (the latest
of the exam's, its slices', its calls' and its questions' times, on the database's clock) is
older than asked. Each exam goes in a transaction of its own, which checks both again under
the exam's and its rows' locks: a prune racing a worker, an `enqueue` or a `resume` deletes
the exam only if it is still finished and old once nobody else can change it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import case, delete, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from examforge.errors import ExamRunning
from storage.grounding import forget_passages
from storage import neardup
from storage.base import ACTIVE_STATES, QE, E, K, Q, S, StoreBase
from storage.models import Batch, Run

RUN = Run.__table__  # type: ignore[attr-defined]
BATCH = Batch.__table__  # type: ignore[attr-defined]

# PostgreSQL's lock_not_available: a NOWAIT lock found the row held by another transaction.
_LOCK_NOT_AVAILABLE = "55P03"


@dataclass(frozen=True)
class Footprint:
    """What the database holds of one exam, and when it last changed."""

    exam: str
    chapters: int
    slices: int
    active_slices: int  # pending or running
    questions: int
    calls: int
    cost_usd: float
    last_change_at: float
    age_s: float  # now - last_change_at, on the database's clock


@dataclass
class PruneResult:
    """Exams pruned (or, in a dry run, that would be) and those kept, by reason."""

    pruned: list[Footprint] = field(default_factory=list)
    running: list[Footprint] = field(default_factory=list)  # pending or running slices
    recent: list[Footprint] = field(default_factory=list)  # changed within the duration
    busy: list[str] = field(default_factory=list)  # another transaction held its rows


class Housekeeping(StoreBase):
    """Prune old finished exams."""

    def footprint(self, slug: str) -> Footprint:
        """The exam's rows and last change; raises UnknownExam."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            return self._footprint(conn, slug)

    def prune(self, older_than_s: float, *, dry_run: bool = False,
              exam: str | None = None) -> PruneResult:
        """Delete every exam (or only `exam`) whose slices are all done, failed or cancelled
        and whose last change is at least `older_than_s` old, one transaction per exam. With
        `dry_run`, report what would go and delete nothing. Raises ExamRunning when `exam` has
        pending or running slices, and UnknownExam when it is not in the database."""
        result = PruneResult()
        with self._read() as conn:
            if exam is not None:
                self._require_exam(conn, exam)
                slugs = [exam]
            else:
                slugs = list(conn.execute(select(E.c.slug).order_by(E.c.slug)).scalars())
            seen = [self._footprint(conn, slug) for slug in slugs]
        for fp in seen:
            if fp.active_slices:
                result.running.append(fp)
            elif fp.age_s < older_than_s:
                result.recent.append(fp)
            elif dry_run:
                result.pruned.append(fp)
            else:
                self._prune_one(fp.exam, older_than_s, result)
        if exam is not None and result.running:
            fp = result.running[0]
            raise ExamRunning(
                f"exam {exam} has {fp.active_slices} slices pending or running: not pruned; "
                f"cancel it first (python -m producer cancel {exam}), or wait for it to finish")
        return result

    def _prune_one(self, slug: str, older_than_s: float, result: PruneResult) -> None:
        try:
            with self._write() as conn:
                self._lock(conn, slug)
                if conn.execute(select(E.c.slug).where(E.c.slug == slug)).first() is None:
                    return  # pruned by someone else meanwhile
                # Again, now that nobody else can change it.
                fp = self._footprint(conn, slug)
                if fp.active_slices:
                    result.running.append(fp)
                    return
                if fp.age_s < older_than_s:
                    result.recent.append(fp)
                    return
                neardup.forget(conn, slug)
                forget_passages(conn, slug)  # an API exam's uploaded sources stay, as its syllabus
                for table in (Q, QE, K, S, RUN, BATCH):
                    conn.execute(delete(table).where(table.c.exam == slug))
                conn.execute(delete(E).where(E.c.slug == slug))
                result.pruned.append(fp)
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            result.busy.append(slug)

    def _lock(self, conn: Connection, slug: str) -> None:
        """On PostgreSQL, the exam's row, its slices' and its calls' rows, without waiting:
        rows another transaction holds (a worker's commit, an enqueue, a budget change) mean
        the exam is in use, and it is skipped as busy rather than waited for, so a prune
        never deadlocks with them (they take these rows in other orders). SQLite has one
        writer at a time: the transaction itself is the lock."""
        if self.engine.dialect.name != "postgresql":
            return
        for query in (select(E.c.slug).where(E.c.slug == slug),
                      select(S.c.slice_no).where(S.c.exam == slug)
                      .order_by(S.c.chapter_id, S.c.slice_no),
                      select(K.c.id).where(K.c.exam == slug).order_by(K.c.id)):
            conn.execute(query.with_for_update(nowait=True)).all()

    def _footprint(self, conn: Connection, slug: str) -> Footprint:
        exam = conn.execute(select(E.c.updated_at, self._now.label("now"))
                            .where(E.c.slug == slug)).one()
        slices = conn.execute(select(
            func.count(func.distinct(S.c.chapter_id)), func.count(),
            func.coalesce(func.sum(case((S.c.state.in_(ACTIVE_STATES), 1), else_=0)), 0),
            func.max(S.c.updated_at)).where(S.c.exam == slug)).one()
        questions = conn.execute(select(func.count(), func.max(Q.c.created_at))
                                 .where(Q.c.exam == slug)).one()
        calls = conn.execute(select(
            func.count(), func.coalesce(func.sum(K.c.cost_usd), 0.0),
            func.max(K.c.started_at), func.max(K.c.finished_at)).where(K.c.exam == slug)).one()
        last = max(t for t in (exam.updated_at, slices[3], questions[1], calls[2], calls[3])
                   if t is not None)
        return Footprint(exam=slug, chapters=int(slices[0]), slices=int(slices[1]),
                         active_slices=int(slices[2]), questions=int(questions[0]),
                         calls=int(calls[0]), cost_usd=round(float(calls[1]), 6),
                         last_change_at=float(last), age_s=float(exam.now) - float(last))
