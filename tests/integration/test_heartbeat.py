"""Lease renewal under stress: a stalled database, many leases, calls longer than the TTL."""

from __future__ import annotations

import threading
import time

import pytest
from fakellm import FakeLLM

from examforge.llm import LLMClient
from runner.pipeline import Runtime, process_chapter
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import connect, open_store




def _stall(engine, seconds: float, started: threading.Event) -> None:
    """Hold the write lock the heartbeat needs (SQLite) or lock the slice table (PostgreSQL)."""
    with engine.begin() as conn:  # on SQLite this is BEGIN IMMEDIATE: the write lock
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("LOCK TABLE slice IN ACCESS EXCLUSIVE MODE")
        started.set()
        time.sleep(seconds)


@pytest.mark.slow
@pytest.mark.parametrize("lease_s, heartbeat_s, survives", [(4.0, 1.0, True), (1.2, 1.0, False)])
def test_a_two_second_database_stall_does_not_expire_a_live_lease(
        db_url, make_settings, lease_s, heartbeat_s, survives):
    # The second row is what the settings validator forbids: TTL barely above one beat.
    settings = make_settings(database_url=db_url, lease_s=max(lease_s, 4 * heartbeat_s))
    object.__setattr__(settings, "lease_s", lease_s)
    object.__setattr__(settings, "heartbeat_s", heartbeat_s)
    path = write_syllabus(settings.exams_dir, "ex", [("a", 5)])
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    fake = FakeLLM()
    rt = Runtime.build(settings, store, LLMClient(settings, transport=fake.transport()))
    stall_engine = connect(settings.database_url)
    started = threading.Event()

    def slow_call(req, n):
        time.sleep(heartbeat_s * 1.1)  # let one beat land first
        staller = threading.Thread(target=_stall, args=(stall_engine, 2.0, started))
        staller.start()
        started.wait(5)
        staller.join()
        time.sleep(heartbeat_s * 0.5)
        return fake.valid(n, "a")

    fake.script = [slow_call]
    result = process_chapter(rt, "ex", "a")
    if survives:
        assert result.outcome == "done", result
        assert store.status("ex").as_dict()["usage"]["calls_wasted"] == 0
    else:
        # Another process could have taken the chapter: this worker must not commit.
        assert result.outcome == "lost", result
        assert store.status("ex").as_dict()["questions"]["done"] == 0
    rt.close()




def test_a_beat_renews_while_every_pooled_connection_is_busy(pg_url, tmp_path):
    """128 threads share a pool of a few connections; the heartbeat has one of its own, so a
    busy pool never delays a renewal (a delayed renewal is a lost lease)."""
    from storage import connect, migrate
    from storage.store import Store

    engine = connect(pg_url, pool_size=1)  # one connection, plus one in overflow
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 5), ("b", 5)])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    store.claim("ex", "a", "wa", 30.0, 8)
    store.claim("ex", "b", "wb", 30.0, 8)
    held = [engine.connect(), engine.connect()]  # the pool is exhausted
    try:
        started = time.monotonic()
        assert store.renew(["wa", "wb"], 30.0) == {"wa", "wb"}
        assert time.monotonic() - started < 5.0  # not the pool's 60 s timeout
    finally:
        for conn in held:
            conn.close()
        engine.dispose()
