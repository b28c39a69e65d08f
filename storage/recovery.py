"""Recovery: what the reconciler needs to bring back chapters no message will deliver, and to
fail chapters past their attempt cap."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from sqlalchemy import and_, func, or_, select, tuple_, update

from storage.base import ACTIVE_STATES, C, E
from storage.leases import Leases
from storage.models import ChapterState, ExamState


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


class Recovery(Leases):
    """Orphans, lost messages, chapters at their attempt cap."""

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
        with self._write() as conn:
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
