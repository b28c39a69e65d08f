"""The tier a call was served at on the ledger: the call row, `status` (and its --json form),
and migration 0016 on a database that holds calls, on SQLite and PostgreSQL (db_url runs
both)."""

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


def test_the_reported_tier_is_on_the_call_row_and_in_status(db_url: str, tmp_path: Path) -> None:
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 20)])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert isinstance(claim, Claimed)
    flex = store.start_call(claim, 1, 5, lease_s=10.0)
    store.commit_batch(claim, 10.0, flex, _qs(5), model="m",
                       usage=Usage(2000, 300, 0.004, "primary", service_tier="flex"))
    default = store.start_call(claim, 6, 5, lease_s=10.0)
    store.commit_batch(claim, 10.0, default, _qs(5, 5), model="m",
                       usage=Usage(2000, 300, 0.008, "primary", service_tier="default"))
    wasted = store.start_call(claim, 11, 5, lease_s=10.0)
    store.finish_call(wasted, CallOutcome.wasted, "invalid_output", "bad json",
                      usage=Usage(1800, 40, 0.001, "primary", service_tier="flex"))
    refused = store.start_call(claim, 11, 5, lease_s=10.0)
    store.finish_call(refused, CallOutcome.failed, "resource_unavailable",
                      "HTTP 429: Resource unavailable", status_code=429,
                      usage=Usage(endpoint="primary"))
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT id, service_tier FROM call")).all())
    assert rows == {flex: "flex", default: "default", wasted: "flex", refused: None}
    report = store.status("ex")
    assert set(report.usage_by_tier) == {"flex", "default"}
    assert report.usage_by_tier["flex"].calls == 2
    assert round(report.usage_by_tier["flex"].cost_usd, 6) == 0.005
    assert report.usage_by_tier["default"].cost_usd == 0.008
    data = status_dict(report)  # status --json
    assert data["usage_by_tier"]["flex"]["calls"] == 2
    assert data["usage"]["calls_failed"] == 1
    engine.dispose()


def test_migration_0016_adds_service_tier_keeping_the_calls(db_url: str) -> None:
    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0015")
        conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                          "reserved_usd, created_at, updated_at) VALUES "
                          "('ex', 'Ex', 'active', 0, 0.5, 0, 1, 1)"))
        for n in (1, 2):
            conn.execute(text(
                "INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number, requested, "
                "worker, outcome, prompt_tokens, completion_tokens, cost_usd, questions_stored, "
                "reserved_usd, usage_estimated, price_known, started_at, cached_tokens) VALUES "
                "('ex', 'a', 0, :n, :n, 5, 'w', 'used', 1000, 200, 0.25, 5, 0, false, true, 1, 0)"),
                {"n": n})
    migrate(engine)
    assert "service_tier" in {c["name"] for c in inspect(engine).get_columns("call")}
    with engine.connect() as conn:
        assert conn.execute(text(
            "SELECT cost_usd, service_tier FROM call ORDER BY id")).all() == [
            (0.25, None), (0.25, None)]
    report = Store(engine).status("ex")
    assert report.usage_by_tier == {} and report.usage.calls == 2
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0015")
    assert "service_tier" not in {c["name"] for c in inspect(engine).get_columns("call")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM call")).scalar_one() == 2
    engine.dispose()
