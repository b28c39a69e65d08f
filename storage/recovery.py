"""Recovery: what the reconciler needs to bring back chapters no message will deliver, and to
fail chapters past their attempt cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from sqlalchemy import and_, func, or_, select, tuple_, update

from examforge.errors import PauseCode, SliceReason
from storage.base import (ACTIVE_SLICE, BUDGET_PAUSE_PREFIX, HELD_CANCELLED, IN_FLIGHT_CALL,
                          E, K, Q, S)
from storage.base import capped_detail, slice_where
from storage.leases import Leases
from storage.models import (CallOutcome, ChapterState, ExamMode, ExamState, RequeueReason,
                            Verdict, VerifyPolicy)


@dataclass(frozen=True)
class Orphan:
    exam: str
    chapter_id: str
    reason: RequeueReason
    slice_no: int = 0


# A slice as the broker's messages name it: (exam, chapter_id, slice_no).
SliceKey = tuple[str, str, int]


@dataclass(frozen=True)
class LostAudit:
    """What Store.lost_messages found: chapters waiting for a message in the queue's list,
    the messages the list holds, and the chapters to re-publish."""

    waiting: int
    queued: int
    lost: list[SliceKey]


class Recovery(Leases):
    """Orphans, lost messages, chapters at their attempt cap."""

    def orphans(self, grace_s: float, epoch: str | None) -> list[Orphan]:
        """Chapters that need work but that no message will bring to a worker.

        A chapter is orphaned when it is pending with no live lease, its backoff (if any)
        ended more than `grace_s` ago, and either its message was consumed by a worker that
        then vanished (picked after its last enqueue), or the broker
        lost its message (the broker's epoch changed since it was enqueued). Chapters never
        enqueued (a changed chapter awaiting --regenerate) are left alone, except one that a
        worker took (a `producer run`, a `serve --local`) and left with verdicts of its range
        pending, under a policy that verifies: those blind solves are owed, and no message
        would bring them to a worker (RequeueReason.verdicts_pending).
        """
        now = self._now
        vanished = and_(S.c.picked_at.is_not(None), S.c.picked_at >= S.c.enqueued_at,
                        func.coalesce(S.c.lease_expires_at, S.c.picked_at) <= now - grace_s)
        # (The exam's policy is checked on the rows read: a condition on exam.verify, all
        # but a few `off`, makes PostgreSQL's planner start from a scan of the exam table.)
        owed = and_(S.c.enqueued_at.is_(None), S.c.picked_at.is_not(None),
                    func.coalesce(S.c.lease_expires_at, S.c.picked_at) <= now - grace_s,
                    select(Q.c.id).where(
                        Q.c.exam == S.c.exam, Q.c.chapter_id == S.c.chapter_id,
                        Q.c.number >= S.c.first_number,
                        Q.c.number < S.c.first_number + S.c.target,
                        Q.c.verdict == Verdict.pending.value).exists())
        lost = [vanished]
        if epoch is not None:
            lost.append(or_(S.c.enqueue_epoch.is_(None), S.c.enqueue_epoch != epoch))
        free = [
            E.c.state == ExamState.active.value,
            ACTIVE_SLICE,
            # A batch-mode exam's slices are the batch runner's: no chapter task.
            E.c.mode == ExamMode.sync.value,
            or_(S.c.lease_owner.is_(None), S.c.lease_expires_at <= now - grace_s),
            or_(S.c.not_before_at.is_(None), S.c.not_before_at <= now - grace_s),
        ]
        pick = (select(S.c.exam, S.c.chapter_id, S.c.slice_no, S.c.position, E.c.verify,
                       vanished.label("vanished")).join(E, E.c.slug == S.c.exam)
                .order_by(S.c.exam, S.c.position, S.c.slice_no))
        with self._read() as conn:
            # Two reads, not one with an OR between them: each keeps its own plan through
            # the active slices' index (test_history_scale).
            rows = conn.execute(pick.where(
                *free, S.c.enqueued_at.is_not(None),  # never enqueued: left out on purpose
                or_(*lost))).all()
            owing = conn.execute(pick.where(*free, owed)).all()
        found = [(r, RequeueReason.worker_vanished if r.vanished
                  else RequeueReason.broker_epoch_changed) for r in rows]
        found += [(r, RequeueReason.verdicts_pending) for r in owing
                  if r.verify != VerifyPolicy.off.value]
        found.sort(key=lambda f: (f[0].exam, f[0].position, f[0].slice_no))
        return [Orphan(r.exam, r.chapter_id, reason, r.slice_no) for r, reason in found]

    def lost_messages(self, *, min_age_s: float, queued: int,
                      unacked: Iterable[SliceKey], stale: Iterable[SliceKey] = ()
                      ) -> LostAudit:
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

        `stale`: slices whose message a worker has held unacked so long that it is taken as
        gone (tasks.broker.queue_holdings). Those still waiting are the lost ones named first:
        the count says how many are lost, and these are known to be.
        """
        where = [
            E.c.state == ExamState.active.value,
            ACTIVE_SLICE,  # implied by the next: says to SQLite which index holds them
            E.c.mode == ExamMode.sync.value,  # a batch-mode exam waits for no message
            S.c.state == ChapterState.pending.value,
            S.c.enqueued_at.is_not(None),
            S.c.enqueued_at <= self._now - min_age_s,
            or_(S.c.picked_at.is_(None), S.c.picked_at < S.c.enqueued_at),
        ]
        pick = select(S.c.exam, S.c.chapter_id, S.c.slice_no).join(E, E.c.slug == S.c.exam)
        held = sorted(set(unacked))
        with self._read() as conn:
            waiting = conn.execute(select(func.count()).select_from(S)
                                   .join(E, E.c.slug == S.c.exam).where(*where)).scalar_one()
            # Most held messages belong to running or retrying chapters, which are not
            # waiting; the few that are (delivered, not started yet) are found in chunks.
            in_workers: set[SliceKey] = set()
            for i in range(0, len(held), 500):
                in_workers.update((r.exam, r.chapter_id, r.slice_no) for r in conn.execute(
                    pick.where(*where, tuple_(S.c.exam, S.c.chapter_id, S.c.slice_no)
                               .in_(held[i:i + 500]))))
            waiting -= len(in_workers)
            lost: list[SliceKey] = []
            if waiting > queued:
                known: list[SliceKey] = []
                gone = sorted(set(stale) - in_workers)
                for i in range(0, len(gone), 500):
                    known += [(r.exam, r.chapter_id, r.slice_no) for r in conn.execute(
                        pick.where(*where, tuple_(S.c.exam, S.c.chapter_id, S.c.slice_no)
                                   .in_(gone[i:i + 500])))]
                rows = conn.execute(pick.where(*where)
                                    .order_by(S.c.enqueued_at, S.c.position.desc(),
                                              S.c.slice_no.desc())
                                    .limit(waiting - queued + len(in_workers) + len(known))
                                    ).all()
                skip = in_workers | set(known)
                lost = (sorted(known) + [(r.exam, r.chapter_id, r.slice_no) for r in rows
                                         if (r.exam, r.chapter_id, r.slice_no) not in skip]
                        )[:waiting - queued]
        return LostAudit(waiting=waiting, queued=queued, lost=lost)

    def fail_capped(self, max_attempts: int) -> int:
        """Fail chapters that reached their attempt cap without progress."""
        with self._write() as conn:
            capped = conn.execute(
                select(S.c.exam, S.c.chapter_id, S.c.slice_no, S.c.attempts_since_progress,
                       S.c.last_error_code, S.c.last_error).where(
                    ACTIVE_SLICE, S.c.attempts_since_progress >= max_attempts,
                    or_(S.c.lease_owner.is_(None), S.c.lease_expires_at <= self._now))).all()
            for exam, chapter_id, slice_no, attempts, code, detail in capped:
                # Lock order: the exam row before the slice's and its calls' (settling them
                # updates the exam's totals), as every other writer takes them.
                self._exam_first(conn, exam)
                conn.execute(update(S).where(*slice_where(exam, chapter_id, slice_no))
                             .values(state=ChapterState.failed.value, lease_owner=None,
                                     lease_expires_at=None, updated_at=self._now,
                                     last_error_at=self._now,
                                     last_error_code=SliceReason.attempt_cap.value,
                                     last_error=capped_detail(attempts, code, detail)[:1000]))
                self._waste_orphaned_calls(conn, exam, chapter_id, slice_no)
            return len(capped)

    def settle_cancelled(self) -> int:
        """Cancelled slices whose holder kept its lease for the call it was in (see
        Planning.cancel) and then died: the lease has lapsed, so nobody will commit that
        reply. The lease is cleared and the call booked as a crashed one (its worst case, its
        reservation settled), as a takeover would; otherwise it stayed in flight, and its
        reservation held the exam's budget, until the exam was started again."""
        with self._write() as conn:
            lapsed = conn.execute(
                select(S.c.exam, S.c.chapter_id, S.c.slice_no).where(
                    HELD_CANCELLED, S.c.lease_expires_at <= self._now)
                .order_by(S.c.exam, S.c.chapter_id, S.c.slice_no)).all()
            settled = 0
            for exam, chapter_id, slice_no in lapsed:
                self._exam_first(conn, exam)
                cleared = conn.execute(
                    update(S).where(*slice_where(exam, chapter_id, slice_no),
                                    S.c.state == ChapterState.cancelled.value,
                                    S.c.lease_owner.is_not(None),
                                    S.c.lease_expires_at <= self._now)
                    .values(lease_owner=None, lease_expires_at=None, updated_at=self._now))
                if cleared.rowcount:
                    settled += self._waste_orphaned_calls(conn, exam, chapter_id, slice_no)
            return settled

    def settle_orphans(self) -> int:
        """Settle every call in flight whose own holder has no live lease, whatever its
        slice's state now (pending, done, trimmed, cancelled, failed, or deleted by
        --regenerate): booked at its worst case, marked estimated, its reservation released
        (Ledger._settle_orphans), one exam per transaction. Returns how many."""
        with self._read() as conn:
            exams = conn.execute(
                select(K.c.exam).where(IN_FLIGHT_CALL, ~self._holder_live())
                .distinct().order_by(K.c.exam)).scalars().all()
        settled = 0
        for exam in exams:
            with self._write() as conn:
                self._exam_first(conn, exam)
                settled += self._settle_orphans(conn, exam)
        return settled

    def pause_spent(self) -> list[str]:
        """Pause every active exam whose budget has no room left (spent and reserved reach
        it) while it still has work and no call in flight: nothing it could send fits, and
        nothing in flight can free room, so waiting would be forever. Run after
        `settle_orphans`, so that a dead holder's reservation counts as spent, not as a
        call in flight. (A worker that finds no room pauses its exam itself; this catches
        exams no worker is trying, such as one whose budget was lowered below its spend.)
        Returns the exams paused."""
        in_flight = select(K.c.id).where(K.c.exam == E.c.slug, IN_FLIGHT_CALL).exists()
        with self._write() as conn:
            # The exams with work left first, from the active slices' index, then those rows
            # by key: the exam table is all of history (a finished exam's row stays
            # `active`), and the planner would rather scan it than start from the slices.
            work_left = conn.execute(select(S.c.exam).where(ACTIVE_SLICE)
                                     .distinct()).scalars().all()
            if not work_left:
                return []
            spent = and_(E.c.slug.in_(work_left), E.c.state == ExamState.active.value,
                         E.c.budget_usd.is_not(None),
                         E.c.spent_usd + E.c.reserved_usd >= E.c.budget_usd - 1e-12,
                         ~in_flight)
            return list(conn.execute(update(E).where(spent).values(
                state=ExamState.paused.value, updated_at=self._now,
                pause_code=PauseCode.budget.value,
                pause_reason=f"{BUDGET_PAUSE_PREFIX} nothing more fits in the exam's budget "
                             "and no call is in flight; raise it (enqueue --budget-usd) to go on")
                .returning(E.c.slug)).scalars())
