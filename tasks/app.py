"""Thin Celery tasks: unpack arguments, call the plain function, turn its result into Celery's
retry mechanism. All the logic is in `runner.pipeline` and `tasks.reconcile`."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

from celery import Celery
from celery.signals import setup_logging, worker_init, worker_ready, worker_shutting_down
from sqlalchemy.exc import InterfaceError, OperationalError

from examforge.errors import ConfigError, DatabaseCorrupt, DatabaseUnavailable
from runner.pipeline import Runtime, process_chapter
from examforge.settings import Settings, load_settings

from tasks.broker import BATCH_TASK, CHAPTER_TASK
from tasks.config import celery_config
from tasks.patches import patch_kombu_redis_close_race

patch_kombu_redis_close_race()

log = logging.getLogger("examforge.tasks")


def _exit_on_config_error(exc: ConfigError | DatabaseCorrupt) -> NoReturn:
    """A configuration mistake is a user error, as in the CLI: one line, exit 2 (a damaged
    database: exit 4)."""
    sys.stderr.write(f"error: {exc}\n")
    sys.stderr.flush()
    raise SystemExit(exc.exit_code)


try:
    _settings_at_start = load_settings()
except ConfigError as _exc:
    # Celery would wrap any exception here in "Unable to load celery application" and a
    # traceback.
    _exit_on_config_error(_exc)

app = Celery("examforge")
app.conf.update(celery_config(_settings_at_start))


def _config_key(settings: Settings) -> str:
    return json.dumps(celery_config(settings), sort_keys=True, default=str)


_app_key = _config_key(_settings_at_start)
# Apps for other configurations, the most recently used last; a few at most (kombu keeps the
# connection pools, one per broker, whichever app asks: closing an app pushed out deregisters
# it and closes none of them).
_publishers: dict[str, Celery] = {}
_publishers_lock = threading.Lock()
_PUBLISHERS_KEPT = 4


def app_for(settings: Settings) -> Celery:
    """The Celery app that publishes under `settings`. `app` is configured once, from the
    settings of the moment this module is imported, because Celery's worker finds it at
    module level. A command or the API run with settings of their own (an embedding program's
    or a test's, loaded after that import) must publish to their broker and queue, not the
    import's: they get `app` itself when their Celery configuration is the import's (a
    process's usual case, and the bench's tuned app), else an app configured from them, one
    per configuration (the last few kept). Tasks are published by name (send_task), so that
    app needs none registered."""
    key = _config_key(settings)
    if key == _app_key:
        return app
    with _publishers_lock:
        own = _publishers.pop(key, None)
        if own is None:
            own = Celery("examforge", set_as_current=False)
            own.conf.update(celery_config(settings))
        _publishers[key] = own
        while len(_publishers) > _PUBLISHERS_KEPT:
            _publishers.pop(next(iter(_publishers))).close()
        return own

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
# The worker's main process (prefork children run tasks in processes of their own), and
# whether this process has already said its database is damaged.
_main_pid = os.getpid()
_damage_reported = False


def runtime() -> Runtime:
    """The worker's runtime, built once per process on first use (threads share it)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = build_runtime(load_settings())
        return _runtime


def build_runtime(settings: Settings) -> Runtime:
    from examforge.llm import LLMClient
    from examforge.ratelimit import redis_limiters
    from storage import open_store
    from tasks.broker import broker_redis, is_redis

    # The provider's rate limit is shared by every worker process through the broker's Redis
    # (Celery's own rate_limit is per worker), through Sentinel where the broker is.
    limiters = redis_limiters(broker_redis(settings)) if is_redis(settings) else None
    if limiters is None:
        log.warning("broker is not Redis: each worker applies LLM_RPM/LLM_TPM on its own")
    return Runtime.build(settings, open_store(settings.database_url,
                                              pool_size=settings.db_pool_size,
                                              background_checkpoint=True),
                         LLMClient(settings, limiters=limiters))


@app.task(
    bind=True,
    name=CHAPTER_TASK,
    acks_late=True,
    max_retries=None,  # attempts are counted and capped in the database, which survives
    # Database hiccups are transient too; Celery's own backoff handles them (the one retry
    # policy examforge.retry leaves to Celery: a database down cannot record a decision).
    autoretry_for=(OperationalError, InterfaceError, DatabaseUnavailable),
    retry_backoff=_settings_at_start.db_retry_base_s,
    retry_backoff_max=_settings_at_start.db_retry_max_s,
    retry_jitter=True,
)
def generate_chapter(self, exam: str, chapter_id: str, slice_no: int = 0) -> dict[str, object]:  # type: ignore[no-untyped-def]
    # slice_no defaults to 0: a message published before chapters had slices names none.
    try:
        rt = runtime()
        _check_origin(self.request, rt)
        result = process_chapter(rt, exam, chapter_id, slice_no)
    except DatabaseCorrupt as exc:
        _stop_on_damage(exc)
        return {"outcome": "stopped", "detail": "database damaged", "calls": 0}
    if result.outcome == "retry":
        # Not autoretry_for: the countdown must honour Retry-After and the lease expiry, which
        # the plain function computed. Same task id, a new message; ours is acked on return.
        raise self.retry(countdown=result.retry_in_s, exc=None)
    return {"outcome": result.outcome, "detail": result.detail, "calls": result.calls}


# A worker on another database than the message's puts the message back after this long: not
# at once, or it would take it again at once, in a loop, while the right worker starves.
OTHER_DATABASE_REQUEUE_S = 5.0
# Its warning once a minute per database, not once per message.
OTHER_DATABASE_WARN_EVERY_S = 60.0
_warned_at: dict[str, float] = {}


def _check_origin(request: object, rt: Runtime) -> None:
    """Leave a message published from another database for a worker on that one (a
    producer and a worker on different databases would otherwise wait forever, silently:
    this worker finds no work in its own and acks). A message without the header (a
    producer older than database ids) is taken, as before."""
    import time

    from celery.exceptions import Reject

    from tasks.broker import DATABASE_HEADER, DATABASE_ID_HEADER

    headers = getattr(request, "headers", None) or {}
    sent_from = getattr(request, DATABASE_ID_HEADER, None) or headers.get(DATABASE_ID_HEADER)
    if not sent_from or sent_from == rt.store.database_id():
        return
    where = getattr(request, DATABASE_HEADER, None) or headers.get(DATABASE_HEADER) or "?"
    now = time.monotonic()
    if now - _warned_at.get(sent_from, -OTHER_DATABASE_WARN_EVERY_S) >= \
            OTHER_DATABASE_WARN_EVERY_S:
        _warned_at[sent_from] = now
        log.warning(
            "task from another database, left for a worker on that one: the message's is %s "
            "(id %s), this worker's is %s (id %s); set the same DATABASE_URL (an absolute "
            "path for SQLite) for the producer and the workers", where, sent_from,
            rt.store.database_label(), rt.store.database_id())
    time.sleep(OTHER_DATABASE_REQUEUE_S)
    raise Reject(f"published from database {sent_from}, not this worker's", requeue=True)


@app.task(name="examforge.reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    from tasks.reconcile import reconcile_once

    try:
        return reconcile_once(runtime().settings, runtime().store, app)
    except DatabaseCorrupt as exc:
        _stop_on_damage(exc)
        return {}


_batch_runtime = None


def batch_runtime():  # type: ignore[no-untyped-def]
    """The worker's batch runtime (runner.batching), built once per process."""
    global _batch_runtime
    from runner.batching import BatchRuntime

    rt = runtime()  # outside the lock: runtime() takes it too (it is not reentrant)
    with _runtime_lock:
        if _batch_runtime is None:
            _batch_runtime = BatchRuntime.build(rt.settings, rt.store)
        return _batch_runtime


@app.task(bind=True, name=BATCH_TASK, ignore_result=True, acks_late=True)
def batches(self) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """One batch pass (runner.batching.run_pass): recover, poll, process, submit. Beat
    sends it every BATCH_POLL_S and `enqueue --batch` once; passes in several workers at
    once are safe (each submission is taken under a lease, each call settled once)."""
    from runner.batching import run_pass

    try:
        rt = batch_runtime()
        _check_origin(self.request, runtime())
        return run_pass(rt).as_dict()
    except DatabaseCorrupt as exc:
        _stop_on_damage(exc)
        return {}


def _stop_on_damage(exc: DatabaseCorrupt) -> None:
    """A damaged database fails every task the same way, and retrying only loops: say so in
    one log line (no traceback), stop taking tasks and shut the worker down with exit code 4
    (DatabaseCorrupt.exit_code). The task then returns (any exception would put a traceback
    in Celery's log), so its message is acked and no worker loops on it: after a restore,
    `enqueue` publishes every unfinished slice again, and the reconciler re-publishes those
    whose message is gone."""
    global _damage_reported
    with _runtime_lock:
        first, _damage_reported = not _damage_reported, True
    if first:
        log.critical("%s; this worker shuts down (exit %d)", exc, exc.exit_code)
        if _runtime is not None:
            _runtime.stopping.set()  # the other running chapters hand back after their call
        # The main process's SIGUSR2 handler (installed at worker_init) asks Celery's loop to
        # stop with our exit code; a prefork child reaches its parent the same way.
        os.kill(_main_pid, signal.SIGUSR2)


def _request_stop(signum: int, frame: object) -> None:
    from celery.worker import state

    # Read by Celery's consumer loop at each turn (state.maybe_shutdown): a warm shutdown
    # whose exit code is this value.
    state.should_stop = DatabaseCorrupt.exit_code


@worker_init.connect
def _check_database_on_start(sender=None, **_):  # type: ignore[no-untyped-def]
    # A database that does not exist (or an unsupported driver) would otherwise surface as a
    # traceback in every task, retried forever. A database that is down is an outage, not a
    # mistake: the worker starts, and its tasks retry until it is back.
    from storage.db import check_reachable, connect

    global _main_pid
    _main_pid = os.getpid()
    signal.signal(signal.SIGUSR2, _request_stop)
    try:
        engine = connect(_settings_at_start.database_url, pool_size=1)
        try:
            check_reachable(engine)
        finally:
            engine.dispose()
    except (ConfigError, DatabaseCorrupt) as exc:
        _exit_on_config_error(exc)
    except DatabaseUnavailable as exc:
        log.warning("%s; tasks retry until it is back", exc)


@worker_ready.connect
def _reconcile_on_start(sender=None, **_):  # type: ignore[no-untyped-def]
    # A worker started after a crash or a broker wipe should not depend on beat running: one
    # pass now, and one when the dead worker's leases must have expired.
    settings = load_settings()
    try:
        from tasks.health import Level, broker_findings, limiter_finding, sentinel_findings

        # Through Sentinel, each Sentinel too; and the limiter's own client, which a BROKER_URL
        # naming a replica would leave unable to write (issue 34).
        from tasks.broker import is_redis

        findings = [*sentinel_findings(settings), *broker_findings(app, settings)]
        if is_redis(settings):  # otherwise build_runtime says the limits are per worker
            findings.append(limiter_finding(settings))
        for finding in findings:
            if finding.level is not Level.ok:
                log.warning("broker configuration: %s: %s", finding.check, finding.message)
    except Exception as exc:  # a check, never a reason not to start
        log.warning("broker configuration not checked: %s", exc)
    try:
        reconcile.apply_async()
        reconcile.apply_async(countdown=settings.lease_s + 2 * settings.heartbeat_interval_s)
    except Exception as exc:  # never stop a worker from starting over this
        log.warning("initial reconcile not sent: %s", exc)


@worker_shutting_down.connect
def _hand_back_on_shutdown(sig=None, how=None, **_):  # type: ignore[no-untyped-def]
    """SIGTERM (warm shutdown): running chapters finish their current call, commit it, and
    re-publish themselves; Celery's warm shutdown then waits for them to return. If a call is
    still running after WORKER_SOFT_SHUTDOWN_S, escalate to Celery's cold shutdown (SIGQUIT):
    its message goes back to the broker and its lease expires, so nothing is lost, and the one
    call in flight is recorded as wasted by whoever takes the chapter over."""
    rt = _runtime
    if rt is not None:
        rt.stopping.set()
    if _batch_runtime is not None:
        _batch_runtime.stopping.set()
    if how != "Warm":
        return
    window_s = load_settings().worker_soft_shutdown_s

    def escalate() -> None:
        log.warning("soft shutdown window over; cold shutdown", extra={"window_s": window_s})
        os.kill(os.getpid(), signal.SIGQUIT)

    timer = threading.Timer(window_s, escalate)
    timer.daemon = True
    timer.start()


@setup_logging.connect
def _setup_logging(loglevel=None, **_):  # type: ignore[no-untyped-def]
    from examforge.logs import setup_logging as configure

    configure(loglevel or "INFO")
