"""A Celery worker SIGKILLed in the middle of a group commit (storage.group), on each
database: its members' replies had all arrived, and their statements were sent in the
group's transaction (on SQLite, run in it; on PostgreSQL, sent in its pipeline, perhaps not
yet run) but not committed. Nothing of the group is stored; each member's call is booked by the
takeover as lost in flight; the slices are generated again by another worker, and every
question is stored exactly once. The kill uses EXAMFORGE_TEST_GROUP_CRASH (the process
SIGKILLs itself at that step of a group holding two paid calls' commits or more)."""

from __future__ import annotations

import pytest

from harness import assert_stored_exactly_once, dump

PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}
# As many chapters as the doomed worker has slots, several calls each, so that every message
# is started at once. A task whose claim was queued behind the killed group never claimed:
# its message is held by the dead worker until VISIBILITY_TIMEOUT_S (as for any worker
# killed between a message's receipt and its claim, documented), 10 s here.
CHAPTERS = {f"c{i:02d}": 20 for i in range(8)}
SHORT_REDELIVERY = {"visibility_timeout_s": 10, "retry_max_s": 2, "retry_after_max_s": 2}


def _paid(mock):
    return [u for u in mock.usage() if u["paid"]]


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_worker_killed_mid_group_commit_loses_only_the_calls_in_flight(deploy, mock,
                                                                         database):
    dep = deploy(database, questions_per_call=5, budget_usd=5, lease_s=4, **PRICES,
                 **SHORT_REDELIVERY)
    dep.syllabus("gx", list(CHAPTERS.items()))
    # A group forms when replies arrive while a commit is in progress; a leader waiting up
    # to 50 ms for replies being prepared makes one of two or more near certain.
    doomed = dep.worker(8, EXAMFORGE_TEST_GROUP_CRASH="group_commit_before_commit:commit",
                        GROUP_COMMIT_WAIT_MS="50")
    enq = dep.cli("enqueue", "gx")
    assert enq.returncode == 0, enq.stdout + enq.stderr
    assert doomed.wait(timeout=90) == -9, dep.worker_logs()
    calls = dep.calls("gx")
    in_flight = {c["id"] for c in calls if c["outcome"] == "in_flight"}
    # The group's members were replied to (paid) and are all still in flight: two at least.
    assert len(in_flight) >= 2, dump(calls)
    with dep.store.engine.connect() as conn:
        from sqlalchemy import select

        from storage.base import Q
        stored_by = set(conn.execute(select(Q.c.call_id).where(Q.c.exam == "gx")).scalars())
    assert not stored_by & in_flight  # nothing of the killed group was committed
    used_before = {c["id"] for c in calls if c["outcome"] == "used"}

    dep.worker(4)
    dep.beat()
    report = dep.wait_done("gx", timeout_s=120)
    assert report["chapters"]["done"] == len(CHAPTERS), dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "gx", CHAPTERS)
    calls = dep.calls("gx")
    used = [c for c in calls if c["outcome"] == "used"]
    lost = [c for c in calls if c["outcome"] != "used"]
    # Lost: exactly the calls in flight at the kill, each booked by the takeover; what was
    # committed before the kill stays.
    assert sorted(c["id"] for c in lost) == sorted(in_flight), dump(calls)
    assert all(c["reason"] == "crash_before_commit" for c in lost), dump(lost)
    assert used_before <= {c["id"] for c in used}
    # Paid at the mock: each used call once, plus at most the calls lost in flight (those
    # already sent), and at least the group's two members, whose replies had arrived.
    extra = len(_paid(mock)) - len(used)
    assert 2 <= extra <= len(lost), dump(calls)
