"""Helpers shared by test modules: `from helpers import wait_for, write_syllabus`."""

from __future__ import annotations

import functools
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


@functools.lru_cache(maxsize=None)
def _resolved_parents_of(fspath: str) -> tuple[Path, ...]:
    return tuple(Path(fspath).resolve().parents)


def resolved_parents(item: pytest.Item) -> tuple[Path, ...]:
    """The folders a test's file is in, symlinks resolved (for the conftests' marks by tier):
    once a file, not once a test. The suite's 2,600 tests are in 200 files, and each `resolve`
    is some system calls, which each pytest-xdist worker made twice a test when it collected."""
    return _resolved_parents_of(str(item.fspath))


def migrates_at_once(function: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a fixture (under its @pytest.fixture) that brings its database (`pg_url` or
    `db_url`, one of its own arguments) to head with `migrate` before anything else touches
    it: on PostgreSQL it is then given a copy of the run's migrated template, which `migrate`
    finds current, instead of an empty database it would migrate (conftest.py's _PgDatabases)."""
    function.migrates_at_once = True  # type: ignore[attr-defined]
    return function


def write_syllabus(exams_dir: Path, slug: str, chapters: list[tuple[str, int]] | dict[str, Any],
                   title: str = "Test exam") -> Path:
    """Write EXAMS_DIR/SLUG/syllabus.json from (id, questions) pairs or a raw object."""
    folder = exams_dir / slug
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(chapters, dict):
        data = chapters
    else:
        data = {"title": title, "chapters": [
            {"id": cid, "title": f"Chapter {cid}", "questions": n} for cid, n in chapters]}
    path = folder / "syllabus.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str,
             interval_s: float = 0.1) -> Any:
    """Poll `predicate` until it is truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def _wait_passed(store: Any, exam: str, chapter_id: str, slice_no: int, column: str,
                 what: str, timeout_s: float) -> None:
    """Until the slice's `column` (a time on the database's clock) is unset or past."""
    from sqlalchemy import select

    from storage.base import S

    def passed() -> bool:
        with store.engine.connect() as conn:
            row = conn.execute(select(S.c[column].label("at"), store._now.label("now")).where(
                S.c.exam == exam, S.c.chapter_id == chapter_id,
                S.c.slice_no == slice_no)).one()
        return row.at is None or row.at <= row.now

    wait_for(passed, timeout_s, what, interval_s=0.02)


def wait_lease_expired(store: Any, exam: str, chapter_id: str, timeout_s: float = 10,
                       slice_no: int = 0) -> None:
    """Until the slice's lease has expired on the database's own clock: the condition the
    store checks, instead of a sleep guessed to be long enough."""
    _wait_passed(store, exam, chapter_id, slice_no, "lease_expires_at",
                 f"the lease on {exam}/{chapter_id}/{slice_no} to expire", timeout_s)


def wait_backoff_over(store: Any, exam: str, chapter_id: str, timeout_s: float = 10,
                      slice_no: int = 0) -> None:
    """Until the slice's backoff (not_before_at) has passed on the database's clock."""
    _wait_passed(store, exam, chapter_id, slice_no, "not_before_at",
                 f"the backoff of {exam}/{chapter_id}/{slice_no} to end", timeout_s)


def seed_at_0006(conn: Any, *, title: str, target: int, state: str = "pending",
                 spec_hash: str = "h", attempts: int = 0, since_progress: int = 0) -> None:
    """Bring an empty database (`conn`, in a transaction) to migration 0006 and record exam
    `ex` with one slice of chapter `a` by hand, as a deployment of that revision had them:
    what the tests of later migrations start from."""
    from alembic import command
    from sqlalchemy import text

    from storage.db import alembic_config

    command.upgrade(alembic_config(conn), "0006")
    conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                      "reserved_usd, created_at, updated_at) VALUES "
                      "('ex', 'Ex', 'active', 0, 0, 0, 1, 1)"))
    conn.execute(text(
        "INSERT INTO slice (exam, chapter_id, slice_no, first_number, position, title, "
        "spec_hash, target, state, attempts, attempts_since_progress, requeues, updated_at) "
        "VALUES ('ex', 'a', 0, 1, 0, :title, :h, :target, :state, :attempts, :since, 0, 1)"),
        {"title": title, "h": spec_hash, "target": target, "state": state,
         "attempts": attempts, "since": since_progress})


@contextmanager
def fake_runtimes(make_settings: Callable[..., Any], **defaults: Any) -> Iterator[Any]:
    """`build(chapters, exam="ex", **settings)`: an exam synced into a fresh store and a
    worker Runtime whose client talks to a FakeLLM (tests/unit/fakellm.py); returns
    (runtime, fake). Every runtime built is closed on the way out, so no heartbeat thread
    outlives its test."""
    from fakellm import FakeLLM

    from examforge.llm import LLMClient
    from runner.pipeline import Runtime
    from examforge.syllabus import load_syllabus
    from storage import open_store

    built: list[Any] = []

    def build(chapters: Any = (("a", 12),), exam: str = "ex", **overrides: Any) -> Any:
        settings = make_settings(**{**defaults, **overrides})
        path = write_syllabus(settings.exams_dir, exam, list(chapters))
        store = open_store(settings.database_url)
        store.sync_exam(exam, load_syllabus(path, max_questions=1000),
                        slice_questions=settings.slice_questions)
        fake = FakeLLM()
        rt = Runtime.build(settings, store, LLMClient(settings, transport=fake.transport()))
        built.append(rt)
        return rt, fake

    try:
        yield build
    finally:
        for rt in built:
            rt.close()
            rt.store.engine.dispose()


def mock_batches(base_url: str) -> list[dict[str, Any]]:
    """Every batch the mock holds, newest first, paged as a client pages `GET /batches`."""
    import httpx

    out: list[dict[str, Any]] = []
    after = None
    while True:
        page = httpx.get(base_url + "/batches",
                         params={"limit": 100, **({"after": after} if after else {})}).json()
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["last_id"]


def mock_custom_ids(base_url: str, batch: dict[str, Any]) -> list[str]:
    """The custom_id of every line of a batch's input file, as the mock holds it."""
    import json

    import httpx

    content = httpx.get(f"{base_url}/files/{batch['input_file_id']}/content").content
    return [json.loads(line)["custom_id"] for line in content.decode().splitlines() if line]


def fake_redis_connection_class(server: Any) -> type:
    """A redis-py connection class that talks to fakeredis `server`, for putting under kombu
    (`kombu.transport.redis.Channel.connection_class`) in the unit tier.

    fakeredis replaces redis-py's `read_response` with its own, which does not push the
    connection's next health check forward as redis-py's does. kombu sets a health-check
    interval, and redis-py 8.2 pipelines its handshake (CLIENT SETINFO twice, SELECT) with a
    health check before each send: with the check never pushed forward, the second send's PING
    read the first SETINFO's "OK" ("Bad response from PING health check"). Doing what redis-py's
    own read_response does makes the fake work on 8.1 and 8.2 alike;
    tests/unit/test_fake_redis_connection.py checks exactly that handshake on the installed
    client."""
    import fakeredis

    class Connection(fakeredis.FakeRedisConnection):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["server"] = server
            super().__init__(*args, **kwargs)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            response = super().read_response(*args, **kwargs)
            if self.health_check_interval:
                self.next_health_check = time.monotonic() + self.health_check_interval
            return response

    return Connection
