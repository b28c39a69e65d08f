"""Issue 27, defect 9, on the real PostgreSQL: a rejection racing a slice's final commit,
for an exam without a budget (no exam-row lock on either side).

The commit's transaction is held open at the window: it has fenced its slice, counted the
range as full with the question about to be rejected in it, stored the last question and
marked the slice done, and not committed yet. The rejection runs then. Before the fix it
read the slice as running (the commit's `done` was not committed), withdrew the question
without reopening the slice, and committed; the commit then committed `done`: a done slice
with a gap that no enqueue fills. Now a review action locks its chapter's slices first, so
it waits for the commit and reopens the slice it finds done.

SQLite has one writer at a time: the second transaction cannot start inside the first's
window, so this test is PostgreSQL's only."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, text

from examforge.output import Question, text_hash
from examforge.syllabus import load_syllabus
from helpers import migrates_at_once, wait_for, write_syllabus
from storage.base import Q, S
from storage.store import Usage


@pytest.fixture
@migrates_at_once
def pg_store(pg_url):
    from storage import Store, connect, migrate

    engine = connect(pg_url)
    migrate(engine)
    yield Store(engine)
    engine.dispose()


def _qs(n: int, tag: str) -> list[Question]:
    return [Question(f"{tag} question {i} about topic {tag}{i}?", ("a", "b", "c", "d"), 0,
                     "why") for i in range(n)]


def _waiting_on_a_lock(store: Any) -> bool:
    with store.engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).scalar_one())


def test_a_rejection_racing_the_final_commit_never_leaves_a_done_slice_with_a_gap(
        pg_store, tmp_path):
    store = pg_store
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 4)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))  # no budget
    claim = store.claim("ex", "a", "w", 30.0, 8)
    call = store.start_call(claim, 1, 3, lease_s=30.0)
    store.commit_batch(claim, 30.0, call, _qs(3, "first"), model="m", usage=Usage(1, 1, 0.0))
    victim = store.chapter_questions("ex", "a")[1][1]
    last = store.start_call(claim, 4, 1, lease_s=30.0)

    # The final commit, held open at the window.
    final = _qs(1, "last")
    conn = store.engine.connect()
    held = conn.begin()
    result, _ = store._commit(conn, claim, 30.0, last, final, [text_hash(final[0].question)],
                              model="m", usage=Usage(1, 1, 0.0), note="", plan_next=None)
    assert result.done  # it counted the range full, the victim in it

    # The rejection, meanwhile.
    errors: list[BaseException] = []

    def reject() -> None:
        try:
            store.reject("ex", victim["id"], victim["version"], "alice")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    rejecting = threading.Thread(target=reject)
    rejecting.start()
    # Either it waits for the commit's slice row (the fix) or it has finished (the race).
    wait_for(lambda: not rejecting.is_alive() or _waiting_on_a_lock(store), 20,
             "the rejection to finish or wait on a lock")
    waited = rejecting.is_alive()
    held.commit()
    conn.close()
    rejecting.join(20)
    assert not rejecting.is_alive() and not errors, errors

    with store.engine.connect() as c:
        state = c.execute(select(S.c.state).where(S.c.exam == "ex")).scalar_one()
        numbers = sorted(c.execute(select(Q.c.number).where(
            Q.c.exam == "ex", Q.c.number.is_not(None))).scalars())
    assert numbers == [1, 3, 4]  # the rejected one's number is free
    assert state == "pending", "a done slice with a gap: no enqueue would fill number 2"
    assert waited  # the rejection waited for the commit's transaction
    # The next enqueue generates exactly the missing number.
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    assert plan.slices == [("a", 0)]
