"""Store.prune on SQLite and on the real PostgreSQL (db_url runs both)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select, text

from examforge.errors import ExamRunning, LeaseLost, UnknownExam
from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import wait_for, write_syllabus
from storage import Store, connect, migrate
from storage.base import E, K, Q, S
from storage.store import Claimed, Usage


def _sync(store, tmp_path, slug, chapters):
    path = write_syllabus(tmp_path / "exams", slug, chapters)
    store.sync_exam(slug, load_syllabus(path, max_questions=1000))


def _qs(n, start=0):
    return [Question(f"q {start + i}?", ("a", "b", "c", "d"), 0, "") for i in range(n)]


def _finish(store, slug, chapter_id, n):
    """Generate a chapter of n questions to the end, 5 a call."""
    claim = store.claim(slug, chapter_id, "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    for first in range(1, n + 1, 5):
        count = min(5, n - first + 1)
        call = store.start_call(claim, first, count, lease_s=30.0)
        store.commit_batch(claim, 30.0, call, _qs(count, first), model="m",
                           usage=Usage(10, 20, 0.001))


def _rows(store, slug):
    """Rows the exam owns, in every table."""
    with store.engine.connect() as conn:
        return {name: conn.execute(select(func.count()).select_from(t).where(
            (t.c.slug if t is E else t.c.exam) == slug)).scalar_one()
            for name, t in (("exam", E), ("slice", S), ("question", Q), ("call", K))}


def test_prune_deletes_finished_exams_with_all_their_rows_and_keeps_running_ones(
        store, tmp_path):
    _sync(store, tmp_path, "old", [("a", 7), ("b", 3)])
    _finish(store, "old", "a", 7)
    _finish(store, "old", "b", 3)
    _sync(store, tmp_path, "live", [("a", 10)])
    _finish(store, "live", "a", 10)
    _sync(store, tmp_path, "live", [("a", 10), ("b", 5)])  # b pending
    kept = _rows(store, "live")

    dry = store.prune(0, dry_run=True)
    assert [fp.exam for fp in dry.pruned] == ["old"] and [fp.exam for fp in dry.running] == [
        "live"]
    fp = dry.pruned[0]
    assert (fp.chapters, fp.slices, fp.questions, fp.calls) == (2, 2, 10, 3)
    assert fp.cost_usd == pytest.approx(0.003) and fp.age_s >= 0
    assert _rows(store, "old") == {"exam": 1, "slice": 2, "question": 10, "call": 3}

    assert store.prune(3600).recent and _rows(store, "old")["exam"] == 1  # too recent

    done = store.prune(0)
    assert [f.exam for f in done.pruned] == ["old"]
    assert _rows(store, "old") == {"exam": 0, "slice": 0, "question": 0, "call": 0}
    assert _rows(store, "live") == kept
    with pytest.raises(UnknownExam):
        store.status("old")


def test_prune_of_one_exam_refuses_it_while_a_chapter_is_pending_or_running(store, tmp_path):
    _sync(store, tmp_path, "ex", [("a", 10), ("b", 10)])
    _finish(store, "ex", "a", 10)
    claim = store.claim("ex", "b", "w", 30.0, 8)  # running
    with pytest.raises(ExamRunning, match="cancel it first"):
        store.prune(0, exam="ex")
    with pytest.raises(ExamRunning):
        store.prune(0, exam="ex", dry_run=True)
    assert _rows(store, "ex")["question"] == 10
    assert isinstance(claim, Claimed)
    store.cancel("ex")
    assert [fp.exam for fp in store.prune(0, exam="ex").pruned] == ["ex"]
    with pytest.raises(UnknownExam):
        store.prune(0, exam="ex")


@pytest.mark.slow
def test_a_worker_frozen_mid_call_on_a_pruned_exam_stores_nothing_when_it_comes_back(
        store, tmp_path):
    _sync(store, tmp_path, "ex", [("a", 10)])
    claim = store.claim("ex", "a", "frozen", 30.0, 8)
    assert isinstance(claim, Claimed)
    call = store.start_call(claim, 1, 5, lease_s=30.0)  # the request is out
    store.cancel("ex")
    assert [fp.exam for fp in store.prune(0).pruned] == ["ex"]
    with pytest.raises(LeaseLost):
        store.commit_batch(claim, 30.0, call, _qs(5), model="m", usage=Usage(10, 20, 0.001))
    assert store.renew(["frozen"], 30.0) == set()
    assert _rows(store, "ex") == {"exam": 0, "slice": 0, "question": 0, "call": 0}


def test_prune_racing_a_committing_worker_never_deletes_a_running_exam(store, tmp_path):
    """A worker commits batches while prune(0) runs in a loop: every commit succeeds (prune
    never took a running exam away), and the exam goes only once complete, all of it."""
    n = 50  # one slice (SLICE_QUESTIONS)
    _sync(store, tmp_path, "ex", [("a", n)])
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    errors: list[BaseException] = []
    pruned: list[int] = []

    def prune_loop() -> None:
        try:
            while not pruned:
                result = store.prune(0)
                pruned.extend(fp.questions for fp in result.pruned)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    pruner = threading.Thread(target=prune_loop)
    pruner.start()
    try:
        for first in range(1, n + 1, 5):
            call = store.start_call(claim, first, 5, lease_s=30.0)
            store.commit_batch(claim, 30.0, call, _qs(5, first), model="m",
                               usage=Usage(10, 20, 0.001))
    finally:
        wait_for(lambda: pruned or errors, 60, "the exam to be pruned once done")
        pruner.join(30)
    assert not errors, errors
    assert pruned == [n]  # deleted once, whole
    assert _rows(store, "ex") == {"exam": 0, "slice": 0, "question": 0, "call": 0}


def test_prune_skips_an_exam_whose_rows_another_transaction_holds(pg_url, tmp_path):
    """PostgreSQL: rows locked by another transaction (a worker's commit, an enqueue) mean
    the exam is in use: prune reports it busy at once, neither waits nor deletes."""
    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    try:
        _sync(store, tmp_path, "ex", [("a", 5)])
        _finish(store, "ex", "a", 5)
        with engine.connect() as holder:
            holder.execute(text("SELECT 1 FROM slice WHERE exam = 'ex' FOR UPDATE"))
            result = store.prune(0)
            assert result.busy == ["ex"] and not result.pruned
            holder.rollback()
        assert [fp.exam for fp in store.prune(0).pruned] == ["ex"]
    finally:
        engine.dispose()


def test_enqueue_concurrent_with_a_prune_of_the_same_exam_recreates_it(pg_url, tmp_path):
    """A prune that deletes a finished exam while an enqueue of it is between recording the
    exam and writing its slices: the enqueue must neither fail on the slices' foreign key
    nor leave slices without their exam. Ordered deterministically: the prune's transaction
    holds the exam row first; the enqueue's insert finds it (and takes no lock), then waits
    on its locking read; the prune deletes everything and commits."""
    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    _sync(store, tmp_path, "old", [("a", 5)])
    _finish(store, "old", "a", 5)
    path = write_syllabus(tmp_path / "exams2", "old", [("a", 5), ("b", 3)])
    syllabus = load_syllabus(path, max_questions=1000)
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            store.sync_exam("old", syllabus)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with engine.connect() as pruner:
        tx = pruner.begin()
        pruner.execute(select(E.c.slug).where(E.c.slug == "old").with_for_update()).all()
        worker = threading.Thread(target=enqueue)
        worker.start()
        with engine.connect() as watcher:
            def waiting() -> bool:
                n = watcher.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")).scalar_one()
                # Ended every time: a transaction keeps its first snapshot of
                # pg_stat_activity, and a poll that came too early would never see the wait.
                watcher.rollback()
                return n >= 1

            wait_for(waiting, 10, "the enqueue to wait on the exam row")
        for table in (Q, K, S):
            pruner.execute(table.delete().where(table.c.exam == "old"))
        pruner.execute(E.delete().where(E.c.slug == "old"))
        tx.commit()
    worker.join(10)
    assert not worker.is_alive() and errors == []
    rows = _rows(store, "old")
    assert rows["exam"] == 1 and rows["question"] == 0
    with engine.connect() as conn:
        slices = conn.execute(select(S.c.chapter_id, S.c.target).where(S.c.exam == "old")
                              .order_by(S.c.chapter_id)).all()
    assert [tuple(r) for r in slices] == [("a", 5), ("b", 3)]
    engine.dispose()
