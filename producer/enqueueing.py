"""Enqueue an exam's unfinished slices to Celery: `producer enqueue` and the API's runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from examforge.settings import Settings
from examforge.syllabus import Syllabus

if TYPE_CHECKING:
    from storage import Store
    from storage.store import EnqueuePlan


def enqueue_exam(settings: Settings, store: Store, slug: str, syllabus: Syllabus, *,
                 regenerate: Sequence[str] = (), budget_usd: float | None = None,
                 before_write: Callable[[], None] | None = None) -> EnqueuePlan:
    """Check the broker, record the exam and cut its chapters into slices (`sync_exam`),
    then publish one message per unfinished slice. The broker is checked before anything is
    written; `before_write` runs between the two (the CLI's warnings)."""
    from tasks import app
    from tasks.broker import broker_epoch, check_broker, origin_headers, publish_slices

    check_broker(app, settings)  # before writing anything
    if before_write is not None:
        before_write()
    plan = store.sync_exam(slug, syllabus, regenerate, budget_usd=budget_usd,
                           default_budget_usd=settings.budget_usd,
                           slice_questions=settings.slice_questions)
    if plan.slices:
        epoch = broker_epoch(app, settings)
        # Marked before publishing: a worker's pick-up always reads as after its enqueue.
        store.mark_enqueued(slug, plan.slices, epoch)
        publish_slices(app, slug, plan.slices, origin_headers(store))
    return plan
