"""The `latency` part's tracer (bench/parts/latency.py), loaded by the worker processes it
starts: this folder first on their PYTHONPATH makes Python import it at start-up, before
Celery. Nothing happens unless BENCH_TRACE_DIR is set. Never part of examforge itself.

It wraps, once the first task starts (everything is imported by then), the steps of a paid
call that can wait: the claim, the model call, the commit, a thread's wait for its group
commit (another thread leads it), and a group's transaction (the writer's hold). Each span is
recorded with the calling thread's CPU time over it, and each task's span between Celery's
task_prerun and task_postrun, so that the gap between one task and the next on a thread
(Celery's ack and the next message's delivery) is read off too. Spans are kept in memory and
written out every second as JSON lines, one file a process: [thread, step, start, end, cpu].

Why by hand: py-spy samples where threads are, not how long each step of each call waited;
the figures here are each step's own wall time against its CPU time.
"""

from __future__ import annotations

import os

_DIR = os.environ.get("BENCH_TRACE_DIR")

if _DIR:
    import json
    import sys
    import threading
    import time

    _spans: list[tuple[int, str, float, float, float]] = []
    _lock = threading.Lock()
    _done = [False]
    _started: dict[int, float] = {}

    def _wrap(owner: object, name: str, step: str) -> None:
        inner = getattr(owner, name)

        def traced(*args: object, **kwargs: object) -> object:
            t0, c0 = time.monotonic(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                # list.append is atomic under the interpreter lock
                _spans.append((threading.get_ident(), step, t0, time.monotonic(),
                               time.thread_time() - c0))
        setattr(owner, name, traced)

    def _patch() -> None:
        with _lock:
            if _done[0]:
                return
            _done[0] = True
        import httpx

        _wrap(httpx.Client, "send", "http")
        if "tasks.app" not in sys.modules:  # the minimal task: its HTTP call only
            return
        import runner.pipeline as pipeline
        import storage.base as base
        import storage.group as group
        from storage.leases import Leases
        from storage.ledger import Ledger

        _wrap(pipeline, "_call", "model call")
        _wrap(pipeline._Calls, "plan", "plan")
        _wrap(Leases, "claim", "claim")
        _wrap(Ledger, "commit_batch", "commit")
        _wrap(group._Signal, "wait", "group wait")
        _wrap(group.GroupCommit, "_commit", "group transaction")
        _wrap(base._Turn, "__enter__", "writer turn")

    _flushing = threading.Lock()

    def _flush(folder: str = _DIR) -> None:
        with _flushing:  # the writer thread and the exit hook
            taken = []
            while _spans:
                taken.append(_spans.pop())
            if taken:
                with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as out:
                    out.write("".join(json.dumps(s) + "\n" for s in taken))

    def _writer() -> None:
        while True:
            time.sleep(1.0)
            _flush()

    from celery import signals

    @signals.task_prerun.connect(weak=False)
    def _prerun(**_: object) -> None:
        _patch()
        _started[threading.get_ident()] = time.monotonic()

    @signals.task_postrun.connect(weak=False)
    def _postrun(**_: object) -> None:
        end = time.monotonic()
        tid = threading.get_ident()
        _spans.append((tid, "task", _started.pop(tid, end), end, 0.0))

    import atexit

    atexit.register(_flush)
    threading.Thread(target=_writer, name="bench-tracer", daemon=True).start()
