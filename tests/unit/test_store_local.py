"""Store, lease and patch tests that need no service (SQLite only): moved here from the
integration tier, which is for the machine's real PostgreSQL and Redis."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import redis
from fakellm import FakeLLM
from kombu.transport import redis as kombu_redis
from pydantic import ValidationError

import tasks  # noqa: F401  (importing the app applies the kombu patch)
from examforge.llm import LLMClient
from runner.pipeline import Runtime
from examforge.settings import Settings
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import Store, connect, migrate, open_store
from storage.store import Claimed
from tasks.patches import patch_kombu_redis_close_race


def _sync(store, tmp_path, chapters, slug="ex"):  # type: ignore[no-untyped-def]
    path = write_syllabus(tmp_path / "exams", slug, chapters)
    return store.sync_exam(slug, load_syllabus(path, max_questions=1000))

def test_settings_refuse_a_ttl_shorter_than_four_heartbeats():
    with pytest.raises(ValidationError, match="HEARTBEAT_S"):
        Settings(_env_file=None, lease_s=4, heartbeat_s=1.5)
    assert Settings(_env_file=None, lease_s=4, heartbeat_s=1).heartbeat_interval_s == 1
    assert Settings(_env_file=None, lease_s=30).heartbeat_interval_s == 7.5


def test_one_beat_renews_many_leases_in_one_statement(make_settings):
    settings = make_settings()
    chapters = [(f"c{i}", 5) for i in range(128)]
    path = write_syllabus(settings.exams_dir, "ex", chapters)
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    rt = Runtime.build(settings, store, LLMClient(settings, transport=FakeLLM().transport()))
    owners = [f"w{i}" for i in range(128)]
    # 3 s leases: 128 claims take over a second on a loaded machine, and a lease that lapsed
    # before the beat would be lost for a reason this test is not about.
    for owner, (cid, _) in zip(owners, chapters):
        store.claim("ex", cid, owner, 3.0, 8)
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
    time.sleep(3.2)  # past the original 3 s TTL: only the renewal keeps them
    assert len(store.renew(owners, 30.0)) == 128
    rt.close()


def test_schema_revision_constant_matches_alembics_head():
    from alembic.script import ScriptDirectory

    from storage.db import SCHEMA_REVISION, alembic_config

    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == SCHEMA_REVISION


def test_a_reader_does_not_block_a_writer_on_sqlite(sqlite_url, tmp_path):
    engine = connect(sqlite_url)
    migrate(engine)
    store = Store(engine)
    _sync(store, tmp_path, [("a", 5)])
    with store._read() as reader:
        reader.exec_driver_sql("SELECT count(*) FROM slice").all()
        started = time.monotonic()
        assert isinstance(store.claim("ex", "a", "w", 10.0, 8), Claimed)  # not blocked
        assert time.monotonic() - started < 30  # blocked would mean the 60 s busy timeout


def test_a_closed_transport_raises_a_connection_error_kombu_can_ignore():
    patch_kombu_redis_close_race()  # idempotent
    channel = SimpleNamespace(connection=SimpleNamespace(client=None))
    with pytest.raises(redis.exceptions.ConnectionError):
        kombu_redis.Channel._connparams(channel)
    assert redis.exceptions.ConnectionError in kombu_redis.Transport.connection_errors
