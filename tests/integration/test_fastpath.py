"""PostgreSQL's per-call path in plain SQL (storage.fastpath, migration 0025): each step is one
statement, and a commit whose optimistic preparation no longer holds (the worker's
near-duplicate index is behind, the slice's count changed) writes nothing but goes the
general way, with the same result the general path alone would give."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, select, text

from examforge.neardup import Checker
from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import migrates_at_once, write_syllabus
from storage import Store, connect, migrate, neardup
from storage.store import Claimed, Q, Steer, Usage

ORIGINAL = "Which AWS service provides durable object storage for static website assets?"
PARAPHRASE = "Which of the following AWS services offers durable object storage for static " \
             "website assets?"
OTHER = "What is the default port used by HTTPS?"


@pytest.fixture
@migrates_at_once
def pg_store(pg_url, tmp_path):  # type: ignore[no-untyped-def]
    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 10)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000), slice_questions=50)
    statements: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _log(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        statements.append(statement)

    yield store, statements
    engine.dispose()


def _commit(store: Store, claim: Claimed, texts: list[str]) -> Any:
    call = store.start_call(claim, claim.first_number, len(texts), lease_s=30.0)
    return store.commit_batch(claim, 30.0, call, [Question(t, ("a", "b", "c", "d"), 0, "")
                                                  for t in texts],
                              model="m", usage=Usage(1, 1, 0.0), near_dup=Checker(),
                              steer=Steer())


def test_claim_and_commit_are_one_statement_each(pg_store):
    store, statements = pg_store
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    assert [s.split("(")[0] for s in statements] == ["SELECT * FROM ef_claim"]
    statements.clear()
    call = store.start_call(claim, 1, 2, lease_s=30.0)  # the slow path's record: general
    statements.clear()
    committed = store.commit_batch(claim, 30.0, call, [Question(ORIGINAL, ("a", "b", "c", "d"),
                                                                0, "")],
                                   model="m", usage=Usage(1, 1, 0.0), near_dup=Checker(),
                                   steer=Steer())
    assert [s.split("(")[0] for s in statements] == ["SELECT * FROM ef_commit"]
    assert (committed.stored, committed.kept) == (1, (ORIGINAL,))


def test_a_commit_whose_index_is_behind_takes_the_general_path_and_finds_the_repeat(
        pg_store):
    store, statements = pg_store
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    _commit(store, claim, [ORIGINAL])
    # Another process's view: an index that has not seen the question just stored.
    neardup.INDEXES.clear()
    statements.clear()
    committed = _commit(store, claim, [PARAPHRASE, OTHER])
    assert any(s.startswith("SELECT * FROM ef_commit") for s in statements)
    assert any(s.startswith("INSERT INTO question") for s in statements)  # the general path
    assert committed.kept == (OTHER,) and committed.near_duplicates == 1
    with store.engine.connect() as conn:
        assert conn.execute(select(Q.c.number, Q.c.question).order_by(Q.c.number)).all() == [
            (1, ORIGINAL), (2, OTHER)]


def test_a_commit_whose_count_changed_under_it_is_numbered_from_the_real_count(pg_store):
    store, _ = pg_store
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    _commit(store, claim, [ORIGINAL])
    # A question of the slice's range deleted by hand: the holder's count is one too many.
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM question_sig"))
        conn.execute(text("DELETE FROM question"))
    neardup.INDEXES.clear()
    committed = _commit(store, claim, [OTHER])
    assert (committed.stored, committed.kept) == (1, (OTHER,))
    with store.engine.connect() as conn:
        assert conn.execute(select(Q.c.number)).scalars().all() == [1]


def test_the_commits_arrays_keep_every_character(pg_store):
    """The commit sends its arrays as PostgreSQL array literals (fastpath._text_array):
    quotes, backslashes, braces, commas, a literal NULL and non-ASCII come back as sent."""
    store, statements = pg_store
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    texts = ['Is "{a, b}" a set\\tuple?', "NULL", "Ünïcode: what is 1,5 € in ¥?",
             "Line one\nline two, it's \\\\ two"]
    call = store.start_call(claim, 1, len(texts), lease_s=30.0)
    statements.clear()
    committed = store.commit_batch(
        claim, 30.0, call, [Question(t, (f'"{t}"', "b\\", "{c}", "NULL"), 3, f"why {t}")
                            for t in texts],
        model="m", usage=Usage(1, 1, 0.0), near_dup=Checker(), steer=Steer())
    assert [s.split("(")[0] for s in statements] == ["SELECT * FROM ef_commit"]
    assert committed.stored == len(texts)
    with store.engine.connect() as conn:
        rows = conn.execute(select(Q.c.question, Q.c.choices, Q.c.explanation, Q.c.answer_index)
                            .order_by(Q.c.number)).all()
    assert [r.question for r in rows] == texts
    assert all(r.explanation == f"why {r.question}" for r in rows)
    import json
    for r in rows:
        assert sorted(json.loads(r.choices)) == sorted([f'"{r.question}"', "b\\", "{c}", "NULL"])
