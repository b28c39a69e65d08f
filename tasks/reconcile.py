"""One reconcile pass: re-enqueue orphaned chapters, fail chapters past their attempt cap."""

from __future__ import annotations

import logging
from collections import defaultdict

from celery import Celery

from examforge.settings import Settings
from storage.store import Store
from tasks.broker import broker_epoch, publish_chapters

log = logging.getLogger("examforge.reconcile")


def reconcile_once(settings: Settings, store: Store, app: Celery) -> dict[str, int]:
    """Make the queue match the database again. Safe to run anywhere, any number of times:
    a duplicate message is a no-op at the worker."""
    failed = store.fail_capped(settings.max_attempts)
    epoch = broker_epoch(app, settings)
    # Grace: one heartbeat, so a message that was just picked up gets the chance to claim.
    orphans = store.orphans(grace_s=settings.heartbeat_interval_s, epoch=epoch)
    by_exam: dict[str, list[str]] = defaultdict(list)
    for exam, chapter_id in orphans:
        by_exam[exam].append(chapter_id)
    for exam, chapter_ids in by_exam.items():
        # Marked before publishing, so a worker's pick-up always reads as after the enqueue:
        # if that worker dies too, the chapter is an orphan again.
        store.mark_enqueued(exam, chapter_ids, epoch)
        publish_chapters(app, exam, chapter_ids)
        log.warning("re-enqueued orphaned chapters",
                    extra={"exam": exam, "chapters": ",".join(chapter_ids)})
    return {"requeued": len(orphans), "failed_at_cap": failed}
