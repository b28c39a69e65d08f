"""Where a run's work goes: to Celery (the default, any number of replicas and workers on one
Redis and one database) or into this process (`serve --local`, as `producer run` does).

Each mode imports what only it needs inside its own class: Celery and kombu (`tasks`, about
0.3 s and 330 modules) for CeleryWork, the pipeline and its LLM client (`runner`, about 0.2 s)
for LocalWork, so a server loads one of them and never both. No cycle is behind it: `tasks`
and `runner` sit below `producer` and import nothing of it."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

from examforge.errors import DatabaseCorrupt
from examforge.settings import Settings
from examforge.syllabus import Syllabus
from producer.enqueueing import enqueue_exam
from storage.models import ExamMode

if TYPE_CHECKING:
    from storage import Store
    from storage.store import EnqueuePlan

log = logging.getLogger("examforge.api")


class Work(Protocol):
    mode: str

    def check(self) -> None:
        """Raise BrokerUnavailable if the work could not be handed on now."""

    def start(self, slug: str, syllabus: Syllabus, budget_usd: float | None,
              batch: bool = False, verify: str | None = None) -> EnqueuePlan:
        """Record the exam's slices, set its mode (batch: the provider's Batch API) and its
        blind-solve policy (`verify`; None keeps the exam's), and hand the unfinished ones
        to whoever does them."""

    def resume(self, slug: str, slices: list[tuple[str, int]]) -> None:
        """Work on an open run's unfinished slices again: in --local, those the sweep finds
        (after a restart, or a thread that stopped); in both modes, the slices a rejection
        during the run reopened (Celery's reconciler re-publishes what messages lost)."""

    def close(self) -> None: ...


class CeleryWork:
    """`enqueue`'s code path, shared (producer/enqueueing.py)."""

    mode = "celery"

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings, self.store = settings, store

    def check(self) -> None:
        from tasks.app import app_for
        from tasks.broker import check_broker

        check_broker(app_for(self.settings), self.settings)

    def start(self, slug: str, syllabus: Syllabus, budget_usd: float | None,
              batch: bool = False, verify: str | None = None) -> EnqueuePlan:
        # batch: one batch pass is published (the workers' examforge.batches), no chapter task.
        return enqueue_exam(self.settings, self.store, slug, syllabus, budget_usd=budget_usd,
                            batch=batch, verify=verify)

    def resume(self, slug: str, slices: list[tuple[str, int]]) -> None:
        """Publish the slices' messages (marked enqueued first): what a rejection during an
        open run hands on. The reconciler re-publishes what a failed publish leaves
        (`Store.unqueued_slices`) and what the broker lost."""
        if not slices:
            return
        from tasks.app import app_for
        from tasks.broker import broker_epoch, publish_work

        app = app_for(self.settings)
        publish_work(app, self.store, slug, slices, broker_epoch(app, self.settings))

    def close(self) -> None:
        pass


class LocalWork:
    """`producer run`'s code path (runner/local.py) in threads of this process, none of
    them tied to a request: a client that goes away stops nothing.

    One thread per exam, at most: a new run of an exam that a thread already works on hands
    its slices to that thread (`run_local`'s `more`), and so does the sweep that resumes the
    unfinished slices of open runs (after a restart, or when a thread stopped), so no slice is
    worked twice by one process. Several processes on one database (two `serve --local`, or
    `producer run` beside one) are safe too: the slices' leases decide who works on what."""

    mode = "local"

    def __init__(self, settings: Settings, store: Store) -> None:
        from runner.pipeline import Runtime

        self.settings, self.store = settings, store
        self.rt = Runtime.build(settings, store)
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._fed: dict[str, list[tuple[str, int]]] = {}  # slices for the exam's thread
        # Batch mode: one thread per exam running batch passes (`producer run --batch`'s
        # loop), with one BatchRuntime for the process, built at the first batch run.
        self._batch_rt: Any = None
        self._batch_threads: dict[str, threading.Thread] = {}

    def check(self) -> None:
        pass

    def start(self, slug: str, syllabus: Syllabus, budget_usd: float | None,
              batch: bool = False, verify: str | None = None) -> EnqueuePlan:
        from producer.grounding import exam_material

        material = exam_material(self.settings, slug, syllabus, self.store)
        plan = self.store.sync_exam(slug, syllabus, budget_usd=budget_usd,
                                    default_budget_usd=self.settings.budget_usd,
                                    slice_questions=self.settings.slice_questions,
                                    material=material, verify=verify,
                                    default_verify=self.settings.verify, batch_mode=batch)
        self.store.set_exam_mode(slug, ExamMode.batch if batch else ExamMode.sync)
        if plan.exam_paused is None:
            self.resume(slug, plan.slices)
        return plan

    def resume(self, slug: str, slices: list[tuple[str, int]]) -> None:
        """Have this process work on the exam's `slices`: given to the exam's thread if it
        has one, else to a new one. A batch-mode exam gets a batch thread instead, which
        submits its slices to the provider's Batch API and polls its batches."""
        if self.rt.stopping.is_set():
            return
        if self.store.exam_mode(slug) is ExamMode.batch:
            if slices or self.store.live_batches(slug):
                self._resume_batches(slug)
            return
        if not slices:
            return
        with self._lock:
            self._fed.setdefault(slug, []).extend(slices)
            if slug in self._threads:
                return
            thread = threading.Thread(target=self._run, args=(slug,), name=f"run-{slug}",
                                      daemon=True)
            self._threads[slug] = thread
            thread.start()

    def working_on(self) -> list[str]:
        """The exams this process's threads work on now."""
        with self._lock:
            return sorted(set(self._threads) | set(self._batch_threads))

    def _take(self, slug: str) -> list[tuple[str, int]]:
        with self._lock:
            return self._fed.pop(slug, [])

    def _run(self, slug: str) -> None:
        from runner.local import run_local

        try:
            while True:
                run_local(self.rt, slug, [], self.settings.api_local_concurrency,
                          more=lambda: self._take(slug))
                with self._lock:  # ends only with nothing fed: no slice falls between
                    if not self._fed.get(slug) or self.rt.stopping.is_set():
                        self._fed.pop(slug, None)
                        del self._threads[slug]
                        return
        except Exception as exc:  # the run's state is in the database; say why it stopped
            if isinstance(exc, DatabaseCorrupt):  # one line: the trace says nothing more
                log.error("local run stopped: %s", exc, extra={"exam": slug})
            else:
                log.exception("local run stopped", extra={"exam": slug})
            with self._lock:
                self._threads.pop(slug, None)

    def _resume_batches(self, slug: str) -> None:
        from runner.batching import BatchRuntime

        with self._lock:
            if slug in self._batch_threads:
                return
            if self._batch_rt is None:
                self._batch_rt = BatchRuntime.build(self.settings, self.store)
            thread = threading.Thread(target=self._run_batches, args=(slug,),
                                      name=f"batches-{slug}", daemon=True)
            self._batch_threads[slug] = thread
            thread.start()

    def _run_batches(self, slug: str) -> None:
        """Batch passes for the exam every BATCH_POLL_S (sooner when a backoff ends) until
        nothing is left to submit and no batch of it is live; a paused exam's live batches
        are still collected (they are paid for)."""
        from runner.batching import run_pass

        rt = self._batch_rt
        try:
            while not rt.stopping.is_set():
                run_pass(rt, [slug])
                report = self.store.status(slug)
                live = self.store.live_batches(slug)
                if not live and (report.finished or report.state == "paused"):
                    break
                wait = self.store.next_batch_wait(slug)
                rt.stopping.wait(self.settings.batch_poll_s if wait is None
                                 else min(self.settings.batch_poll_s, max(0.1, wait)))
        except Exception as exc:
            if isinstance(exc, DatabaseCorrupt):
                log.error("batch run stopped: %s", exc, extra={"exam": slug})
            else:
                log.exception("batch run stopped", extra={"exam": slug})
        finally:
            with self._lock:
                self._batch_threads.pop(slug, None)

    def close(self) -> None:
        """Like Ctrl-C in `producer run`: running calls finish and commit, nothing new is
        paid for; what is left resumes at the next start (a provider batch goes on at the
        provider and is collected then)."""
        self.rt.stopping.set()
        if self._batch_rt is not None:
            self._batch_rt.stopping.set()
        with self._lock:
            threads = list(self._threads.values()) + list(self._batch_threads.values())
        for thread in threads:
            thread.join(timeout=self.settings.call_timeout_s + 5)
        self.rt.close()
        if self._batch_rt is not None:
            self._batch_rt.close()
