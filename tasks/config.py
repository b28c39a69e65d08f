"""Celery settings that decide whether work is lost or duplicated (see RELIABILITY.md)."""

from __future__ import annotations

from typing import Any

from kombu import Exchange, Queue

from examforge.settings import Settings, is_sentinel_url


def sentinel_transport_options(settings: Settings) -> dict[str, Any]:
    """kombu's SentinelChannel options (issue 34): the master's name, and what the Sentinels
    themselves are asked with. sentinel_kwargs is always given, with the timeouts: redis-py
    copies the socket options onto the Sentinel connections only when it gets none, and a
    Sentinel that is down must not hold a command past BROKER_CONNECT_TIMEOUT_S."""
    if not is_sentinel_url(settings.broker_url):
        return {}
    return {"master_name": settings.broker_sentinel_master,
            "sentinel_kwargs": sentinel_kwargs(settings)}


def sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    """How a Sentinel is asked where the master is: a short timeout, and its own password."""
    kwargs: dict[str, Any] = {"socket_timeout": 2, "socket_connect_timeout": 2}
    password = settings.broker_sentinel_password.get_secret_value()
    if password:
        kwargs["password"] = password
    return kwargs


def celery_config(settings: Settings) -> dict[str, Any]:
    transport = {
        # Redis redelivers an unacked message after this long, even while its first copy still
        # runs; leases in the database are the real gate, so keep it long and the same in all
        # three places (celery/celery#7651), and keep retry countdowns far below it.
        "visibility_timeout": settings.visibility_timeout_s,
        "socket_connect_timeout": 5,
        "socket_timeout": 30,
        "socket_keepalive": True,
        "health_check_interval": 10,
        # kombu sweeps for expired unacked messages every interval x throttle (10 x 10 s by
        # default): one cheap ZRANGE every few seconds keeps redelivery close to the timeout.
        "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_s // 6)),
        "unacked_restore_throttle": 1,
    }
    transport.update(sentinel_transport_options(settings))
    return {
        "broker_url": settings.broker_url,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "visibility_timeout": settings.visibility_timeout_s,
        "broker_connection_retry_on_startup": True,
        # The database is the durable record of outcomes; no result backend to keep in sync.
        # Measured (bench part `shape`, 2 x 64 threads, 1,024 one-call chapters, two runs on
        # 2026-12-05, bench/results-shape-128*.md): a Redis result backend changed throughput
        # by 1.00-1.08x and worker CPU per call by 0.94-1.08x, inside the rounds' spread.
        # Off because nothing reads the results (each chapter task would leave a key in the
        # broker's Redis for a day, Celery's result_expires), not for speed.
        "task_ignore_result": True,
        "task_default_queue": settings.task_queue,
        # Workers consume both queues; the reconciler's own queue keeps a backlog of chapter
        # tasks from delaying recovery (a dedicated `-Q <queue>-control` worker can run it).
        "task_queues": tuple(Queue(q, Exchange(q, type="direct"), routing_key=q)
                             for q in (settings.task_queue, settings.control_queue)),
        "task_routes": {"examforge.reconcile": {"queue": settings.control_queue}},
        # JSON only: pickle over a reachable broker is remote code execution. msgpack (safe
        # too) was measured and does not pay (part `shape`, the same runs): throughput
        # 1.03-1.10x, worker CPU per call 0.92-1.06x, inside the spread; decoding a chapter
        # message takes 16 us in JSON against 8 us in msgpack (timeit, same machine), about
        # 0.1 % of a call's 8 ms of worker CPU. Not worth a dependency.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        # Ack after the task returns; a killed worker's message goes back to the queue.
        # Required for exactly once, so not a tuning knob: the benchmarks never turn it off.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # Messages reserved per thread (bench/README.md, "prefetch", measures 1 against 4).
        # 1. Prefetch 4 (part `shape`, the same runs) gave 0.91x, 1.37x (SQLite) and 1.12x,
        # 1.09x (PostgreSQL) the throughput and 0.89-0.98x the worker CPU per call: not
        # consistent on SQLite, and a SIGKILLed worker's reserved messages then wait
        # VISIBILITY_TIMEOUT_S (2 hours; part `prefetch`: 24 of 64 chapters), which no
        # throughput within this machine's noise is worth.
        "worker_prefetch_multiplier": settings.worker_prefetch_multiplier,
        # A broker outage while late-ack tasks run would otherwise run them twice (#4671).
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # SIGTERM is a warm shutdown bounded by our own window (tasks/app.py); by the time it
        # escalates to a cold shutdown the window is spent, so Celery's soft wait (a fixed sleep
        # in 5.5+) would only delay the exit.
        "worker_soft_shutdown_timeout": 0,
        # Task events cost the worker CPU on every task (about 8 % of a one-call chapter), so
        # they are off until someone watches: Flower switches them on in every worker by itself
        # when it starts (its enable_events broadcast) and sees chapter tasks by name from then
        # on. The durable record is the database (`producer status`), not the events.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "task_track_started": False,
        "worker_hijack_root_logger": False,
        "beat_schedule": {
            "reconcile": {"task": "examforge.reconcile",
                          "schedule": settings.reconcile_interval_s,
                          # A pass that waited ten intervals is stale: a newer one is queued.
                          "options": {"expires": settings.reconcile_interval_s * 10}},
            # Batch mode (runner.batching): a pass finds nothing to do for sync exams.
            "batches": {"task": "examforge.batches", "schedule": settings.batch_poll_s,
                        "options": {"expires": settings.batch_poll_s * 10}},
        },
    }
