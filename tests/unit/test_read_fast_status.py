"""`status` and `review` of a SQLite file through the plain driver (producer/read_sqlite.py)
print what the store's path prints, byte for byte, plain and --json, for exams in every state
the reports show: done, running (live and lapsed leases, several slices of a chapter, calls
in flight, recent errors, a requeue, estimated, unpriced, fallback, flex and imported calls,
a budget), paused by a pause code, paused at its budget, failed, cancelled, verified (agreed,
disputed, replaced, pending and unverified questions), reviewed (approved, rejected, stale),
with course material (in Persian, a chapter in Arabic), in batch mode (live, cancelled and
more batches than the table shows), and with no chapter at all. And it steps aside, printing
nothing, for what it does not take: PostgreSQL, an older schema, an exam the database does not
have, `--watch`; the store's path then prints its output or its one-line error.

The database clock is pinned to one instant on both paths (`now` is read by each path's own
query: a running exam's elapsed time and its questions of the last minute move with it);
test_the_fast_path_reads_the_store_s_clock holds the fast path's clock to the store's."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from sqlalchemy import literal_column

import storage.base
from bench.seed import seed_exam
from examforge.settings import load_settings
from producer import read_sqlite
from storage import open_existing_store, open_store
from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)

T = 2_000_000_000.0  # the database clock of both paths
SLUGS = ("done", "running", "paused", "budget", "failed", "cancelled", "verified", "grounded",
         "batch", "bare")


def _sql(db: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    """Each statement, a text or (text, its parameters), in one transaction."""
    conn = sqlite3.connect(db)
    with conn:
        for statement in statements:
            conn.execute(*((statement,) if isinstance(statement, str) else statement))
    conn.close()


def _insert(db: str, table: str, **values: Any) -> None:
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"INSERT INTO {table} ({', '.join(values)}) "
                     f"VALUES ({', '.join('?' * len(values))})", list(values.values()))
    conn.close()


_call_id = iter(range(10_000, 20_000))


def _call(db: str, exam: str, chapter: str, outcome: str, **values: Any) -> None:
    """A ledger row of `exam`'s chapter: a used call of 10 questions unless `values` say."""
    row: dict[str, Any] = dict(
        id=next(_call_id), exam=exam, chapter_id=chapter, attempt=1, first_number=1,
        requested=10, worker="w-1", outcome=outcome, status_code=200, prompt_tokens=300,
        completion_tokens=1500, cost_usd=0.001, questions_stored=0, started_at=T - 400,
        finished_at=T - 390, endpoint="primary", model="mock-model", max_tokens=4100,
        reserved_usd=0.0, usage_estimated=0, price_known=1, slice_no=0, cached_tokens=0)
    row.update(values)
    _insert(db, "call", **row)


def _batch(db: str, exam: str, sub: str, state: str, created_at: float, **values: Any) -> None:
    row: dict[str, Any] = dict(
        id=sub, exam=exam, state=state, model="mock-model", requests=10, bytes=4096,
        request_total=10, request_completed=0, request_failed=0, created_at=created_at,
        create_attempts=1, cancel_requested=0)
    row.update(values)
    _insert(db, "batch", **row)


@pytest.fixture()
def reports_db(env, _reports_made):  # type: ignore[no-untyped-def]  # noqa: F811
    """One exam in each state the module docstring names, in the test's own database file (the
    environment's DATABASE_URL): a copy of the module's, made once (`_reports_made`, 0.2 s of
    CPU and a dozen commits each time it was made for each of the module's 15 tests). A copy
    through SQLite's backup, so a test that changes its database changes no other's."""
    url = env["DATABASE_URL"]
    made, copy = sqlite3.connect(_reports_made), sqlite3.connect(url[len("sqlite:///"):])
    made.backup(copy)
    copy.close()
    made.close()
    return url


@pytest.fixture(scope="module")
def _reports_made(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The database reports_db copies: its exams, made through the store and plain SQL."""
    db = str(tmp_path_factory.mktemp("reports") / "examforge.db")
    url = f"sqlite:///{db}"
    for slug, questions, chapters in (("done", 24, 3), ("running", 130, 2), ("paused", 20, 2),
                                      ("budget", 20, 2), ("failed", 20, 2),
                                      ("cancelled", 20, 2), ("verified", 40, 4),
                                      ("grounded", 20, 2), ("batch", 60, 3)):
        seed_exam(url, slug, questions, chapters)
    _sql(db, f"UPDATE call SET started_at = {T - 600}, finished_at = {T - 300}",
         f"UPDATE question SET created_at = {T - 300}",
         f"UPDATE slice SET updated_at = {T - 200}",
         f"UPDATE exam SET updated_at = {T - 250}")
    # done: a slice a lowered target trimmed to nothing (not shown) and some reviews.
    _sql(db, "CREATE TEMP TABLE extra AS SELECT * FROM slice WHERE exam = 'done' "
             "AND chapter_id = 'ch-00000'",
         "UPDATE extra SET slice_no = 1, first_number = 9, target = 0",
         "INSERT INTO slice SELECT * FROM extra", "DROP TABLE extra",
         "UPDATE question SET review = 'approved' WHERE exam = 'done' AND number <= 2")
    # running: a chapter of two slices, one of them running under a live lease, and the
    # other chapter's first slice running under a lapsed lease (pending), its second pending.
    _sql(db,
         "UPDATE exam SET budget_usd = 5.0 WHERE slug = 'running'",
         f"UPDATE slice SET state = 'running', lease_owner = 'w-1', lease_expires_at = {T + 30}, "
         "attempts = 3, attempts_since_progress = 1, last_error_code = 'rate_limited', "
         f"last_error = 'HTTP 429: slow down', last_error_at = {T - 50} "
         "WHERE exam = 'running' AND chapter_id = 'ch-00000' AND first_number = 51",
         "DELETE FROM question WHERE exam = 'running' AND chapter_id = 'ch-00000' "
         "AND number > 55",
         f"UPDATE question SET created_at = {T - 10} WHERE exam = 'running' "
         "AND chapter_id = 'ch-00000' AND number BETWEEN 51 AND 55",
         f"UPDATE question SET created_at = {T - 60} WHERE exam = 'running' "  # the bound
         "AND chapter_id = 'ch-00001' AND number = 1",
         f"UPDATE slice SET state = 'running', lease_owner = 'w-2', lease_expires_at = {T - 5}, "
         f"requeues = 2, requeued_at = {T - 100}, requeue_code = 'message_lost', "
         "requeue_reason = 'the queue held no message for it' "
         "WHERE exam = 'running' AND chapter_id = 'ch-00001' AND first_number = 1",
         "DELETE FROM question WHERE exam = 'running' AND chapter_id = 'ch-00001' "
         "AND number >= 40",
         "UPDATE slice SET state = 'pending', last_error_code = 'handed_back', "
         f"last_error = 'the worker stopped', last_error_at = {T - 40} "
         "WHERE exam = 'running' AND chapter_id = 'ch-00001' AND first_number = 51")
    _call(db, "running", "ch-00000", "in_flight", first_number=56, slice_no=1,
          started_at=T - 5, finished_at=None, cost_usd=0.0, reserved_usd=0.0123,
          prompt_tokens=0, completion_tokens=0, status_code=None)
    _call(db, "running", "ch-00001", "in_flight", started_at=T - 3, finished_at=None,
          cost_usd=0.0, reserved_usd=0.0042, prompt_tokens=0, completion_tokens=0,
          status_code=None)
    for n, (outcome, reason) in enumerate([("failed", "rate_limited"), ("wasted", "lease_lost"),
                                           ("failed", "server_error"), ("failed", "deadline"),
                                           ("wasted", "invalid_output"),
                                           ("failed", "rate_limited")]):
        _call(db, "running", "ch-00000", outcome, reason=reason, status_code=429,
              detail=f"error number {n}", finished_at=T - 200 + n, cost_usd=0.0002 * n)
    _call(db, "running", "ch-00000", "used", usage_estimated=1, questions_stored=5,
          first_number=51, slice_no=1, cost_usd=0.0031)
    _call(db, "running", "ch-00001", "used", price_known=0, model="odd-model", cost_usd=0.0,
          questions_stored=10)
    _call(db, "running", "ch-00001", "used", endpoint="fallback", model="fallback-model",
          cached_tokens=120, questions_stored=10)
    _call(db, "running", "ch-00000", "used", service_tier="flex", cost_usd=0.0005,
          questions_stored=10)
    _call(db, "running", "ch-00000", "imported", model="import", cost_usd=0.0,
          prompt_tokens=0, completion_tokens=0, questions_stored=5, endpoint=None)
    # paused by a pause code (the key), and paused at its budget.
    _sql(db,
         "UPDATE exam SET state = 'paused', pause_code = 'auth', "
         "pause_reason = 'auth: the key was rejected (HTTP 401)' WHERE slug = 'paused'",
         "UPDATE slice SET state = 'pending', last_error_code = 'auth', "
         f"last_error = 'HTTP 401', last_error_at = {T - 20} "
         "WHERE exam = 'paused' AND chapter_id = 'ch-00001'",
         "DELETE FROM question WHERE exam = 'paused' AND chapter_id = 'ch-00001' "
         "AND number > 3",
         ("UPDATE exam SET state = 'paused', pause_code = 'budget', budget_usd = 0.002, "
          "spent_usd = 0.002, pause_reason = ? WHERE slug = 'budget'",
          (storage.base.BUDGET_SPENT_REASON,)),
         "UPDATE slice SET state = 'pending' WHERE exam = 'budget' AND chapter_id = 'ch-00000'",
         "DELETE FROM question WHERE exam = 'budget' AND chapter_id = 'ch-00000'")
    # failed at its attempt cap; cancelled with a question missing.
    _sql(db,
         "UPDATE slice SET state = 'failed', attempts = 8, attempts_since_progress = 8, "
         "last_error_code = 'attempt_cap', "
         "last_error = '8 attempts without progress; last error: transient: HTTP 503', "
         f"last_error_at = {T - 30} WHERE exam = 'failed' AND chapter_id = 'ch-00001'",
         "DELETE FROM question WHERE exam = 'failed' AND chapter_id = 'ch-00001' "
         "AND number > 4",
         "UPDATE slice SET state = 'cancelled' WHERE exam = 'cancelled' "
         "AND chapter_id = 'ch-00000'",
         "DELETE FROM question WHERE exam = 'cancelled' AND chapter_id = 'ch-00000' "
         "AND number = 1")
    # verified (flag): agreed, disputed (one flagged, one replaced), pending and unverified
    # questions, and a review of every kind: approved, rejected (withdrawn), stale.
    _sql(db,
         "UPDATE exam SET verify = 'flag' WHERE slug = 'verified'",
         "UPDATE question SET verdict = 'agreed' WHERE exam = 'verified' "
         "AND chapter_id IN ('ch-00000', 'ch-00001') AND number <= 5",
         "UPDATE question SET verdict = 'disputed' WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00000' AND number = 6",
         "UPDATE question SET verdict = 'pending' WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00000' AND number IN (7, 8)",
         "UPDATE question SET verdict = 'disputed', withdrawn = 'disputed', "
         "withdrawn_number = number, number = NULL WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00001' AND number = 6",
         "UPDATE slice SET state = 'pending' WHERE exam = 'verified' AND chapter_id = 'ch-00001'",
         "UPDATE question SET review = 'approved' WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00002' AND number <= 3",
         "UPDATE question SET review = 'stale', stale = 'regenerated' WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00002' AND number = 4",
         "UPDATE question SET review = 'rejected', verdict = 'agreed', withdrawn = 'rejected', "
         "withdrawn_number = number, number = NULL WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00002' AND number = 5",
         "UPDATE question SET verdict = 'disputed', review = 'rejected' WHERE exam = 'verified' "
         "AND chapter_id = 'ch-00003' AND number = 1")
    # grounded: passages, some of them cited.
    for chapter, passages in (("ch-00000", 4), ("ch-00001", 3)):
        for seq in range(1, passages + 1):
            _insert(db, "passage", exam="grounded", chapter_id=chapter, seq=seq,
                    source="notes.md", location=f"section {seq}", text=f"passage {seq}")
    # ... written in Persian (the exam's language), one chapter in Arabic (its own).
    _sql(db, "UPDATE exam SET language = 'fa' WHERE slug = 'grounded'",
         "UPDATE slice SET language = 'fa' WHERE exam = 'grounded'",
         "UPDATE slice SET language = 'ar' WHERE exam = 'grounded' AND chapter_id = 'ch-00001'")
    _sql(db, "UPDATE question SET passage = 1 WHERE exam = 'grounded' AND number <= 3",
         "UPDATE question SET passage = 2 WHERE exam = 'grounded' AND chapter_id = 'ch-00000' "
         "AND number = 4")
    # batch mode: a live batch holding a slice, one whose cancel was asked, one done, and
    # more batches than the table lists.
    _sql(db, "UPDATE exam SET mode = 'batch' WHERE slug = 'batch'",
         f"UPDATE slice SET state = 'running', lease_owner = 'batch/sub-live', "
         f"lease_expires_at = {T + 90_000} WHERE exam = 'batch' AND chapter_id = 'ch-00000'",
         "DELETE FROM question WHERE exam = 'batch' AND chapter_id = 'ch-00000'",
         f"UPDATE slice SET state = 'running', lease_owner = 'batch/sub-new', "
         f"lease_expires_at = {T + 90_000} WHERE exam = 'batch' AND chapter_id = 'ch-00001'",
         "DELETE FROM question WHERE exam = 'batch' AND chapter_id = 'ch-00001'")
    _batch(db, "batch", "sub-live", "submitted", T - 100, provider_batch_id="batch_abc",
           provider_status="in_progress", request_completed=4, request_failed=1,
           submitted_at=T - 90, expires_at=T + 86_000, polled_at=T - 20)
    _batch(db, "batch", "sub-new", "uploaded", T - 50, input_file_id="file-1",
           cancel_requested=1)
    _batch(db, "batch", "sub-done", "done", T - 5000, provider_batch_id="batch_old",
           provider_status="completed", request_completed=10, finished_at=T - 4000,
           detail="every line of it was booked, the provider's file read twice over " * 2,
           usage=json.dumps({"prompt_tokens": 3000}))
    for n in range(20):
        _batch(db, "batch", f"sub-{n:02d}", "abandoned", T - 10_000 - n, detail="never created")
    # bare: an exam without a chapter (a copy of a row, with no slice).
    _sql(db, "CREATE TEMP TABLE bare AS SELECT * FROM exam WHERE slug = 'done'",
         "UPDATE bare SET slug = 'bare', title = 'Nothing in it', created_at = 3000, "
         "updated_at = 3001", "INSERT INTO exam SELECT * FROM bare")
    return db


@pytest.fixture()
def pinned_clock(monkeypatch):  # type: ignore[no-untyped-def]
    """The database clock at T on both paths (the store's `_now`, the fast path's NOW)."""
    monkeypatch.setattr(storage.base, "db_now", lambda dialect: literal_column(repr(T)))
    monkeypatch.setattr(read_sqlite, "NOW", repr(T))


def _store_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_sqlite, "status", lambda *args: False)
    monkeypatch.setattr(read_sqlite, "review", lambda *args: False)


def test_the_fast_path_reads_the_store_s_clock_and_its_errors():
    from storage import reports
    from storage.db import db_now

    assert read_sqlite.NOW == str(db_now("sqlite"))
    assert read_sqlite.RECENT_ERRORS == reports.RECENT_ERRORS


def test_the_fast_path_builds_the_store_s_reports(reports_db, pinned_clock):
    store = open_existing_store(reports_db)
    try:
        for slug in SLUGS:
            assert read_sqlite.report(reports_db, slug) == store.status(slug), slug
            conn = read_sqlite.open_snapshot(reports_db)
            assert conn is not None
            assert read_sqlite.review_chapters(conn, slug) == store.review_summary(slug), slug
            conn.close()
    finally:
        store.engine.dispose()


@pytest.mark.parametrize("command, argv", [("status", ()), ("status", ("--json",)),
                                           ("review", ())],
                         ids=["status", "status-json", "review"])
def test_the_cli_prints_the_same_through_both_paths(reports_db, pinned_clock, capsys,
                                                    monkeypatch, command, argv):
    fast_path = getattr(read_sqlite, command)
    taken: list[bool] = []
    monkeypatch.setattr(read_sqlite, command,
                        lambda *args: taken.append(fast_path(*args)) or taken[-1])
    fast = {slug: cli(capsys, command, slug, *argv) for slug in SLUGS}
    assert taken == [True] * len(SLUGS)  # the fast path printed every one
    _store_path_only(monkeypatch)
    for slug in SLUGS:
        got = fast[slug]
        assert got[0] == 0 and got[2] == "", (slug, got)
        assert got == cli(capsys, command, slug, *argv), (command, slug, argv)


def test_every_state_is_compared(reports_db, pinned_clock, capsys):
    """What the comparisons above cover, read from the fast path's own --json."""
    status = {slug: json.loads(cli(capsys, "status", slug, "--json")[1]) for slug in SLUGS}
    assert {slug: s["state"] for slug, s in status.items()} == {
        "done": "done", "running": "active", "paused": "paused", "budget": "paused",
        "failed": "failed", "cancelled": "cancelled", "verified": "active",
        "grounded": "done", "batch": "active", "bare": "done"}
    running = status["running"]
    assert running["chapters"]["running"] == 1 and running["chapters"]["pending"] == 1
    assert running["usage"]["calls_in_flight"] == 2 and running["questions_last_minute"] == 6
    assert running["usage"]["calls_estimated"] == 1 and running["usage"]["calls_imported"] == 1
    assert running["unpriced_calls"] == {"odd-model": 1}
    assert set(running["usage_by_endpoint"]) == {"primary", "fallback"}
    assert set(running["usage_by_tier"]) == {"flex"}
    assert len(running["recent_errors"]) == 5 and running["budget_usd"] == 5.0
    assert status["paused"]["pause_code"] == "auth"
    assert status["budget"]["pause_code"] == "budget"
    assert status["verified"]["verification"] == {
        "agreed": 10, "disputed": 3, "pending": 2, "withdrawn": 1, "unverified": 24}
    assert status["grounded"]["language"] == "fa" and status["done"]["language"] == "en"
    assert [c["language"] for c in status["grounded"]["chapter_list"]] == ["fa", "ar"]
    assert "language: Persian (fa); chapters in another: ch-00001 Arabic (ar)\n" in cli(
        capsys, "status", "grounded")[1]
    assert [c["material"] for c in status["grounded"]["chapter_list"]] == [
        {"cited": 2, "passages": 4, "share": 0.5}, {"cited": 1, "passages": 3, "share": 0.3333}]
    batch = status["batch"]
    assert len(batch["batches"]) == 23 and {c["batch"] for c in batch["chapter_list"]} == {
        "sub-live", "sub-new", None}
    review = json.loads(cli(capsys, "review", "verified", "--json")[1])["totals"]
    assert review == {"questions": 38, "unreviewed": 33, "approved": 3, "rejected": 2,
                      "disputed": 2, "stale": 1, "unverified": 26}
    plain = cli(capsys, "status", "batch")[1]
    assert "3 older batches not shown" in plain and "waiting on the provider's batch" in plain


def test_postgresql_is_left_to_the_store(env, pg_url, capsys, monkeypatch):  # noqa: F811
    """The fast path steps aside before connecting; the store's path answers."""
    open_store(pg_url).engine.dispose()  # the schema
    seed_exam(pg_url, "pg", 20, 2)
    monkeypatch.setenv("DATABASE_URL", pg_url)
    load_settings.cache_clear()
    assert read_sqlite.status("pg", False, False) is False
    assert read_sqlite.status("pg", True, False) is False
    assert read_sqlite.review("pg", True) is False
    assert read_sqlite.exams(True, 100, None, False) is False
    assert capsys.readouterr() == ("", "")
    code, out, err = cli(capsys, "status", "pg", "--json", DATABASE_URL=pg_url)
    assert code == 0 and json.loads(out)["questions"] == {"target": 20, "done": 20}, err
    code, out, err = cli(capsys, "review", "pg", DATABASE_URL=pg_url)
    assert code == 0 and "20 questions to review" in out, err
    assert_one_line(*cli(capsys, "status", "nosuch", DATABASE_URL=pg_url)[::2],
                    "unknown exam 'nosuch'")


@pytest.mark.parametrize("argv", [("status", "done"), ("status", "done", "--json"),
                                  ("review", "done"), ("review", "done", "--json")],
                         ids=" ".join)
def test_an_older_schema_is_the_store_s_one_line_error(reports_db, capsys, argv):
    _sql(reports_db[len("sqlite:///"):], "UPDATE alembic_version SET version_num = '0001'")
    assert read_sqlite.report(reports_db, "done") is None
    assert read_sqlite.status("done", "--json" in argv, False) is False
    assert read_sqlite.review("done", "--json" in argv) is False
    assert capsys.readouterr() == ("", "")
    assert_one_line(*cli(capsys, *argv)[::2], "revision 0001")


@pytest.mark.parametrize("argv", [("status", "nosuch"), ("status", "nosuch", "--json"),
                                  ("review", "nosuch"), ("review", "nosuch", "--json")],
                         ids=" ".join)
def test_an_exam_not_in_the_database_is_the_store_s_one_line_error(reports_db, capsys, argv):
    assert read_sqlite.status("nosuch", "--json" in argv, False) is False
    assert read_sqlite.review("nosuch", "--json" in argv) is False
    assert capsys.readouterr() == ("", "")
    assert_one_line(*cli(capsys, *argv)[::2], "unknown exam 'nosuch'")


def test_watch_is_left_to_the_store(reports_db, capsys):
    assert read_sqlite.status("done", False, True) is False
    assert capsys.readouterr() == ("", "")
    code, out, err = cli(capsys, "status", "done", "--watch", "--interval", "0.1")
    assert code == 0 and "done" in out, err
    assert_one_line(*cli(capsys, "status", "done", "--watch", "--json")[::2], "choose one")


def test_review_json_takes_the_store_s_path_with_each_filter_s_count(reports_db, capsys):
    # GET /exams/SLUG/review's answer, whose filter counts the plain-driver path does not read.
    assert read_sqlite.review("verified", True) is False
    assert capsys.readouterr().out == ""
    data = json.loads(cli(capsys, "review", "verified", "--json")[1])
    assert set(data["filters"]) == {"disputed", "unreviewed", "edited", "stale", "approved",
                                    "rejected"}
    assert all("filters" in c for c in data["chapters"])
