"""History must not slow the present (issue 19), on both databases: the partial indexes
exist, every query of a reconcile pass reads through them (EXPLAIN, PostgreSQL), `exams` is
aggregated in SQL with the figures the rows say, and its keyset pages neither skip nor repeat
an exam when exams are recorded between pages. The data set is bench/history.py's, small:
200 finished exams of 100 slices (20,000 done slices) and 5 active ones."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import event, text

from bench.history import build, reconcile_store_work
from examforge.errors import BadCursor

PARTIAL = {"ix_slice_active": "pending", "ix_slice_cancelled_held": "cancelled",
           "ix_call_in_flight": "in_flight"}


# Rows read by key, from a row a partial index gave.
KEYS = ("slice_pkey", "call_pkey", "exam_pkey")


def _statements(store: Any) -> list[tuple[str, Any]]:
    """The SQL one reconcile pass's store work sends, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        reconcile_store_work(store)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return [(s, p) for s, p in seen if s.lstrip().upper().startswith(("SELECT", "UPDATE",
                                                                        "WITH"))]


def _scans(plan: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(node type, relation, index) of every node of a JSON plan that reads a table."""
    out = []
    if "Relation Name" in plan and plan["Node Type"] != "ModifyTable":
        index = plan.get("Index Name")
        if plan["Node Type"] == "Bitmap Heap Scan":  # the index is its child's
            index = next((p.get("Index Name") for p in plan.get("Plans", [])), None)
        out.append((plan["Node Type"], plan["Relation Name"], index))
    for child in plan.get("Plans", []):
        out += _scans(child)
    return out


def test_the_partial_indexes_exist_with_their_conditions(store):
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "postgresql":
            defs = dict(conn.execute(text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE 'ix_%'")).all())
        else:
            defs = dict(conn.execute(text(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )).all())
    for name, value in PARTIAL.items():
        assert name in defs, sorted(defs)
        where = defs[name].upper().split(" WHERE ", 1)
        assert len(where) == 2 and value.upper() in where[1], defs[name]
    assert "ix_exam_created" in defs


def test_0017_indexes_a_database_that_already_holds_history(db_url):
    from alembic import command

    from storage import Store, connect, migrate
    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0015")
    build(engine, 20)
    migrate(engine)
    store = Store(engine)
    assert reconcile_store_work(store)["waiting"] == 5 * 10 * 5  # the active exams' pending
    assert len(store.exams()) == 25
    with engine.connect() as conn:
        sql = ("SELECT indexname FROM pg_indexes" if engine.dialect.name == "postgresql"
               else "SELECT name FROM sqlite_master WHERE type = 'index'")
        names = set(conn.execute(text(sql)).scalars())
    assert set(PARTIAL) | {"ix_exam_created"} <= names
    engine.dispose()


def test_a_reconcile_pass_reads_only_active_rows_on_postgresql(pg_url):
    """At 20,000 done slices, no statement of a reconcile pass scans the slice, call or exam
    table whole: each reads them through a partial index, or by primary key from a row such an
    index gave (the planner's choice at a million is the same: bench/history.py, docs/explanations/benchmarks.md)."""
    from storage import open_store

    store = open_store(pg_url)
    try:
        build(store.engine, 200)
        with store.engine.begin() as conn:
            # Exams by the thousand, as a year leaves them (their slices would only make the
            # test slower): on a table of 205 rows a scan is the planner's right choice.
            conn.execute(text(
                "INSERT INTO exam (slug, title, state, auth_failures, spent_usd, reserved_usd,"
                " created_at, updated_at) SELECT 'bare-' || i, 'Bare', 'active', 0, 0, 0, i, i"
                " FROM generate_series(1, 5000) AS i"))
            conn.execute(text("ANALYZE exam"))
        statements = _statements(store)
        assert len(statements) >= 6
        used: set[str] = set()
        with store.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            for sql, params in statements:
                with raw.cursor() as cur:
                    cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
                    plan = cur.fetchone()[0][0]["Plan"]
                for node, relation, index in _scans(plan):
                    if relation in ("slice", "call", "exam"):
                        assert node != "Seq Scan", (sql, json.dumps(plan)[:2000])
                        used.add(index)
                        assert index in PARTIAL or index in KEYS, (sql, index)
            raw.rollback()
        assert {"ix_slice_active", "ix_slice_cancelled_held", "ix_call_in_flight"} <= used
    finally:
        store.engine.dispose()


def test_a_reconcile_pass_reads_only_active_rows_on_sqlite(sqlite_url):
    """The same on SQLite, which uses a partial index only when the query has its terms
    literally (storage.base.ACTIVE_SLICE): a table is scanned only through one."""
    from storage import open_store

    store = open_store(sqlite_url)
    try:
        build(store.engine, 200)
        with store.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            steps = [row[3] for sql, params in _statements(store)
                     for row in raw.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()]
        scans = [s for s in steps if s.startswith("SCAN ")]
        assert scans and all(any(f"USING INDEX {name}" in s for name in PARTIAL)
                             for s in scans), steps
        assert {name for name in PARTIAL if any(name in s for s in steps)} == set(PARTIAL)
    finally:
        store.engine.dispose()


def test_exams_counts_what_the_rows_say(store):
    """The aggregates in SQL against rows whose figures are known: done slices counted from
    their targets, an open slice from its questions, a failed exam, a cancelled one."""
    build(store.engine, 3, 2)
    with store.engine.begin() as conn:
        # Three questions in an open slice of the first active exam (ch0, slice 5: 51-60),
        # and one outside every range (not counted).
        for number in (51, 52, 53, 999):
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, model, created_at) VALUES ('hist-active-000000', "
                "'ch0', :n, :q, '[]', 0, '', 'm', 0)"), {"n": number, "q": f"q{number}"})
        # The second active exam: its open slices failed, one chapter's cancelled.
        conn.execute(text("UPDATE slice SET state = 'failed', lease_owner = NULL "
                          "WHERE exam = 'hist-active-000001' AND state IN ('pending', 'running')"
                          " AND chapter_id <> 'ch0'"))
        conn.execute(text("UPDATE slice SET state = 'cancelled', lease_owner = NULL "
                          "WHERE exam = 'hist-active-000001' AND chapter_id = 'ch0' "
                          "AND state <> 'done'"))
        # A finished exam with one chapter cancelled: cancelled.
        conn.execute(text("UPDATE slice SET state = 'cancelled' WHERE exam = 'hist-done-000002'"
                          " AND chapter_id = 'ch3' AND slice_no = 9"))
    got = {e.exam: e for e in store.exams()}
    assert len(got) == 5
    first = got["hist-active-000000"]
    assert (first.state, first.chapters.target, first.chapters.done) == ("active", 10, 0)
    assert (first.questions.target, first.questions.done) == (1000, 400 + 3)
    assert got["hist-active-000001"].state == "failed"
    assert got["hist-done-000002"].state == "cancelled"
    assert got["hist-done-000002"].chapters.done == 9
    done = got["hist-done-000000"]
    assert (done.state, done.chapters.done, done.questions.done) == ("done", 10, 1000)
    assert done.cost_usd == pytest.approx(100 * 0.0021)
    # /metrics reads the same figures, without the ledger's cost.
    figures = {e.exam: e for e in store.exam_figures()[0]}
    assert {k: (v.state, v.questions) for k, v in figures.items()} == {
        k: (v.state, v.questions) for k, v in got.items()}


def _add_exams(store: Any, slugs: list[str], created_at: float) -> None:
    with store.engine.begin() as conn:
        for slug in slugs:
            conn.execute(text(
                "INSERT INTO exam (slug, title, state, auth_failures, spent_usd, reserved_usd, "
                "created_at, updated_at) VALUES (:s, :title, 'active', 0, 0, 0, :t, :t)"),
                {"s": slug, "title": slug, "t": created_at})


def test_keyset_pages_skip_and_repeat_nothing_while_exams_are_added(store):
    build(store.engine, 30, 0)
    # Ties on created_at across a page boundary: the slug breaks them.
    _add_exams(store, [f"tie-{i}" for i in range(5)], 1.0)
    before = [e.exam for e in store.exams()]
    assert len(before) == 35 and before[-5:] == [f"tie-{i}" for i in (4, 3, 2, 1, 0)]
    seen: list[str] = []
    after = None
    for n in range(20):
        page = store.exam_page(limit=4, after=after)
        seen += [e.exam for e in page.items]
        # Recorded between pages, on the database clock: newer than every page shown.
        _add_exams(store, [f"new-{n}"], 10**10 + n)
        if page.next is None:
            break
        after = page.next
    assert seen == before  # the same exams, once each, in order
    assert store.exam_page(limit=1000).next is None
    assert len(store.exam_page(limit=None).items) == 35 + n + 1
    with pytest.raises(BadCursor):
        store.exam_page(limit=4, after="not-a-cursor")
