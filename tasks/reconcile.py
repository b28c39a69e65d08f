"""One reconcile pass: make the queue match the database again.

- Chapters a worker took and then vanished with, and every unfinished chapter when the broker
  lost its data (its epoch changed): re-enqueued (`Store.orphans`).
- Chapters whose message the queue lost while the epoch survived (a failover to a lagging
  replica, an evicting `maxmemory-policy`, `celery purge`, a deleted key): found by comparing
  what the broker holds for the queue with what the database says waits in it
  (`Store.lost_messages`), and re-published. The broker is read first and the database after:
  a chapter that moves on between the two reads can then only make the queue look fuller than
  it is, never emptier, so a complete queue is never re-published.
- Chapters past their attempt cap: failed.
- Calls in flight on cancelled chapters whose holder died (it kept its lease through the
  cancel to commit the reply): booked as crashed calls, their budget reservation settled.
- Every other call in flight whose holder has no live lease, whatever its slice's state now
  (done by an import, trimmed, regenerated, failed, or pending for a claim that may never
  come): booked the same way, so no reservation outlives its call.
- Slices of an exam with an open run that a reviewer's rejection reopened and that no
  message will bring to a worker (`Store.unqueued_slices`): published, so the run ends.
- Active exams with a budget that has no room left, work left and no call in flight: paused
  with a reason naming the budget, instead of waiting for room that cannot come.

Safe to run anywhere, any number of times: a duplicate message is a no-op at the worker.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Iterable

from celery import Celery

from examforge.settings import Settings
from storage.store import RequeueReason, SliceKey, Store
from tasks.broker import (QueueHoldings, broker_epoch, origin_headers, publish_slices,
                          queue_holdings)

log = logging.getLogger("examforge.reconcile")

# Between the two reads of the broker: longer than a message spends between leaving the list
# and entering the unacked hash (two round trips of the worker that took it).
_SECOND_READ_AFTER_S = 0.05


def reconcile_once(settings: Settings, store: Store, app: Celery) -> dict[str, int]:
    failed = store.fail_capped(settings.max_attempts)
    settled = store.settle_cancelled()
    orphaned = store.settle_orphans()
    paused = store.pause_spent()
    for exam in paused:
        log.warning("exam paused: its budget has no room left", extra={"exam": exam})
    epoch = broker_epoch(app, settings)
    holdings = _read_twice(app, settings)
    # Grace: one heartbeat, so a message that was just picked up gets the chance to claim.
    orphans = store.orphans(grace_s=settings.heartbeat_interval_s, epoch=epoch)
    by_reason: dict[RequeueReason, list[SliceKey]] = defaultdict(list)
    for orphan in orphans:
        by_reason[orphan.reason].append((orphan.exam, orphan.chapter_id, orphan.slice_no))
    for reason, chapters in by_reason.items():
        _requeue(settings, store, app, epoch, chapters, reason, _WHY[reason])
    # Reopened by a reviewer during an open run, and no message published for them (the
    # API hands them on when it rejects; this is what a failed publish leaves): the run
    # would say `running` for ever with nothing left to do.
    reopened = store.unqueued_slices()
    if reopened:
        _requeue(settings, store, app, epoch, reopened, RequeueReason.reopened,
                 "a reviewer's rejection reopened it during an open run")
    lost = 0
    if holdings is not None and RequeueReason.broker_epoch_changed not in by_reason:
        # Published at least two passes ago, so its message had time to reach the broker.
        audit = store.lost_messages(min_age_s=2 * settings.reconcile_interval_s,
                                    queued=holdings.queued, unacked=holdings.unacked,
                                    stale=holdings.stale)
        if audit.lost:
            why = (f"the queue held {audit.queued} messages for {audit.waiting} slices "
                   "waiting in it")
            _requeue(settings, store, app, epoch, audit.lost, RequeueReason.message_lost, why)
            lost = len(audit.lost)
    return {"requeued": len(orphans) + lost + len(reopened), "requeued_lost": lost,
            "requeued_reopened": len(reopened), "failed_at_cap": failed,
            "settled_cancelled": settled, "settled_orphans": orphaned,
            "paused_budget": len(paused)}


_WHY = {
    RequeueReason.worker_vanished: "a worker took its message, then lost its lease",
    RequeueReason.verdicts_pending: "its run stopped with blind solves of its questions "
                                    "owed (verdicts pending), and no message would bring them",
    RequeueReason.broker_epoch_changed: "the broker lost its data (restart without "
                                        "persistence, FLUSHALL)",
}


def _read_twice(app: Celery, settings: Settings) -> QueueHoldings | None:
    """The broker's holdings, read twice a moment apart: a message caught between the list and
    the unacked hash in one read is in one of them in the other."""
    first = queue_holdings(app, settings)
    if first is None:
        return None
    time.sleep(_SECOND_READ_AFTER_S)
    second = queue_holdings(app, settings)
    assert second is not None
    unacked = set(first.unacked) | set(second.unacked)
    return QueueHoldings(max(first.queued, second.queued), sorted(unacked),
                         sorted((set(first.stale) | set(second.stale)) - unacked))


def _requeue(settings: Settings, store: Store, app: Celery, epoch: str | None,
             slices: Iterable[SliceKey], reason: RequeueReason, why: str) -> None:
    by_exam: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for exam, chapter_id, slice_no in slices:
        by_exam[exam].append((chapter_id, slice_no))
    for exam, refs in by_exam.items():
        # Marked before publishing, so a worker's pick-up always reads as after the enqueue:
        # if that worker dies too, the slice is an orphan again.
        store.mark_enqueued(exam, refs, epoch, requeue=(reason, why))
        publish_slices(app, exam, refs, origin_headers(store))
        names = [f"{c}:{n}" for c, n in refs[:20]]
        log.warning("re-enqueued slices", extra={
            "exam": exam, "reason": reason.value, "why": why, "count": len(refs),
            "slices": ",".join(names) + ("..." if len(refs) > 20 else "")})
