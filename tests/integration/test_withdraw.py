"""Withdrawing questions from their chapter's numbering (Store.withdraw), on SQLite and on
the real PostgreSQL (db_url runs both): the row stays, its number is free, the count and the
exports drop it, and only the missing numbers are generated, once each."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage.base import Q, S
from storage.store import Claimed, NotClaimed, Usage, Withdrawn


def _sync(store, tmp_path, chapters, slug="ex", slice_questions=50):
    path = write_syllabus(tmp_path / "exams", slug, chapters)
    return store.sync_exam(slug, load_syllabus(path, max_questions=1000),
                           slice_questions=slice_questions)


def _qs(n, tag):
    return [Question(f"{tag} question {i} about topic {tag}{i}?", ("a", "b", "c", "d"), 0, "")
            for i in range(n)]


def _commit(store, claim, n, tag, verify=False):
    call = store.start_call(claim, 1, n, lease_s=10.0)
    return store.commit_batch(claim, 10.0, call, _qs(n, tag), model="m",
                              usage=Usage(10, 20, 0.001), verify=verify)


def _ids(store, numbers, chapter="a"):
    with store.engine.connect() as conn:
        return dict(conn.execute(select(Q.c.number, Q.c.id).where(
            Q.c.exam == "ex", Q.c.chapter_id == chapter, Q.c.number.in_(numbers))).all())


def _slice(store, chapter="a", slice_no=0):
    with store.engine.connect() as conn:
        return conn.execute(select(S).where(S.c.exam == "ex", S.c.chapter_id == chapter,
                                            S.c.slice_no == slice_no)).one()


def test_a_withdrawn_question_stays_leaves_the_count_and_its_number_is_taken_again(
        store, tmp_path):
    _sync(store, tmp_path, [("a", 6)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert _commit(store, claim, 6, "first").done
    ids = _ids(store, [2, 5])
    done = store.withdraw("ex", [ids[2], ids[5]], Withdrawn.rejected)
    assert done.withdrawn == tuple(sorted(ids.values())) and done.reopened == (("a", 0),)
    # The rows stay, numberless, with their reason and old number.
    assert store.withdrawn_questions("ex") == sorted(
        [(ids[2], "a", "rejected", 2), (ids[5], "a", "rejected", 5)])
    # Out of the count and of every export.
    assert store.questions_done("ex") == 4
    assert [q["number"] for q in store.questions("ex")] == [1, 3, 4, 6]
    # The done slice is pending again, with no enqueue recorded: the reconciler leaves it
    # alone, and the next enqueue publishes it.
    row = _slice(store)
    assert row.state == "pending" and row.enqueued_at is None
    assert store.orphans(0.0, None) == []
    # Withdrawing again changes nothing.
    assert store.withdraw("ex", [ids[2]], "rejected").withdrawn == ()
    plan = _sync(store, tmp_path, [("a", 6)])
    assert plan.slices == [("a", 0)]
    again = store.claim("ex", "a", "w2", 10.0, 8)
    assert isinstance(again, Claimed) and again.stored == 4
    # Only the two missing numbers are generated: a reply of three stores two, at 2 and 5.
    committed = _commit(store, again, 3, "second")
    assert committed.done and committed.stored == 6 and committed.surplus == 1
    numbers = {q["number"]: q["question"] for q in store.questions("ex")}
    assert sorted(numbers) == [1, 2, 3, 4, 5, 6]
    assert numbers[2].startswith("second") and numbers[5].startswith("second")
    assert store.claim("ex", "a", "w3", 10.0, 8) == NotClaimed("done")


def test_a_running_slice_goes_on_to_its_target_after_a_withdrawal(store, tmp_path):
    _sync(store, tmp_path, [("a", 6)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert not _commit(store, claim, 4, "first").done
    ids = _ids(store, [1])
    # Withdrawn while its holder runs: the slice stays running, the holder's next commit
    # counts 3 and fills 1, 5 and 6.
    assert store.withdraw("ex", [ids[1]], Withdrawn.disputed).reopened == ()
    assert _slice(store).state == "running"
    committed = _commit(store, claim, 3, "second")
    assert committed.done and committed.stored == 6
    assert [q["number"] for q in store.questions("ex")] == [1, 2, 3, 4, 5, 6]
    assert store.withdrawn_questions("ex") == [(ids[1], "a", "disputed", 1)]


def test_withdrawals_reopen_only_the_slices_they_touch(store, tmp_path):
    _sync(store, tmp_path, [("a", 6), ("b", 2)], slice_questions=3)
    for chapter, slices in (("a", (0, 1)), ("b", (0,))):
        for no in slices:
            claim = store.claim("ex", chapter, f"w{chapter}{no}", 10.0, 8, slice_no=no)
            assert _commit(store, claim, claim.target, f"{chapter}{no}").done
    ids = _ids(store, [5])
    assert store.withdraw("ex", [ids[5]], "rejected").reopened == (("a", 1),)
    assert [(r.chapter_id, r.slice_no, r.state) for r in _states(store)] == [
        ("a", 0, "done"), ("a", 1, "pending"), ("b", 0, "done")]
    # Another exam's id, or an unknown one, is ignored.
    assert store.withdraw("other", [ids[5]], "rejected").withdrawn == ()
    assert store.withdraw("ex", [10 ** 9], "rejected").withdrawn == ()


def _states(store):
    with store.engine.connect() as conn:
        return conn.execute(select(S.c.chapter_id, S.c.slice_no, S.c.state)
                            .where(S.c.exam == "ex")
                            .order_by(S.c.chapter_id, S.c.slice_no)).all()


def test_exports_skip_withdrawn_questions(store, tmp_path):
    import sqlite3

    from producer import export, export_sqlite

    _sync(store, tmp_path, [("a", 3)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert _commit(store, claim, 3, "first").done
    ids = _ids(store, [2])
    store.withdraw("ex", [ids[2]], "disputed")
    gone = "first question 1 about topic first1?"
    # Every export (the tables and the banks, which write these rows) reads iter_questions.
    rows = list(store.iter_questions("ex"))
    assert [r["number"] for r in rows] == [1, 3] and gone not in {r["question"] for r in rows}
    for fmt in ("jsonl", "json", "csv"):
        out = tmp_path / f"out.{fmt}"
        assert export.export(iter(rows), fmt, str(out)) == 2
        assert gone not in out.read_text()
    bank = list(export.bank_questions(iter(rows)))
    assert [q.number for q in bank] == [1, 3]
    if store.engine.dialect.name == "sqlite":  # the SQLite fast path's own query
        path = store.engine.url.database
        with sqlite3.connect(path) as conn:
            fast = list(export_sqlite.rows(conn, "ex"))
        assert [r["number"] for r in fast] == [1, 3]


def test_a_verified_commit_stores_pending_verdicts(store, tmp_path):
    _sync(store, tmp_path, [("a", 2)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 2, "v", verify=True)
    with store.engine.connect() as conn:
        assert conn.execute(select(Q.c.verdict).where(Q.c.exam == "ex")).scalars().all() == [
            "pending", "pending"]
    json.dumps(store.questions("ex"))
