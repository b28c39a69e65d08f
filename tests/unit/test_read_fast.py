"""`exams`' SQLite fast path (producer/read_sqlite.py) gives what the store's path gives, for
exams in every state, and steps aside for what it does not handle (a cursor, a next page, an
older schema), so that the store's path prints the page or the error."""

from __future__ import annotations

import json
import sqlite3

import pytest

from bench.seed import seed_exam
from producer import read_sqlite
from producer.sqlite_file import open_snapshot
from producer.views import summary_dict
from storage import open_existing_store
from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)


def _sql(db: str, *statements: str) -> None:
    conn = sqlite3.connect(db)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


@pytest.fixture()
def exams_db(env):  # type: ignore[no-untyped-def]  # noqa: F811
    """Exams done, active (questions missing from open slices), paused, failed, cancelled,
    with no chapter at all, and with no call in the ledger."""
    url = env["DATABASE_URL"]
    db = url[len("sqlite:///"):]
    for n, slug in enumerate(("done", "active", "paused", "failed", "cancelled", "free")):
        seed_exam(url, slug, 20 + n, 4)
        _sql(db, f"UPDATE exam SET created_at = {1000 + n}, updated_at = {2000 + n} "
                 f"WHERE slug = '{slug}'")
    _sql(db,
         "UPDATE slice SET state = 'pending' WHERE exam = 'active' AND chapter_id = 'ch-00001'",
         "DELETE FROM question WHERE exam = 'active' AND chapter_id = 'ch-00001' AND number > 2",
         "UPDATE slice SET state = 'running', updated_at = 9999 WHERE exam = 'active' "
         "AND chapter_id = 'ch-00002'",
         "UPDATE exam SET state = 'paused' WHERE slug = 'paused'",
         "UPDATE slice SET state = 'pending' WHERE exam = 'paused' AND chapter_id = 'ch-00000'",
         "UPDATE exam SET state = 'active' WHERE slug IN ('failed', 'cancelled')",
         "UPDATE slice SET state = 'failed' WHERE exam = 'failed' AND chapter_id = 'ch-00003'",
         "UPDATE slice SET state = 'cancelled' WHERE exam = 'cancelled' "
         "AND chapter_id = 'ch-00000'",
         "DELETE FROM question WHERE exam = 'cancelled' AND chapter_id = 'ch-00000' "
         "AND number = 1",
         "DELETE FROM question WHERE exam = 'free'",
         "DELETE FROM call WHERE exam = 'free'",
         "UPDATE slice SET state = 'pending' WHERE exam = 'free'",
         # An exam without a chapter: a copy of a row, with no slice.
         "CREATE TEMP TABLE bare AS SELECT * FROM exam WHERE slug = 'done'",
         "UPDATE bare SET slug = 'bare', title = 'Nothing in it', created_at = 3000, "
         "updated_at = 3001",
         "INSERT INTO exam SELECT * FROM bare")
    return url


def _store_items(url: str, limit: int | None) -> list[dict[str, object]]:
    store = open_existing_store(url)
    try:
        return [summary_dict(e) for e in store.exam_page(limit=limit).items]
    finally:
        store.engine.dispose()


@pytest.mark.parametrize("limit", [None, 100, 7])
def test_the_fast_path_lists_what_the_store_lists(exams_db, limit):
    conn = open_snapshot(exams_db)
    assert conn is not None
    items = read_sqlite.exam_items(conn, limit)
    conn.close()
    assert items == _store_items(exams_db, limit)
    assert [(i["exam"], i["state"]) for i in items] == [  # every state is compared
        ("bare", "done"), ("free", "active"), ("cancelled", "cancelled"),
        ("failed", "failed"), ("paused", "paused"), ("active", "active"), ("done", "done")]


def test_a_next_page_is_left_to_the_store(exams_db):
    conn = open_snapshot(exams_db)
    assert read_sqlite.exam_items(conn, 6) is None
    conn.close()


def test_the_cli_prints_the_same_through_both_paths(exams_db, capsys, monkeypatch):
    fast = {argv: cli(capsys, "exams", *argv) for argv in [(), ("--json",), ("--all",)]}
    assert read_sqlite.exams(True, 100, None, False) is True  # the fast path took them
    monkeypatch.setattr(read_sqlite, "exams", lambda *args: False)  # the store's path only
    for argv, got in fast.items():
        assert got == cli(capsys, "exams", *argv), argv
        assert got[0] == 0
    assert "7 exams" in fast[()][1] and "Nothing in it" in fast[()][1]
    assert json.loads(fast[("--json",)][1])["next"] is None


def test_a_cursor_and_a_next_page_go_the_store_s_way(exams_db, capsys):
    code, out, err = cli(capsys, "exams", "--limit", "3", "--json")
    assert code == 0, err
    page = json.loads(out)
    assert [i["exam"] for i in page["items"]] == ["bare", "free", "cancelled"]
    code, out, err = cli(capsys, "exams", "--limit", "3", "--after", page["next"], "--json")
    assert code == 0, err
    assert [i["exam"] for i in json.loads(out)["items"]] == ["failed", "paused", "active"]
    assert_one_line(*cli(capsys, "exams", "--after", "nonsense")[::2], "is not a cursor")


def test_an_older_schema_is_the_store_s_one_line_error(exams_db, capsys):
    _sql(exams_db[len("sqlite:///"):], "UPDATE alembic_version SET version_num = '0001'")
    assert open_snapshot(exams_db) is None
    assert_one_line(*cli(capsys, "exams")[::2], "revision 0001")
