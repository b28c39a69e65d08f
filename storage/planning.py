"""Enqueue planning: record an exam and its chapters, decide which chapters need a task, and
the exam-wide switches (budget, pause, resume, cancel)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from sqlalchemy import bindparam, case, delete, func, select, update
from sqlalchemy.engine import Connection

from examforge.syllabus import Chapter as SyllabusChapter
from examforge.syllabus import Syllabus
from storage.base import ACTIVE_STATES, BUDGET_PAUSE_PREFIX, C, E, K, Q, StoreBase
from storage.models import CallOutcome, ChapterState, ExamState


@dataclass
class EnqueuePlan:
    to_enqueue: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # chapter -> why
    exam_paused: str | None = None




class Planning(StoreBase):
    """Exams and chapters as the producer sees them."""

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
        with self._write() as conn:
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
            # In bulk: one multi-row insert, one read of every chapter and of the counts of
            # stored questions, then the changes grouped into a few executemany statements
            # (a 10,000-chapter exam is a handful of statements, not 40,000).
            fresh = [{"exam": slug, "chapter_id": ch.id, "position": i, "title": ch.title,
                      "prompt": ch.prompt, "spec_hash": ch.spec_hash, "target": ch.questions,
                      "state": ChapterState.pending.value, "updated_at": now}
                     for i, ch in enumerate(syllabus.chapters)]
            for chunk in _chunks(fresh, 500):
                conn.execute(self._insert(C).on_conflict_do_nothing(), chunk)
            rows = {r.chapter_id: r for r in conn.execute(
                select(C).where(C.c.exam == slug).with_for_update())}
            stored: dict[str, int] = dict(conn.execute(  # type: ignore[arg-type]
                select(Q.c.chapter_id, func.count()).where(Q.c.exam == slug)
                .group_by(Q.c.chapter_id)).all())
            changes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
            wiped: list[str] = []
            for position, ch in enumerate(syllabus.chapters):
                why, values, wipe = _plan_chapter(ch, position, rows[ch.id],
                                                  stored.get(ch.id, 0), ch.id in regenerate,
                                                  now)
                if wipe:
                    wiped.append(ch.id)
                if values:
                    changes[tuple(sorted(values))].append({"_cid": ch.id, **values})
                if why is None and plan.exam_paused is None:
                    plan.to_enqueue.append(ch.id)
                else:
                    plan.skipped[ch.id] = why or f"exam paused: {plan.exam_paused}"
            for chunk in _chunks(wiped, 500):
                conn.execute(delete(Q).where(Q.c.exam == slug, Q.c.chapter_id.in_(chunk)))
            for columns, batch in changes.items():
                conn.execute(update(C).where(C.c.exam == slug, C.c.chapter_id == bindparam("_cid"))
                             .values({c: bindparam(c) for c in columns}), batch)
        return plan

    def set_budget(self, slug: str, budget_usd: float) -> None:
        """Set the exam's budget; a raised one resumes an exam that its budget paused."""
        with self._write() as conn:
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
        with self._write() as conn:
            for chunk in _chunks(chapter_ids, 1000):
                conn.execute(update(C).where(C.c.exam == slug, C.c.chapter_id.in_(chunk))
                             .values(**values))

    def resume(self, slug: str) -> list[str]:
        """Clear a pause and reset failed chapters to pending; returns the chapters to enqueue."""
        with self._write() as conn:
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
        with self._write() as conn:
            self._require_exam(conn, slug)
            where = [C.c.exam == slug, C.c.state.in_(ACTIVE_STATES + (ChapterState.failed.value,))]
            if chapter_ids:
                where.append(C.c.chapter_id.in_(chapter_ids))
            return conn.execute(update(C).where(*where).values(
                state=ChapterState.cancelled.value, lease_owner=None, lease_expires_at=None,
                updated_at=self._now)).rowcount

    def pause_exam(self, slug: str, reason: str) -> bool:
        """Stop sending anything for the exam until a person acts (`resume`, a raised budget).
        Running calls finish and are kept. False if it was not active (already paused)."""
        with self._write() as conn:
            return conn.execute(update(E).where(
                E.c.slug == slug, E.c.state == ExamState.active.value).values(
                state=ExamState.paused.value, pause_reason=reason[:500],
                updated_at=self._now)).rowcount == 1


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _plan_chapter(ch: SyllabusChapter, position: int, row: Any, stored: int, regenerate: bool,
                  now: float) -> tuple[str | None, dict[str, Any], bool]:
    """What enqueue does with one chapter: (why it is not enqueued, or None; the columns that
    change; whether its stored questions are deleted first, for --regenerate)."""
    changed = row.spec_hash != ch.spec_hash
    values: dict[str, Any] = {}
    wipe = False
    if regenerate:
        if row.lease_owner is not None and (row.lease_expires_at or 0) > now:
            return "running: cannot regenerate while a worker holds it; retry later", {}, False
        wipe, stored, changed = True, 0, False
        values.update(state=ChapterState.pending.value, attempts_since_progress=0,
                      last_error=None, title=ch.title, prompt=ch.prompt, spec_hash=ch.spec_hash)
    elif changed and stored > 0:
        return (f"changed: title or prompt differs from the {stored} stored questions; "
                f"rerun with --regenerate {ch.id}"), {}, False
    elif changed:
        values.update(title=ch.title, prompt=ch.prompt, spec_hash=ch.spec_hash)
    if row.position != position:
        values["position"] = position
    if row.target != ch.questions:
        values["target"] = ch.questions
    state = values.get("state", row.state)
    why: str | None = None
    if state == ChapterState.cancelled.value:
        why = "cancelled"
    elif stored >= ch.questions:
        why = "done"
        if state != ChapterState.done.value or row.lease_owner is not None:
            values.update(state=ChapterState.done.value, lease_owner=None,
                          lease_expires_at=None)
    elif state in (ChapterState.done.value, ChapterState.failed.value):
        # More questions asked for, or a failed chapter enqueued again by the user.
        values.update(state=ChapterState.pending.value, attempts_since_progress=0)
    if values:
        values["updated_at"] = now
    return why, values, wipe
