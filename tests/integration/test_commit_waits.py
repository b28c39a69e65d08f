"""Leases whose holder waits: behind another worker's commit (PostgreSQL), or planning its
first call inside the claim (both databases).

A commit locks its slice row at the fence and keeps it until it ends. When it then waits (for
the exam's question order, or a near-duplicate scope, held by a worker that froze mid-commit),
the lease's timestamp can pass while the holder is alive and its fenced commit still valid:
nobody can take a locked row. Neither the reconciler's sweep nor the holder's own heartbeat
may then treat it as gone. Found by the chaos test: a frozen worker mid-commit made the sweep
book other workers' waiting replies as crashes, and their commits then failed."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from examforge.syllabus import load_syllabus
from helpers import migrates_at_once, wait_lease_expired, write_syllabus
from storage import Store, connect, migrate
from storage.store import CallPlan, Claimed

pytestmark = pytest.mark.integration


@pytest.fixture
@migrates_at_once
def pg_store(pg_url):  # type: ignore[no-untyped-def]
    engine = connect(pg_url)
    migrate(engine)
    yield Store(engine)
    engine.dispose()


def _outcome(store: Store, call: int) -> str:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT outcome FROM call WHERE id = :i"), {"i": call}).scalar_one()


def _mid_commit(store: Store, chapter: str):  # type: ignore[no-untyped-def]
    """A transaction holding the slice row, as a holder's commit does after its fence."""
    conn = store.engine.connect()
    tx = conn.begin()
    conn.execute(text("SELECT 1 FROM slice WHERE exam = 'ex' AND chapter_id = :c FOR UPDATE"),
                 {"c": chapter})
    return conn, tx


def test_a_holder_waiting_mid_commit_past_its_lease_is_neither_swept_nor_lost(pg_store, tmp_path):
    store = pg_store
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 5), ("b", 5)])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    waiting = store.claim("ex", "a", "wa", 1.0, 8)
    dead = store.claim("ex", "b", "wb", 1.0, 8)
    assert isinstance(waiting, Claimed) and isinstance(dead, Claimed)
    call_a = store.start_call(waiting, 1, 5, lease_s=1.0, max_tokens=100)
    call_b = store.start_call(dead, 1, 5, lease_s=1.0, max_tokens=100)
    conn, tx = _mid_commit(store, "a")
    try:
        wait_lease_expired(store, "ex", "a")
        wait_lease_expired(store, "ex", "b")
        # The heartbeat: the locked row is still its holder's; the unlocked, expired one is not.
        assert store.renew(["wa", "wb"], 1.0) == {"wa"}
        # The sweep settles the dead holder's call and leaves the waiting holder's alone.
        assert store.settle_orphans() == 1
        assert _outcome(store, call_b) == "wasted"
        assert _outcome(store, call_a) == "in_flight"
    finally:
        tx.rollback()
        conn.close()
    # Once nothing holds the row, an expired lease is an expired lease.
    assert store.renew(["wa"], 1.0) == set()
    assert store.settle_orphans() == 1
    assert _outcome(store, call_a) == "wasted"


def test_a_claim_whose_first_call_takes_long_to_plan_holds_a_whole_lease_after_it(
        store, tmp_path):
    """A worker that has just started plans its first call (prompt, tokens, the rate limiter)
    inside the claim's transaction, sometimes for seconds: the lease runs from the end of that
    transaction, not from its start. In the chaos test a lease stamped at the start expired
    before the first beat could renew it."""
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 5)])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))

    def slow_plan(view):  # type: ignore[no-untyped-def]
        time.sleep(1.5)
        return CallPlan(view.next_number, 5)

    claim = store.claim("ex", "a", "wa", 2.0, 8, plan_first=slow_plan)
    assert isinstance(claim, Claimed) and isinstance(claim.first_call, int)
    # The first beat comes an interval later: the lease, 2 s from the claim's start, would
    # have lapsed by then; 2 s from the call's record, it has not.
    time.sleep(0.7)
    assert store.renew(["wa"], 2.0) == {"wa"}
