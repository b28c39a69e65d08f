"""Cached prompt tokens on the ledger: the call row, `status` (and its --json form), and
migration 0014 on a database that holds calls, on SQLite and PostgreSQL (db_url runs both)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import inspect, text

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from producer.views import status_dict
from storage import Store, connect, migrate
from storage.db import alembic_config
from storage.models import CallOutcome
from storage.store import Claimed, Usage


def _qs(n: int, start: int = 0) -> list[Question]:
    return [Question(f"q {start + i}?", ("a", "b", "c", "d"), 0, "") for i in range(n)]


def test_cached_tokens_are_on_the_call_row_and_in_status(db_url: str, tmp_path: Path) -> None:
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 10)])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert isinstance(claim, Claimed)
    used = store.start_call(claim, 1, 5, lease_s=10.0)
    store.commit_batch(claim, 10.0, used, _qs(5), model="m",
                       usage=Usage(2000, 300, 0.01, "primary", cached_tokens=1536))
    wasted = store.start_call(claim, 6, 5, lease_s=10.0)
    store.finish_call(wasted, CallOutcome.wasted, "invalid_output", "bad json",
                      usage=Usage(1800, 40, 0.002, "primary", cached_tokens=1024))
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT id, cached_tokens FROM call")).all())
    assert rows == {used: 1536, wasted: 1024}
    report = store.status("ex")
    assert report.usage.cached_tokens == 2560 and report.usage.prompt_tokens == 3800
    assert report.usage_by_endpoint["primary"].cached_tokens == 2560
    data = status_dict(report)  # status --json
    assert data["usage"]["cached_tokens"] == 2560
    assert data["usage_by_endpoint"]["primary"]["cached_tokens"] == 2560
    engine.dispose()


def test_migration_0014_adds_cached_tokens_keeping_the_calls(db_url: str) -> None:
    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0013")
        conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                          "reserved_usd, created_at, updated_at) VALUES "
                          "('ex', 'Ex', 'active', 0, 0.5, 0, 1, 1)"))
        for n in (1, 2):
            conn.execute(text(
                "INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number, requested, "
                "worker, outcome, prompt_tokens, completion_tokens, cost_usd, questions_stored, "
                "reserved_usd, usage_estimated, price_known, started_at) VALUES "
                "('ex', 'a', 0, :n, :n, 5, 'w', 'used', 1000, 200, 0.25, 5, 0, false, true, 1)"),
                {"n": n})
    migrate(engine)
    assert "cached_tokens" in {c["name"] for c in inspect(engine).get_columns("call")}
    with engine.connect() as conn:
        assert conn.execute(text(
            "SELECT prompt_tokens, cost_usd, cached_tokens FROM call ORDER BY id")).all() == [
            (1000, 0.25, 0), (1000, 0.25, 0)]
    report = Store(engine).status("ex")
    assert report.usage.cached_tokens == 0 and report.usage.prompt_tokens == 2000
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0013")
    assert "cached_tokens" not in {c["name"] for c in inspect(engine).get_columns("call")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM call")).scalar_one() == 2
    engine.dispose()
