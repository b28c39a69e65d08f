"""No reservation outlives its call, and the budget holds (issue 16, items 2, 3, 4 and 10), on
SQLite and on the real PostgreSQL (db_url runs both).

A "dead call" here is what a SIGKILLed worker leaves: a call recorded in flight, with its
worst case reserved against the budget, whose holder's lease then lapsed. The end-to-end
version, with a real worker killed mid-call, is tests/e2e/test_dead_calls.py."""

from __future__ import annotations

from examforge.errors import PauseCode, SliceReason
import pytest
from sqlalchemy import text

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import wait_lease_expired, write_syllabus
from storage.store import CallPlan, Claimed, NoRoom, SendCheck, Usage

RESERVE = 0.25  # a dead call's worst case, in USD


def _sync(store, tmp_path, chapters, slug="ex", regenerate=()):
    path = write_syllabus(tmp_path / "exams", slug, chapters)
    return store.sync_exam(slug, load_syllabus(path, max_questions=1000), regenerate)


def _qs(n, start=0, tag="q"):
    return [Question(f"{tag} {start + i}?", ("a", "b", "c", "d"), 0, "") for i in range(n)]


def _one(store, sql, **params):
    with store.engine.connect() as conn:
        return conn.execute(text(sql), params).one()


def _exam(store, slug="ex"):
    return _one(store, "SELECT state, pause_reason, pause_code, spent_usd, reserved_usd, budget_usd "
                       "FROM exam WHERE slug = :s", s=slug)


def _in_flight(store, slug="ex"):
    return _one(store, "SELECT COUNT(*) FROM call WHERE exam = :s AND outcome = 'in_flight'",
                s=slug)[0]


def _dead_call(store, chapter="a", first=1, reserve=RESERVE, wait=True):
    """A holder records a call and dies: its lease lapses with the call in flight."""
    claim = store.claim("ex", chapter, f"dead-{chapter}", 1.0, 8)
    assert isinstance(claim, Claimed)
    call = store.start_call(claim, first, 5, lease_s=1.0, prompt_tokens=100, max_tokens=900,
                            reserve_usd=reserve)
    assert isinstance(call, int)
    if wait:
        wait_lease_expired(store, "ex", chapter)
    return call


def _assert_settled_at_worst_case(store, call, reserve=RESERVE):
    row = _one(store, "SELECT outcome, reason, cost_usd, completion_tokens, usage_estimated "
                      "FROM call WHERE id = :i", i=call)
    assert (row.outcome, row.reason, row.completion_tokens, bool(row.usage_estimated)) == (
        "wasted", "crash_before_commit", 900, True)
    assert row.cost_usd == pytest.approx(reserve)


def _still_in_flight(store):
    with store.engine.connect() as conn:
        return set(conn.execute(text(
            "SELECT chapter_id FROM call WHERE outcome = 'in_flight'")).scalars())


def test_dead_holders_calls_are_settled_by_the_users_actions_in_their_transaction(
        store, tmp_path):
    """Dead calls: the user acts before anyone claims the slices again: cancels a, imports b
    (which makes its slice done), lowers c's target (done: the dead call was for numbers
    6-10) and regenerates d. Each settles its chapter's dead call itself; afterwards nothing
    is in flight, nothing is reserved, and each call is booked at its worst case (what it
    reserved: no less than the provider can have billed for it)."""
    chapters = ["a", "b", "c", "d"]
    _sync(store, tmp_path, [(c, 10) for c in chapters])
    store.set_budget("ex", 5.0)
    live = store.claim("ex", "c", "live", 10.0, 8)
    call = store.start_call(live, 1, 5, lease_s=10.0)
    store.commit_batch(live, 10.0, call, _qs(5), model="m", usage=Usage(10, 20, 0.01))
    store.release(live, retry_in_s=0, code=SliceReason.handed_back, detail="test")
    dead = {c: _dead_call(store, c, first=6 if c == "c" else 1, wait=False) for c in chapters}
    for c in chapters:
        wait_lease_expired(store, "ex", c)
    assert store.cancel("ex", ["a"]) == 1
    assert _still_in_flight(store) == {"b", "c", "d"}
    result = store.import_questions("ex", {"b": _qs(10, 100, "imported")}, "checkpoint.json")
    assert result.imported == 10
    assert _still_in_flight(store) == {"c", "d"}
    plan = _sync(store, tmp_path, [("a", 10), ("b", 10), ("c", 5), ("d", 10)],
                 regenerate=["d"])
    assert plan.to_enqueue == ["d"] and plan.skipped["c"] == "done"
    exam = _exam(store)
    assert exam.reserved_usd == 0 and _in_flight(store) == 0
    assert exam.spent_usd == pytest.approx(0.01 + 4 * RESERVE)
    for call in dead.values():
        _assert_settled_at_worst_case(store, call)


def test_the_apis_cancel_settles_dead_holders_calls_in_its_transaction(store, tmp_path):
    """POST /runs/ID/cancel is a cancel too: a dead holder's call is settled by it, not left
    reserved until the reconciler's next pass; a live holder's call is left to its reply."""
    _sync(store, tmp_path, [("a", 10), ("b", 10)])
    store.set_budget("ex", 5.0)
    run, made = store.create_run("ex", "key-1", "fingerprint", None)
    assert made
    dead = _dead_call(store, "a")
    live = store.claim("ex", "b", "live", 10.0, 8)
    store.start_call(live, 1, 5, lease_s=10.0, reserve_usd=RESERVE)
    store.cancel_run(run)
    _assert_settled_at_worst_case(store, dead)
    assert _still_in_flight(store) == {"b"}
    assert _exam(store).reserved_usd == pytest.approx(RESERVE)  # the live call's only


def test_a_call_under_a_live_lease_is_left_to_its_holder(store, tmp_path):
    """Cancel keeps a live holder's call in flight: its reply settles it, at its real cost."""
    _sync(store, tmp_path, [("a", 10), ("b", 10)])
    store.set_budget("ex", 5.0)
    dead = _dead_call(store, "b")
    claim = store.claim("ex", "a", "live", 10.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=10.0, reserve_usd=RESERVE)
    assert store.cancel("ex") == 2
    _assert_settled_at_worst_case(store, dead)
    assert _in_flight(store) == 1 and _exam(store).reserved_usd == pytest.approx(RESERVE)
    committed = store.commit_batch(claim, 10.0, call, _qs(5), model="m",
                                   usage=Usage(10, 20, 0.01))
    assert committed.cancelled and _in_flight(store) == 0
    assert _exam(store).reserved_usd == pytest.approx(0)
    assert _exam(store).spent_usd == pytest.approx(RESERVE + 0.01)


def test_the_budget_recount_keeps_no_dead_holders_reservation(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 5.0)
    dead = _dead_call(store)
    store.set_budget("ex", 6.0)
    exam = _exam(store)
    assert exam.reserved_usd == 0 and exam.spent_usd == pytest.approx(RESERVE)
    _assert_settled_at_worst_case(store, dead)


def test_the_reconciler_settles_dead_calls_whatever_their_slices_state(store, tmp_path):
    """Each slice moved on without settling its dead holder's call (as every path but the
    claim did before): done, cancelled, failed, or pending with nobody claiming it. The
    reconciler's pass settles them all; a live holder's call is left to it."""
    states = {"a": "done", "b": "cancelled", "c": "failed", "d": "pending"}
    _sync(store, tmp_path, [(c, 10) for c in [*states, "e"]])
    store.set_budget("ex", 5.0)
    dead = {c: _dead_call(store, c, wait=False) for c in states}
    for c in states:
        wait_lease_expired(store, "ex", c)
    with store.engine.begin() as conn:
        for chapter, state in states.items():
            conn.execute(text("UPDATE slice SET state = :st, lease_owner = NULL, "
                              "lease_expires_at = NULL WHERE chapter_id = :c"),
                         {"st": state, "c": chapter})
    live = store.claim("ex", "e", "live", 10.0, 8)
    store.start_call(live, 1, 5, lease_s=10.0, reserve_usd=0.5)
    assert store.settle_orphans() == 4
    assert store.settle_orphans() == 0  # once
    for call in dead.values():
        _assert_settled_at_worst_case(store, call)
    assert _still_in_flight(store) == {"e"}
    assert _exam(store).reserved_usd == pytest.approx(0.5)
    assert _exam(store).spent_usd == pytest.approx(4 * RESERVE)


def test_a_settle_that_reaches_the_budget_pauses_the_exam_and_reserves_nothing_more(
        store, tmp_path):
    """Budget: a reply that reports twice its reservation pauses the exam in the transaction
    that books it; the next call planned in that transaction, and any other, finds no room."""
    _sync(store, tmp_path, [("a", 20), ("b", 20)])
    store.set_budget("ex", 0.5)
    claim = store.claim("ex", "a", "w", 10.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=10.0, reserve_usd=0.3)
    committed = store.commit_batch(
        claim, 10.0, call, _qs(5), model="m", usage=Usage(10, 20, 0.6),
        plan_next=lambda view: CallPlan(view.next_number, 5, reserve_usd=0.01))
    assert isinstance(committed.next_call, NoRoom)
    assert committed.next_call.in_flight == 0  # nothing to wait for
    exam = _exam(store)
    assert exam.state == "paused" and exam.pause_code == PauseCode.budget
    assert exam.spent_usd == pytest.approx(0.6) and exam.reserved_usd == 0
    other = store.claim("ex", "b", "w2", 10.0, 8)
    assert other.reason == "paused"  # type: ignore[union-attr]
    # A raised budget resumes it.
    store.set_budget("ex", 1.0)
    assert _exam(store).state == "active"


def test_no_room_counts_only_calls_under_a_live_lease(store, tmp_path):
    """The budget-wait loop: a dead holder's reservation made "others are in flight" true
    for ever. Now the store settles it when it finds no room, and says what is really in
    flight: nothing, so the worker pauses the exam instead of waiting."""
    _sync(store, tmp_path, [("a", 10), ("b", 10), ("c", 10)])
    store.set_budget("ex", 1.0)
    _dead_call(store, "a", reserve=0.9)
    claim = store.claim("ex", "b", "w", 10.0, 8)
    room = store.start_call(claim, 1, 5, lease_s=10.0, reserve_usd=0.2)
    assert isinstance(room, NoRoom) and room.in_flight == 0
    assert room.reserved_usd == 0 and room.spent_usd == pytest.approx(0.9)
    # Room freed by the dead call's settle is used at once.
    assert isinstance(store.start_call(claim, 1, 1, lease_s=10.0, reserve_usd=0.05), int)
    other = store.claim("ex", "c", "w2", 10.0, 8)
    room = store.start_call(other, 1, 5, lease_s=10.0, reserve_usd=0.2)
    assert isinstance(room, NoRoom) and room.in_flight == 1  # b's call, under a live lease


def test_the_reconciler_pauses_an_exam_whose_budget_has_no_room_and_nothing_in_flight(
        store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 5.0)
    _dead_call(store)
    store.set_budget("ex", 0.2)  # below what it spent: the recount books the dead call
    assert _exam(store).state == "active"
    assert store.pause_spent() == ["ex"]
    exam = _exam(store)
    assert exam.state == "paused" and exam.pause_code == PauseCode.budget
    assert store.pause_spent() == []


def test_the_reconciler_leaves_an_exam_with_a_live_call_or_no_work(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 0.2)
    claim = store.claim("ex", "a", "w", 10.0, 8)
    store.start_call(claim, 1, 5, lease_s=10.0, reserve_usd=0.2)  # fills the budget
    assert store.pause_spent() == []  # its reply may settle below the reservation
    _sync(store, tmp_path, [("b", 10)], slug="other")
    store.set_budget("other", 0.0001)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE slice SET state = 'done' WHERE exam = 'other'"))
        conn.execute(text("UPDATE exam SET spent_usd = 1 WHERE slug = 'other'"))
    assert store.pause_spent() == []  # finished: nothing to pause


# --- cancel means no new call ----------------------------------------------------------------

def test_a_cancel_after_the_commit_recorded_the_next_call_stops_its_send(store, tmp_path):
    """The commit records the slice's next call; a cancel commits right after it. The check
    right before the send finds the slice cancelled: the call is booked as never sent ($0,
    its reservation released) and the lease the holder kept for it is let go."""
    _sync(store, tmp_path, [("a", 20)])
    store.set_budget("ex", 5.0)
    claim = store.claim("ex", "a", "w", 10.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=10.0, reserve_usd=0.1)
    assert store.may_send(claim, call) is SendCheck.send
    committed = store.commit_batch(
        claim, 10.0, call, _qs(5), model="m", usage=Usage(10, 20, 0.01),
        plan_next=lambda view: CallPlan(view.next_number, 5, reserve_usd=0.1))
    following = committed.next_call
    assert isinstance(following, int) and _exam(store).reserved_usd == pytest.approx(0.1)
    assert store.cancel("ex") == 1
    assert store.may_send(claim, following) is SendCheck.cancelled
    row = _one(store, "SELECT outcome, reason, cost_usd, detail FROM call WHERE id = :i",
               i=following)
    assert (row.outcome, row.reason, row.cost_usd) == ("failed", "lease_lost", 0.0)
    assert "not sent: the slice was cancelled" in row.detail
    assert tuple(_one(store, "SELECT state, lease_owner FROM slice")) == ("cancelled", None)
    exam = _exam(store)
    assert exam.reserved_usd == pytest.approx(0) and exam.spent_usd == pytest.approx(0.01)


def test_a_call_whose_lease_lapsed_before_its_send_is_not_sent(store, tmp_path):
    _sync(store, tmp_path, [("a", 20)])
    # A lease of 3 s: on a loaded machine a second can pass between the claim and the call's
    # record, and the record itself refuses a lapsed lease (another test's subject).
    claim = store.claim("ex", "a", "frozen", 3.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=3.0)
    wait_lease_expired(store, "ex", "a")
    assert store.may_send(claim, call) is SendCheck.lost
    assert _in_flight(store) == 0


def test_cancel_tells_which_cancelled_chapters_still_have_a_call_in_flight(store, tmp_path):
    """`cancel` says how many chapters it cancelled that a live call may still finish: a
    live holder's call is kept; a dead holder's is settled by the cancel and not counted."""
    _sync(store, tmp_path, [("a", 20), ("b", 20), ("c", 20)])
    live = store.claim("ex", "a", "live", 30.0, 8)
    store.start_call(live, 1, 5, lease_s=30.0)
    dead = store.claim("ex", "b", "dead", 1.0, 8)
    store.start_call(dead, 1, 5, lease_s=1.0)
    wait_lease_expired(store, "ex", "b")
    assert store.cancel("ex") == 3
    assert store.cancelled_in_flight("ex") == 1
    assert store.cancelled_in_flight("ex", ["b", "c"]) == 0
    assert store.cancelled_in_flight("ex", ["a"]) == 1
