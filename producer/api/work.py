"""Where a run's work goes: to Celery (the default, any number of replicas and workers on one
Redis and one database) or into this process (`serve --local`, as `producer run` does)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol

from examforge.settings import Settings
from examforge.syllabus import Syllabus

if TYPE_CHECKING:
    from storage import Store
    from storage.store import EnqueuePlan

log = logging.getLogger("examforge.api")


class Work(Protocol):
    mode: str

    def check(self) -> None:
        """Raise BrokerUnavailable if the work could not be handed on now."""

    def start(self, slug: str, syllabus: Syllabus, budget_usd: float | None) -> EnqueuePlan:
        """Record the exam's slices and hand the unfinished ones to whoever does them."""

    def close(self) -> None: ...


class CeleryWork:
    """`enqueue`'s code path, shared (producer/enqueueing.py)."""

    mode = "celery"

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings, self.store = settings, store

    def check(self) -> None:
        from tasks import app
        from tasks.broker import check_broker

        check_broker(app, self.settings)

    def start(self, slug: str, syllabus: Syllabus, budget_usd: float | None) -> EnqueuePlan:
        from producer.enqueueing import enqueue_exam

        return enqueue_exam(self.settings, self.store, slug, syllabus, budget_usd=budget_usd)

    def close(self) -> None:
        pass


class LocalWork:
    """`producer run`'s code path (producer/local.py), one thread per started run, none of
    them tied to a request: a client that goes away stops nothing. Two runs of one exam at
    once are safe: the slices' leases decide who works on what."""

    mode = "local"

    def __init__(self, settings: Settings, store: Store) -> None:
        from examforge.pipeline import Runtime

        self.settings, self.store = settings, store
        self.rt = Runtime.build(settings, store)
        self.threads: list[threading.Thread] = []

    def check(self) -> None:
        pass

    def start(self, slug: str, syllabus: Syllabus, budget_usd: float | None) -> EnqueuePlan:
        plan = self.store.sync_exam(slug, syllabus, budget_usd=budget_usd,
                                    default_budget_usd=self.settings.budget_usd,
                                    slice_questions=self.settings.slice_questions)
        if plan.slices and plan.exam_paused is None:
            thread = threading.Thread(target=self._run, args=(slug, plan.slices),
                                      name=f"run-{slug}", daemon=True)
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
            thread.start()
        return plan

    def _run(self, slug: str, slices: list[tuple[str, int]]) -> None:
        from producer.local import run_local

        try:
            run_local(self.rt, slug, slices, self.settings.api_local_concurrency)
        except Exception:  # the run's state is in the database; say why it stopped
            log.exception("local run stopped", extra={"exam": slug})

    def close(self) -> None:
        """Like Ctrl-C in `producer run`: running calls finish and commit, nothing new is
        paid for; what is left resumes at the next start."""
        self.rt.stopping.set()
        for thread in self.threads:
            thread.join(timeout=self.settings.llm_timeout_s + 5)
        self.rt.close()
