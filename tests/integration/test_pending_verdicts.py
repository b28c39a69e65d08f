"""Pending verdicts are work (issue 27, defect 4), on SQLite and PostgreSQL: a slice is done
only when its range is full and none of its verdicts is pending. Planning (`sync_exam`: what
`enqueue`, `run` and `POST /runs` do) never marks such a slice done and never clears a live
holder's lease; the reconciler re-publishes a slice a dead `producer run` left with verdicts
pending; and the next worker solves them, exactly once (the mock counts its solves)."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import select, update

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from storage.base import Q, S
from storage.store import Claimed, RequeueReason, Usage

PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}


@pytest.fixture
def mock():
    with MockServer(MockConfig(latency_s=0, seed=3)) as server:
        yield server


def _sync(store, tmp_path, n=5, **policy):
    path = write_syllabus(tmp_path / "exams", "ex", [("a", n)])
    return store.sync_exam("ex", load_syllabus(path, max_questions=1000), **policy)


# Where a kill leaves the slice (runner.verify's steps; solve_answered leaves the database
# as solve_recorded does: the reply never reached it).
STEPS = ["after_commit", "solve_recorded"]


def _committed_pending(store, tmp_path, n=5, step="after_commit"):
    """An exam under `flag` whose only slice has its range full, every verdict pending:
    where a holder killed between its commit and its blind solve leaves it (with
    `solve_recorded`, its solve call recorded, in flight)."""
    _sync(store, tmp_path, n, default_verify="flag")
    claim = store.claim("ex", "a", "doomed", 30.0, 8)
    assert isinstance(claim, Claimed)
    call = store.start_call(claim, 1, n, lease_s=30.0)
    questions = [Question(f"Question {i} about topic t{i}?", ("a", "b", "c", "d"), 0, "")
                 for i in range(n)]
    committed = store.commit_batch(claim, 30.0, call, questions, model="m",
                                   usage=Usage(10, 20, 0.001), verify=True)
    assert committed.stored == n and _slice(store).state == "running"
    if step == "solve_recorded":
        store.start_call(claim, 1, n, lease_s=30.0, kind="solve")
    return claim


def _die(store):
    """The holder is gone: its lease lapsed (on the database's clock)."""
    with store.engine.begin() as conn:
        conn.execute(update(S).where(S.c.exam == "ex").values(lease_expires_at=0))


def _slice(store):
    with store.engine.connect() as conn:
        return conn.execute(select(S).where(S.c.exam == "ex")).one()


def _verdicts(store):
    with store.engine.connect() as conn:
        return sorted(v for v in conn.execute(
            select(Q.c.verdict).where(Q.c.exam == "ex", Q.c.number.is_not(None))).scalars())


def _solve(make_settings, db_url, mock, store):
    """What the worker given the slice does (Celery's task or `producer run`'s thread)."""
    from runner.pipeline import Runtime, process_chapter

    settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                             verify="off", **PRICES)  # the exam's policy rules, not this
    rt = Runtime.build(settings, store)
    try:
        deadline = time.monotonic() + 30
        while True:
            result = process_chapter(rt, "ex", "a")
            if result.outcome in ("done", "skipped"):
                return result
            assert result.outcome == "retry" and time.monotonic() < deadline, result
            time.sleep(min(result.retry_in_s or 0.0, 0.5))  # the backoff it asks for
    finally:
        rt.close()


def _solves(mock):
    return httpx.get(mock.base_url + "/_stats").json()["solves"]


@pytest.mark.parametrize("step", STEPS)
def test_after_a_crash_planning_enqueues_the_pending_verdicts_and_a_worker_solves_them_once(
        store, tmp_path, make_settings, db_url, mock, step):
    _committed_pending(store, tmp_path, step=step)
    _die(store)
    # enqueue, run and POST /runs plan through sync_exam: the slice is work, not done.
    plan = _sync(store, tmp_path)
    assert plan.slices == [("a", 0)] and "a" not in plan.skipped, plan
    assert _slice(store).state != "done" and _verdicts(store) == ["pending"] * 5
    assert _solve(make_settings, db_url, mock, store).outcome == "done"
    assert _solves(mock) == 1 and set(_verdicts(store)) <= {"agreed", "disputed"}
    # Solved once: a second plan finds it done, and a second delivery solves nothing.
    assert _sync(store, tmp_path).skipped == {"a": "done"}
    _solve(make_settings, db_url, mock, store)
    assert _solves(mock) == 1 and _slice(store).state == "done"


@pytest.mark.parametrize("step", STEPS)
def test_the_reconciler_republishes_a_slice_a_dead_run_left_with_verdicts_pending(
        store, tmp_path, make_settings, db_url, mock, step):
    # A `producer run` (never enqueued), then killed.
    _committed_pending(store, tmp_path, step=step)
    assert store.orphans(0.0, None) == []  # its lease is live: not an orphan
    _die(store)
    orphans = store.orphans(0.0, None)
    assert [(o.chapter_id, o.slice_no, o.reason) for o in orphans] == [
        ("a", 0, RequeueReason.verdicts_pending)]
    store.mark_enqueued("ex", [("a", 0)], None, requeue=(orphans[0].reason, "test"))
    assert store.orphans(0.0, None) == []  # published: not again until a worker takes it
    _solve(make_settings, db_url, mock, store)
    assert _solves(mock) == 1 and _slice(store).state == "done"
    assert store.orphans(0.0, None) == []


def test_planning_never_clears_a_live_holders_lease(store, tmp_path):
    claim = _committed_pending(store, tmp_path)
    _sync(store, tmp_path)  # a second enqueue while the holder solves
    row = _slice(store)
    assert row.lease_owner == "doomed" and row.state == "running"
    # The holder's solve is booked, not lost: its verdicts land and the slice is done.
    call = store.start_call(claim, 1, 5, lease_s=30.0, kind="solve")
    pending = store.pending_verdicts(claim)
    judged = store.commit_verdicts(claim, 30.0, call, [(p.id, p.answer_index) for p in pending],
                                   usage=Usage(5, 5, 0.0001))
    assert judged.done and judged.agreed == 5 and _slice(store).lease_owner is None


def test_a_slice_marked_done_with_verdicts_pending_is_work_again(store, tmp_path):
    """As an older examforge left it: done, verdicts pending."""
    _committed_pending(store, tmp_path)
    with store.engine.begin() as conn:
        conn.execute(update(S).where(S.c.exam == "ex").values(
            state="done", lease_owner=None, lease_expires_at=None))
    plan = _sync(store, tmp_path)
    assert plan.slices == [("a", 0)] and _slice(store).state == "pending"


def test_under_off_pending_verdicts_are_kept_and_are_not_work(store, tmp_path):
    """Lowering the policy deletes no verdict; under `off` nothing solves them."""
    _committed_pending(store, tmp_path)
    _die(store)
    plan = _sync(store, tmp_path, verify="off")
    assert plan.skipped == {"a": "done"} and _slice(store).state == "done"
    assert _verdicts(store) == ["pending"] * 5
    assert store.orphans(0.0, None) == []
