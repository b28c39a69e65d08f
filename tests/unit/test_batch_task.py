"""The Celery task's batch runtime is built on a worker's first task, whichever task that
is: building it must not wait on the lock that building the chapter runtime takes (a batch
pass that was a worker's first task hung the worker)."""

from __future__ import annotations

import importlib
import threading
from types import SimpleNamespace

# The module (the package's `app` attribute is the Celery app itself).
app_module = importlib.import_module("tasks.app")


def test_the_first_batch_pass_of_a_worker_builds_both_runtimes(monkeypatch, make_settings):
    settings = make_settings()
    fake = SimpleNamespace(settings=settings, store=object())
    monkeypatch.setattr(app_module, "_runtime", None)
    monkeypatch.setattr(app_module, "_batch_runtime", None)
    monkeypatch.setattr(app_module, "load_settings", lambda: settings)
    monkeypatch.setattr(app_module, "build_runtime", lambda s: fake)
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(app_module.batch_runtime()), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "batch_runtime() deadlocked on the runtime lock"
    assert got[0].store is fake.store and app_module._runtime is fake
    got[0].close()
