"""Lease renewal under stress: a stalled database, many leases, calls longer than the TTL."""

from __future__ import annotations

import threading
import time

import pytest
from fakellm import FakeLLM
from pydantic import ValidationError

from examforge.llm import LLMClient
from examforge.pipeline import Runtime, process_chapter
from examforge.settings import Settings
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import connect, open_store


def test_settings_refuse_a_ttl_shorter_than_four_heartbeats():
    with pytest.raises(ValidationError, match="HEARTBEAT_S"):
        Settings(_env_file=None, lease_s=4, heartbeat_s=1.5)
    assert Settings(_env_file=None, lease_s=4, heartbeat_s=1).heartbeat_interval_s == 1
    assert Settings(_env_file=None, lease_s=30).heartbeat_interval_s == 7.5


def _stall(engine, seconds: float, started: threading.Event) -> None:
    """Hold the write lock the heartbeat needs (SQLite) or lock the chapter table (PostgreSQL)."""
    with engine.begin() as conn:  # on SQLite this is BEGIN IMMEDIATE: the write lock
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("LOCK TABLE chapter IN ACCESS EXCLUSIVE MODE")
        started.set()
        time.sleep(seconds)


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


def test_one_beat_renews_many_leases_in_one_statement(make_settings):
    settings = make_settings()
    chapters = [(f"c{i}", 5) for i in range(128)]
    path = write_syllabus(settings.exams_dir, "ex", chapters)
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    rt = Runtime.build(settings, store, LLMClient(settings, transport=FakeLLM().transport()))
    owners = [f"w{i}" for i in range(128)]
    for owner, (cid, _) in zip(owners, chapters):
        store.claim("ex", cid, owner, 1.0, 8)
    statements: list[str] = []

    from sqlalchemy import event

    # The heartbeat has a connection (an engine) of its own, never waiting for the workers'.
    @event.listens_for(store._heartbeat_engine(), "before_cursor_execute")
    def count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE"):
            statements.append(statement)

    lost = [rt.keeper.hold(o) for o in owners]
    rt.keeper.beat()
    assert len(statements) == 1
    assert not any(flag.is_set() for flag in lost)
    time.sleep(1.2)  # past the original 1 s TTL: only the renewal keeps them
    assert len(store.renew(owners, 30.0)) == 128


def test_a_beat_never_waits_behind_a_holders_own_transaction(pg_url, tmp_path):
    """A holder mid-commit keeps its chapter row locked; on PostgreSQL the beat skips that row
    (the commit renews the lease itself) instead of queueing behind it."""
    from sqlalchemy import text

    from storage import connect, migrate
    from storage.store import Store

    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 5), ("b", 5)])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    store.claim("ex", "a", "wa", 30.0, 8)
    store.claim("ex", "b", "wb", 30.0, 8)
    with engine.connect() as holder:
        holder.execute(text("BEGIN"))
        holder.execute(text("UPDATE chapter SET updated_at = updated_at WHERE chapter_id = 'a'"))
        started = time.monotonic()
        assert store.renew(["wa", "wb"], 30.0) == {"wa", "wb"}
        assert time.monotonic() - started < 2.0
        holder.execute(text("ROLLBACK"))
    engine.dispose()
