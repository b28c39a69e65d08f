"""Enqueue an exam's unfinished slices to Celery: `producer enqueue` and the API's runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from examforge.settings import Settings
from examforge.syllabus import Syllabus
from storage.models import ExamMode

if TYPE_CHECKING:
    from storage import Store
    from storage.store import EnqueuePlan


def enqueue_exam(settings: Settings, store: Store, slug: str, syllabus: Syllabus, *,
                 regenerate: Sequence[str] = (), budget_usd: float | None = None,
                 before_write: Callable[[], None] | None = None,
                 batch: bool | None = None, verify: str | None = None,
                 discard_reviewed: bool = False,
                 warn: Callable[[str], None] | None = None) -> EnqueuePlan:
    """Check the broker, record the exam and cut its chapters into slices (`sync_exam`),
    then publish one message per unfinished slice. The broker is checked before anything is
    written; `before_write` runs between the two (the CLI's warnings). With `batch` (default
    LLM_BATCH) the exam is generated through the provider's Batch API: no chapter task is
    published, one batch pass is (runner.batching); without, it goes back to sync mode.
    `verify` sets the exam's blind-solve policy (None: the exam keeps its own; a new exam
    gets this process's VERIFY). `regenerate` keeps each chapter's reviewed questions unless
    `discard_reviewed` (storage.regeneration)."""
    # Celery only here: the CLI's commands and a `serve --local` import this module and must
    # not pay Celery's start-up (about 0.3 s) unless they publish.
    from producer.grounding import exam_material
    from tasks.app import app_for
    from tasks.broker import broker_epoch, check_broker, publish_work

    # The chapters' sources read (and refused, with nothing written) before anything else.
    material = exam_material(settings, slug, syllabus, store, warn)
    app = app_for(settings)
    check_broker(app, settings)  # before writing anything
    if before_write is not None:
        before_write()
    plan = store.sync_exam(slug, syllabus, regenerate, budget_usd=budget_usd,
                           default_budget_usd=settings.budget_usd,
                           slice_questions=settings.slice_questions, material=material,
                           verify=verify, default_verify=settings.verify,
                           batch_mode=settings.llm_batch if batch is None else batch,
                           discard_reviewed=discard_reviewed)
    batch = settings.llm_batch if batch is None else batch
    store.set_exam_mode(slug, ExamMode.batch if batch else ExamMode.sync)
    if plan.slices:
        # Marked before publishing: a worker's pick-up always reads as after its enqueue.
        publish_work(app, store, slug, plan.slices, broker_epoch(app, settings))
    return plan
