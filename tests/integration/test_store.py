"""The store's guarantees, on SQLite and on the real PostgreSQL (db_url runs both)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from examforge.errors import LeaseLost, PauseCode, SliceReason
from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import wait_backoff_over, wait_lease_expired, write_syllabus
from storage import Store, connect, migrate
from storage.db import SCHEMA_REVISION
from storage.models import CallOutcome
from storage.base import S
from storage.store import Claimed, NoRoom, NotClaimed, Orphan, RequeueReason, Usage


def _sync(store, tmp_path, chapters, slug="ex", **kw):
    path = write_syllabus(tmp_path / "exams", slug, chapters, **kw)
    return store.sync_exam(slug, load_syllabus(path, max_questions=1000))


def _qs(n, start=0, tag="q"):
    return [Question(f"{tag} {start + i}?", ("a", "b", "c", "d"), 0, "") for i in range(n)]


def _commit(store, claim, n, first=1, lease_s=10.0, tag="q"):
    call = store.start_call(claim, first, n, lease_s=lease_s)
    return call, store.commit_batch(claim, lease_s, call, _qs(n, first, tag), model="m",
                                    usage=Usage(10, 20, 0.001))


def test_migrate_is_idempotent(db_url):
    engine = connect(db_url)
    migrate(engine)
    migrate(engine)  # second run is a no-op, not an error


def test_only_one_of_many_concurrent_claims_wins(store, tmp_path):
    _sync(store, tmp_path, [("a", 5)])
    results: list[object] = []
    barrier = threading.Barrier(16)

    def claim(i: int) -> None:
        barrier.wait()
        results.append(store.claim("ex", "a", f"w{i}", 10.0, 8))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if isinstance(r, Claimed)]
    assert len(won) == 1
    busy = [r for r in results if isinstance(r, NotClaimed)]
    assert {r.reason for r in busy} == {"busy"}
    assert all(0 < r.retry_in_s <= 10.0 for r in busy)


def test_commit_is_fenced_by_the_lease(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    # Leases long enough to be live at the next line on a loaded machine (CI saw 0.3 s lapse).
    first = store.claim("ex", "a", "frozen", 1.5, 8)
    assert isinstance(first, Claimed)
    call = store.start_call(first, 1, 5, lease_s=1.5)
    wait_lease_expired(store, "ex", "a")  # while "frozen" is paused mid-call
    second = store.claim("ex", "a", "new", 10.0, 8)
    assert isinstance(second, Claimed) and second.took_over_calls == 1
    with pytest.raises(LeaseLost):
        store.commit_batch(first, 10.0, call, _qs(5), model="m", usage=Usage(7, 9, 0.0))
    status = store.status("ex").as_dict()
    assert status["questions"]["done"] == 0
    assert status["usage"]["calls_wasted"] == 1
    # The wasted call is still accounted, with the real usage the late holder brought back.
    assert status["usage"]["completion_tokens"] == 9 and status["usage"]["calls_estimated"] == 0
    assert store.renew(["frozen", "new"], 10.0) == {"new"}


def test_a_holder_frozen_past_its_lease_between_calls_cannot_start_another(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    frozen = store.claim("ex", "a", "frozen", 0.2, 8)
    assert isinstance(frozen, Claimed)
    wait_lease_expired(store, "ex", "a")  # frozen between two calls (say, on the limiter)
    with pytest.raises(LeaseLost):
        store.start_call(frozen, 1, 5, lease_s=0.2)
    assert store.status("ex").as_dict()["usage"]["calls"] == 0  # nothing recorded, nothing sent


def test_expired_lease_cannot_be_renewed_or_committed_even_if_nobody_took_it(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "slow", 0.2, 8)
    wait_lease_expired(store, "ex", "a")
    assert store.renew(["slow"], 10.0) == set()
    with pytest.raises(LeaseLost):
        _commit(store, claim, 5)


def test_takeover_marks_in_flight_calls_of_the_dead_holder_wasted(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    dead = store.claim("ex", "a", "dead", 1.5, 8)  # live at the next line, even when loaded
    store.start_call(dead, 1, 5, lease_s=1.5)  # the process dies before the reply
    wait_lease_expired(store, "ex", "a")
    new = store.claim("ex", "a", "new", 10.0, 8)
    assert isinstance(new, Claimed) and new.took_over_calls == 1
    usage = store.status("ex").as_dict()["usage"]
    assert usage["calls_wasted"] == 1 and usage["calls_in_flight"] == 0


def test_batches_commit_until_done_and_resume_skips_committed(store, tmp_path):
    _sync(store, tmp_path, [("a", 12)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert _commit(store, claim, 5, 1)[1].done is False
    assert _commit(store, claim, 5, 6)[1].done is False
    store.release(claim, retry_in_s=0, code=SliceReason.unexpected, detail="simulated crash")
    again = store.claim("ex", "a", "w2", 10.0, 8)
    assert isinstance(again, Claimed) and again.stored == 10 and len(again.known) == 10
    assert _commit(store, again, 2, 11)[1].done is True
    assert store.claim("ex", "a", "w3", 10.0, 8) == NotClaimed("done")
    assert [q["number"] for q in store.questions("ex")] == list(range(1, 13))


def test_release_with_backoff_blocks_claims_until_it_ends(store, tmp_path):
    _sync(store, tmp_path, [("a", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    store.release(claim, retry_in_s=0.5, code=SliceReason.transient, detail="HTTP 429")
    blocked = store.claim("ex", "a", "w2", 10.0, 8)
    assert isinstance(blocked, NotClaimed) and blocked.reason == "backoff"
    assert 0 < blocked.retry_in_s <= 0.5
    wait_backoff_over(store, "ex", "a")
    assert isinstance(store.claim("ex", "a", "w2", 10.0, 8), Claimed)


def test_attempt_cap_fails_a_chapter_that_never_progresses(store, tmp_path):
    _sync(store, tmp_path, [("a", 5)])
    for i in range(3):
        claim = store.claim("ex", "a", f"w{i}", 10.0, 3)
        assert isinstance(claim, Claimed) and claim.attempt == i + 1
        store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="boom")
    capped = store.claim("ex", "a", "w9", 10.0, 3)
    assert capped.reason == "cap"
    chapter = store.status("ex").as_dict()["chapter_list"][0]
    assert chapter["state"] == "failed"
    assert chapter["last_error_code"] == SliceReason.attempt_cap
    # People read the code's label and the detail, which names the last attempt's error.
    assert chapter["last_error"] == ("attempt cap: 3 attempts without progress; "
                                     "last error: transient: boom")
    assert chapter["attempts"] == 3


def test_progress_resets_the_attempt_streak(store, tmp_path):
    _sync(store, tmp_path, [("a", 20)])
    for i in range(6):
        claim = store.claim("ex", "a", f"w{i}", 10.0, 3)
        assert isinstance(claim, Claimed), claim
        _commit(store, claim, 1, i + 1)
        store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="x")
        chapter = store.status("ex").as_dict()["chapter_list"][0]
        assert (chapter["last_error_code"], chapter["last_error"]) == ("transient", "transient: x")
    claim = store.claim("ex", "a", "w9", 10.0, 3)
    _commit(store, claim, 1, 7)  # progress clears the last error, code and detail
    chapter = store.status("ex").as_dict()["chapter_list"][0]
    assert chapter["attempts_since_progress"] == 0
    assert chapter["last_error_code"] is None and chapter["last_error"] is None


def test_auth_failures_pause_the_exam(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    store.fail(claim, SliceReason.auth, "HTTP 401", pause_exam_after=1)
    report = store.status("ex").as_dict()
    assert report["state"] == "paused" and report["pause_code"] == PauseCode.auth
    assert report["pause_reason"] == "auth: HTTP 401"
    assert report["chapter_list"][0]["last_error_code"] == SliceReason.auth
    assert store.claim("ex", "b", "w", 10.0, 8).reason == "paused"
    assert store.resume("ex") == [("a", 0), ("b", 0)]
    assert isinstance(store.claim("ex", "b", "w", 10.0, 8), Claimed)


def test_sync_exam_plans_changed_raised_and_regenerated_chapters(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 5)
    plan = _sync(store, tmp_path, [("a", 5), ("b", 5)])
    assert plan.to_enqueue == ["b"] and plan.skipped == {"a": "done"}
    plan = _sync(store, tmp_path, [("a", 8), ("b", 5)])  # more questions asked
    assert plan.to_enqueue == ["a", "b"]
    # A changed title with stored questions is reported, not mixed.
    changed = {"title": "T", "chapters": [{"id": "a", "title": "New title", "questions": 8},
                                          {"id": "b", "title": "Chapter b", "questions": 5}]}
    plan = _sync(store, tmp_path, changed)
    assert "a" in plan.skipped and "--regenerate a" in plan.skipped["a"]
    path = write_syllabus(tmp_path / "exams", "ex", changed)
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=100), regenerate=["a"])
    assert "a" in plan.to_enqueue
    assert store.status("ex").as_dict()["chapter_list"][0]["questions"]["done"] == 0


def test_concurrent_sync_exam_is_safe(store, tmp_path):
    path = write_syllabus(tmp_path / "exams", "ex", [(f"c{i}", 5) for i in range(20)])
    syllabus = load_syllabus(path, max_questions=100)
    errors: list[BaseException] = []

    def sync() -> None:
        try:
            store.sync_exam("ex", syllabus)
        except BaseException as exc:  # pragma: no cover - the assertion reports it
            errors.append(exc)

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.status("ex").as_dict()["chapters"]["total"] == 20


def test_orphans_finds_picked_chapters_without_a_live_lease_and_lost_epochs(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5), ("c", 5)])
    store.mark_enqueued("ex", [("a", 0), ("b", 0), ("c", 0)], "epoch-1")
    assert store.orphans(grace_s=0, epoch="epoch-1") == []  # all waiting in the queue
    store.mark_picked("ex", "a")
    dead = store.claim("ex", "a", "dead", 1.5, 8)  # long enough to be live at the next line on a loaded machine
    assert isinstance(dead, Claimed)
    assert store.orphans(grace_s=0, epoch="epoch-1") == []  # lease is live
    wait_lease_expired(store, "ex", "a")
    assert store.orphans(grace_s=0, epoch="epoch-1") == [
        Orphan("ex", "a", RequeueReason.worker_vanished)]
    # The broker lost its data: every unfinished chapter of the old epoch is an orphan.
    assert store.orphans(grace_s=0, epoch="epoch-2") == [
        Orphan("ex", "a", RequeueReason.worker_vanished),
        Orphan("ex", "b", RequeueReason.broker_epoch_changed),
        Orphan("ex", "c", RequeueReason.broker_epoch_changed)]
    store.mark_enqueued("ex", [("a", 0), ("b", 0), ("c", 0)], "epoch-2")
    assert store.orphans(grace_s=0, epoch="epoch-2") == []


def test_one_enqueue_is_one_moment_so_a_lagging_replica_loses_its_last_published(
        store, tmp_path):
    """A lagging replica lacks the newest pushes: the last published of an enqueue. Every
    slice of one enqueue carries the same time, however long the statement runs, so the loss
    is found in position order (the database clock moves between the rows of a statement:
    clock_timestamp() on PostgreSQL, 'now' per step on SQLite)."""
    chapters = [f"c{i:02}" for i in range(40)]
    _sync(store, tmp_path, [(c, 5) for c in chapters])
    store.mark_enqueued("ex", [(c, 0) for c in chapters], "epoch-1")
    with store.engine.connect() as conn:
        stamps = conn.execute(select(func.count(func.distinct(S.c.enqueued_at)))
                              .where(S.c.exam == "ex")).scalar_one()
    assert stamps == 1
    audit = store.lost_messages(min_age_s=0, queued=30, unacked=[])
    assert (audit.waiting, audit.queued) == (40, 30)
    assert [c for _, c, _ in audit.lost] == chapters[:29:-1]  # c39 down to c30


def test_cancel_keeps_the_reply_of_the_call_in_flight_and_sends_nothing_more(store, tmp_path):
    """The call in flight at a cancel is paid for whatever we do: its reply is stored, no
    next call is planned or allowed, and the holder gives the lease up."""
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=10.0)  # in flight
    assert store.cancel("ex") == 1
    assert store.renew(["w"], 10.0) == {"w"}  # the holder keeps it while the call runs
    committed = store.commit_batch(claim, 10.0, call, _qs(5, 1), model="m",
                                   usage=Usage(10, 20, 0.001), plan_next=lambda view: None)
    assert committed.cancelled and committed.stored == 5 and committed.next_call is None
    with store.engine.connect() as conn:
        outcome = conn.execute(text_("SELECT outcome FROM call WHERE id = :i"),
                               {"i": call}).scalar_one()
        lease = conn.execute(text_("SELECT state, lease_owner FROM slice")).one()
    assert outcome == "used" and tuple(lease) == ("cancelled", None)
    assert store.renew(["w"], 10.0) == set()
    with pytest.raises(LeaseLost):
        store.start_call(claim, 6, 5, lease_s=10.0)
    report = store.status("ex").as_dict()
    assert report["chapters"]["cancelled"] == 1 and report["questions"]["done"] == 5
    taken = store.claim("ex", "a", "w2", 10.0, 8)
    assert isinstance(taken, NotClaimed) and taken.reason.value == "cancelled"


def test_a_cancel_whose_call_in_flight_completes_the_slice_leaves_it_done(store, tmp_path):
    _sync(store, tmp_path, [("a", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=10.0)
    assert store.cancel("ex") == 1
    committed = store.commit_batch(claim, 10.0, call, _qs(5, 1), model="m",
                                   usage=Usage(10, 20, 0.001))
    assert committed.done and not committed.cancelled
    assert store.status("ex").as_dict()["chapters"]["done"] == 1


def test_cancel_clears_a_lease_that_has_lapsed(store, tmp_path):
    """A holder that died: nothing of its is in flight any more, the slice is let go."""
    _sync(store, tmp_path, [("a", 10)])
    store.claim("ex", "a", "dead", 1.0, 8)
    wait_lease_expired(store, "ex", "a")
    assert store.cancel("ex") == 1
    with store.engine.connect() as conn:
        assert tuple(conn.execute(text_("SELECT state, lease_owner FROM slice")).one()) == (
            "cancelled", None)


@pytest.mark.slow
def test_a_call_in_flight_on_a_cancelled_slice_whose_holder_died_is_settled(store, tmp_path):
    """The holder kept its lease through the cancel to commit the reply of its call, then
    died: the reconciler's pass books that call as a crash (worst case, reservation
    settled) and lets the slice go, instead of leaving it in flight and reserved forever."""
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 5.0)
    claim = store.claim("ex", "a", "dead", 1.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=1.0, reserve_usd=0.25)
    assert store.cancel("ex") == 1
    assert store.settle_cancelled() == 0  # its lease is live: it may still commit
    wait_lease_expired(store, "ex", "a")
    assert store.settle_cancelled() == 1
    assert store.settle_cancelled() == 0  # once
    with store.engine.connect() as conn:
        row = conn.execute(text_("SELECT outcome, reason, cost_usd FROM call WHERE id = :i"),
                           {"i": call}).one()
        slice_ = conn.execute(text_("SELECT state, lease_owner FROM slice")).one()
        exam = conn.execute(text_("SELECT spent_usd, reserved_usd FROM exam")).one()
    assert tuple(row) == ("wasted", "crash_before_commit", 0.25)
    assert tuple(slice_) == ("cancelled", None)
    assert tuple(exam) == (0.25, 0.0)


def test_unique_question_numbers_make_a_double_commit_impossible(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 5, 1)
    # The commit numbers a batch on from what the slice holds, so a second batch takes 6-10;
    # and whatever a bug did above it, the database refuses a number twice.
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(text_(
            "INSERT INTO question (exam, chapter_id, number, question, choices, answer_index, "
            "explanation, model, created_at) VALUES ('ex', 'a', 3, 'x?', '[]', 0, '', 'm', 0)"))
    _, committed = _commit(store, claim, 5, 6, tag="other")
    assert committed.stored == 10 and committed.done
    assert [q["number"] for q in store.questions("ex")] == list(range(1, 11))


def test_a_question_the_chapter_has_is_never_stored_twice(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 5, 1)
    # The same five questions again (reworded only in case and spacing: the same question):
    # dropped, nothing stored, the call booked as wasted for invalid output.
    call = store.start_call(claim, 6, 5, lease_s=10.0)
    again = [Question(q.question.upper() + "  ", q.choices, q.answer_index, q.explanation)
             for q in _qs(5, 1)]
    committed = store.commit_batch(claim, 10.0, call, again, model="m", usage=Usage(1, 2, 0.0))
    assert (committed.stored, committed.duplicates, committed.kept) == (5, 5, ())
    # Two new and three old: the two are kept, numbered 6 and 7.
    call = store.start_call(claim, 6, 5, lease_s=10.0)
    mixed = _qs(2, 6, "new") + again[:3]
    committed = store.commit_batch(claim, 10.0, call, mixed, model="m", usage=Usage(1, 2, 0.0))
    assert (committed.stored, committed.duplicates, len(committed.kept)) == (7, 3, 2)
    assert [q["number"] for q in store.questions("ex")] == list(range(1, 8))
    with store.engine.connect() as conn:
        reasons = conn.execute(text_("SELECT outcome, reason, questions_stored FROM call "
                                     "ORDER BY id")).all()
    assert [tuple(r) for r in reasons] == [("used", None, 5), ("wasted", "invalid_output", 0),
                                          ("used", None, 2)]




def test_questions_done_counts_up_to_each_target(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 5)
    assert store.questions_done("ex") == 5
    _sync(store, tmp_path, [("a", 3), ("b", 5)])  # target lowered below what is stored
    assert store.questions_done("ex") == 3 == store.status("ex").as_dict()["questions"]["done"]




def test_reads_see_one_snapshot_while_a_batch_commits(store, tmp_path):
    """status() pairs each chapter's state with its question count from the same moment."""
    from storage.store import S, Q

    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 30.0, 8)
    _commit(store, claim, 5, 1)
    with store._read() as conn:
        stored = conn.execute(select(func.count()).select_from(Q)).scalar_one()
        _commit(store, claim, 5, 6)  # the last batch lands between the two statements
        state = conn.execute(select(S.c.state)).scalar_one()
    assert (stored, state) == (5, "running")
    assert store.status("ex").as_dict()["chapter_list"][0]["state"] == "done"


@pytest.mark.parametrize("via", ["claim", "reconciler"])
def test_failing_at_the_cap_explains_the_dead_holders_call(store, tmp_path, via):
    _sync(store, tmp_path, [("a", 5)])
    dead = store.claim("ex", "a", "dead", 1.5, 1)  # live at the next line, even when loaded
    store.start_call(dead, 1, 5, lease_s=1.5)  # dies mid-call, at its last allowed attempt
    wait_lease_expired(store, "ex", "a")
    if via == "claim":
        assert store.claim("ex", "a", "next", 10.0, 1).reason == "cap"
    else:
        assert store.fail_capped(1) == 1
    report = store.status("ex").as_dict()
    assert report["chapters"]["failed"] == 1
    assert (report["usage"]["calls_in_flight"], report["usage"]["calls_wasted"]) == (0, 1)


def test_a_database_error_at_commit_still_accounts_the_call_with_its_tokens(store, tmp_path):
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    failures = [1]

    @event.listens_for(store.engine, "before_cursor_execute")
    def fail_once(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        # The general path's insert, or the one-round-trip commit's function (PostgreSQL).
        if statement.startswith(("INSERT INTO question", "SELECT * FROM ef_commit")) \
                and failures:
            failures.pop()
            raise OperationalError(statement, {}, Exception("server closed the connection"))

    with pytest.raises(OperationalError):
        _commit(store, claim, 5)
    event.remove(store.engine, "before_cursor_execute", fail_once)
    usage = store.status("ex").as_dict()["usage"]
    assert (usage["calls_wasted"], usage["calls_in_flight"]) == (1, 0)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (10, 20)
    assert store.status("ex").as_dict()["questions"]["done"] == 0


def test_an_0001_database_with_calls_upgrades_to_head_keeping_its_rows(db_url):
    from alembic import command
    from sqlalchemy import text

    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0001")
        conn.execute(text(
            "INSERT INTO exam (slug, title, state, auth_failures, created_at, updated_at) "
            "VALUES ('ex', 'Ex', 'active', 0, 1.0, 1.0)"))
        conn.execute(text(
            "INSERT INTO call (exam, chapter_id, attempt, first_number, requested, worker, "
            "outcome, prompt_tokens, completion_tokens, cost_usd, questions_stored, started_at) "
            "VALUES ('ex', 'a', 1, 1, 5, 'w', 'used', 10, 20, 0.5, 5, 1.0), "
            "('ex', 'a', 2, 6, 5, 'w', 'wasted', 10, 20, 0.25, 0, 2.0)"))
    migrate(engine)  # what every command does on start
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() \
            == SCHEMA_REVISION
        rows = conn.execute(text("SELECT prompt_tokens, cost_usd, endpoint, reserved_usd, "
                                 "usage_estimated FROM call ORDER BY id")).all()
        exam = conn.execute(text("SELECT spent_usd, reserved_usd, budget_usd FROM exam")).one()
    assert [tuple(r) for r in rows] == [(10, 0.5, None, 0.0, False), (10, 0.25, None, 0.0, False)]
    # The exam's running total starts as the sum of what its ledger already booked.
    assert tuple(exam) == (0.75, 0.0, None)
    engine.dispose()


def test_the_migrations_build_exactly_the_models_schema(db_url):
    # A model changed without a migration (or the reverse) shows up here, on both databases.
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    import storage.models  # noqa: F401  (registers the tables)

    engine = connect(db_url)
    migrate(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    engine.dispose()
    assert diff == []


# --- budgets ---------------------------------------------------------------------------------

def _totals_match_the_ledger(store, slug="ex"):
    with store.engine.connect() as conn:
        spent, reserved = conn.execute(text_(
            "SELECT spent_usd, reserved_usd FROM exam WHERE slug = :s"), {"s": slug}).one()
        ledger = conn.execute(text_(
            "SELECT COALESCE(SUM(cost_usd), 0), COALESCE(SUM(CASE WHEN outcome = 'in_flight' "
            "THEN reserved_usd ELSE 0 END), 0) FROM call WHERE exam = :s"), {"s": slug}).one()
    assert spent == pytest.approx(ledger[0]) and reserved == pytest.approx(ledger[1])
    return spent, reserved


def text_(sql):
    from sqlalchemy import text

    return text(sql)


def test_concurrent_reservations_never_pass_the_budget(store, tmp_path):
    """Sixteen threads race to reserve $0.30 calls against a $2.00 budget: six fit, never
    seven, whatever the interleaving (the check and the reservation are one UPDATE)."""
    chapters = [(f"c{i}", 5) for i in range(16)]
    _sync(store, tmp_path, chapters)
    store.set_budget("ex", 2.0)
    claims = [store.claim("ex", c, f"w{c}", 30.0, 8) for c, _ in chapters]
    barrier = threading.Barrier(len(claims))
    results: list[object] = []
    lock = threading.Lock()

    def reserve(claim):
        barrier.wait()
        got = store.start_call(claim, 1, 5, lease_s=30, reserve_usd=0.30, max_tokens=1000)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=reserve, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    booked = [r for r in results if isinstance(r, int)]
    assert len(booked) == 6
    spent, reserved = _totals_match_the_ledger(store)
    assert spent == 0 and reserved == pytest.approx(1.80) and spent + reserved <= 2.0


def test_a_settled_call_frees_what_it_did_not_spend(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 1.0)
    claim = store.claim("ex", "a", "w", 30.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=30, reserve_usd=0.9)
    assert isinstance(store.start_call(claim, 6, 5, lease_s=30, reserve_usd=0.2), NoRoom)
    store.commit_batch(claim, 30.0, call, _qs(5), model="m", usage=Usage(10, 20, 0.1))
    assert _totals_match_the_ledger(store) == (pytest.approx(0.1), 0)
    failed = store.start_call(claim, 6, 5, lease_s=30, reserve_usd=0.5)
    assert isinstance(failed, int)
    store.finish_call(failed, CallOutcome.failed, "HTTP 503")  # a refused call costs nothing
    assert _totals_match_the_ledger(store) == (pytest.approx(0.1), 0)


@pytest.mark.slow
def test_a_crashed_calls_reservation_is_settled_at_its_worst_case_by_the_takeover(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 5.0)
    dead = store.claim("ex", "a", "dead", 1.5, 8)  # live at the next line, even when loaded
    store.start_call(dead, 1, 5, lease_s=1.5, prompt_tokens=300, max_tokens=2100,
                     reserve_usd=0.75)
    assert _totals_match_the_ledger(store) == (0, pytest.approx(0.75))
    wait_lease_expired(store, "ex", "a")
    heir = store.claim("ex", "a", "heir", 30.0, 8)
    assert isinstance(heir, Claimed) and heir.took_over_calls == 1
    spent, reserved = _totals_match_the_ledger(store)
    assert spent == pytest.approx(0.75) and reserved == 0  # the provider may bill all of it
    with store.engine.connect() as conn:
        row = conn.execute(text_("SELECT prompt_tokens, completion_tokens, usage_estimated, "
                                 "outcome FROM call")).one()
    assert tuple(row) == (300, 2100, True, "wasted")
    # The late holder's commit stores nothing, but it brings the call's real usage back:
    # that replaces the worst case (once: a second report changes nothing).
    for _ in range(2):
        with pytest.raises(LeaseLost):
            store.commit_batch(dead, 30.0, 1, _qs(5), model="m", usage=Usage(300, 400, 0.2))
        assert _totals_match_the_ledger(store) == (pytest.approx(0.2), 0)
    report = store.status("ex").as_dict()
    assert report["questions"]["done"] == 0 and report["usage"]["calls_wasted"] == 1
    assert report["usage"]["calls_estimated"] == 0


def test_a_raised_budget_resumes_an_exam_its_budget_paused(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    store.set_budget("ex", 1.0)
    assert store.pause_exam("ex", "budget: $1.0000 spent", PauseCode.budget)
    store.set_budget("ex", 0.5)  # still no room beyond what is spent? nothing spent: resumes
    assert store.status("ex").as_dict()["state"] == "active"
    assert store.pause_exam("ex", "quota: HTTP 429", PauseCode.provider)
    store.set_budget("ex", 10.0)  # another reason: a budget does not lift it
    assert store.status("ex").as_dict()["state"] == "paused"
    assert store.status("ex").pause_code == PauseCode.provider
    # The code decides, not the text: a pause worded like a budget's stays paused too.
    store.resume("ex")
    assert store.pause_exam("ex", "budget: said a person", PauseCode.manual)
    store.set_budget("ex", 20.0)
    assert store.status("ex").as_dict()["state"] == "paused"



def test_0005_turns_the_ledgers_reasons_into_a_closed_list_keeping_the_text(db_url):
    from alembic import command
    from sqlalchemy import text

    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
        conn.execute(text(
            "INSERT INTO call (exam, chapter_id, attempt, first_number, requested, worker, "
            "outcome, reason, prompt_tokens, completion_tokens, cost_usd, questions_stored, "
            "started_at, reserved_usd, usage_estimated, price_known) VALUES "
            "('ex', 'a', 1, 1, 5, 'w', 'wasted', 'crash_before_commit: holder lost its lease', "
            " 0, 0, 0, 0, 1.0, 0, false, true),"
            "('ex', 'a', 1, 1, 5, 'w', 'failed', 'HTTP 503: overloaded', 0, 0, 0, 0, 1.0, 0, "
            " false, true),"
            "('ex', 'a', 1, 1, 5, 'w', 'failed', 'something else entirely', 0, 0, 0, 0, 1.0, 0, "
            " false, true),"
            "('ex', 'a', 1, 1, 5, 'w', 'used', '1 duplicate rejected', 0, 0, 0, 4, 1.0, 0, "
            " false, true)"))
    migrate(engine)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT outcome, reason, detail FROM call ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [
        ("wasted", "crash_before_commit", "crash_before_commit: holder lost its lease"),
        ("failed", "server_error", "HTTP 503: overloaded"),
        ("failed", "legacy", "something else entirely"),
        ("used", None, "1 duplicate rejected")]
    engine.dispose()


def test_0006_turns_chapters_into_slices_keeping_what_is_stored(db_url, monkeypatch):
    from alembic import command
    from sqlalchemy import text

    from storage.db import alembic_config

    monkeypatch.delenv("SLICE_QUESTIONS", raising=False)  # the default, 50
    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0005")
        conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                          "reserved_usd, created_at, updated_at) VALUES "
                          "('ex', 'Ex', 'active', 0, 0, 0, 1, 1)"))
        # A 120-question chapter 70 questions into its single lease, with a worker's call for
        # 61-70 in flight; a 10-question chapter done; a cancelled 200-question one.
        for cid, position, target, state, owner in [
                ("big", 0, 120, "running", "w/1"), ("small", 1, 10, "done", None),
                ("gone", 2, 200, "cancelled", None)]:
            conn.execute(text(
                "INSERT INTO chapter (exam, chapter_id, position, title, spec_hash, target, "
                "state, attempts, attempts_since_progress, lease_owner, lease_expires_at, "
                "enqueued_at, enqueue_epoch, requeues, updated_at) VALUES "
                "('ex', :c, :p, :title, 'h', :t, :s, 3, 1, :o, 5, 2, 'e1', 0, 1)"),
                {"c": cid, "title": cid, "p": position, "t": target, "s": state, "o": owner})
        rows = [("big", n, f"Big question {n}?") for n in range(1, 61)]
        rows += [("small", n, f"Small question {n}?") for n in range(1, 11)]
        rows.append(("small", 11, "small QUESTION 3?"))  # a legacy repeat, kept as it is
        for cid, n, q in rows:
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, model, created_at) VALUES "
                "('ex', :c, :n, :q, '[]', 0, '', 'm', 1)"), {"c": cid, "n": n, "q": q})
        conn.execute(text(
            "INSERT INTO call (exam, chapter_id, attempt, first_number, requested, worker, "
            "outcome, prompt_tokens, completion_tokens, cost_usd, questions_stored, "
            "started_at, reserved_usd, usage_estimated, price_known) VALUES "
            "('ex', 'big', 3, 61, 10, 'w/1', 'in_flight', 0, 0, 0, 0, 1.0, 0, false, true)"))
    migrate(engine)
    store = Store(engine)
    with engine.connect() as conn:
        slices = conn.execute(text(
            "SELECT chapter_id, slice_no, first_number, target, state, lease_owner, attempts "
            "FROM slice ORDER BY position, slice_no")).all()
        call_slice = conn.execute(text("SELECT slice_no FROM call")).scalar_one()
        hashed = conn.execute(text("SELECT count(*) FROM question WHERE norm_hash IS NOT NULL"
                                   )).scalar_one()
    assert [tuple(r) for r in slices] == [
        # slice 0 keeps the chapter's row (its attempts); its range is full: done
        ("big", 0, 1, 50, "done", None, 3), ("big", 1, 51, 50, "pending", None, 0),
        ("big", 2, 101, 20, "pending", None, 0),
        ("small", 0, 1, 10, "done", None, 3),
        ("gone", 0, 1, 50, "cancelled", None, 3), ("gone", 1, 51, 50, "cancelled", None, 0),
        ("gone", 2, 101, 50, "cancelled", None, 0), ("gone", 3, 151, 50, "cancelled", None, 0)]
    assert call_slice == 1  # 61 is in 51-100
    assert hashed == 70  # every question but the legacy repeat
    report = store.status("ex")
    big, small, gone = report.chapter_list
    assert (big.state, big.questions.done, big.questions.target) == ("pending", 60, 120)
    assert [(s.first, s.last, s.stored) for s in big.slices] == [(1, 50, 50), (51, 100, 10),
                                                                 (101, 120, 0)]
    assert (small.state, small.questions.done, gone.state) == ("done", 10, "cancelled")
    # The in-flight call belongs to slice 1: its takeover books it, not slice 0's or 2's.
    claim = store.claim("ex", "big", "new", 10.0, 8, slice_no=2)
    assert isinstance(claim, Claimed) and claim.took_over_calls == 0
    assert (claim.first_number, claim.target, claim.stored, claim.chapter_target) == \
        (101, 20, 0, 120)
    claim = store.claim("ex", "big", "new", 10.0, 8, slice_no=1)
    assert isinstance(claim, Claimed) and claim.took_over_calls == 1 and claim.stored == 10
    # The new rule holds from now on: the chapter's questions are unique by text.
    call = store.start_call(claim, 61, 2, lease_s=10.0)
    committed = store.commit_batch(
        claim, 10.0, call, [Question("big question 7?", ("a", "b", "c", "d"), 0, ""),
                            Question("Big question 61?", ("a", "b", "c", "d"), 0, "")],
        model="m", usage=Usage(1, 1, 0.0))
    assert (committed.stored, committed.duplicates) == (11, 1)
    assert [q["number"] for q in store.questions("ex") if q["chapter_id"] == "big"] == \
        list(range(1, 62))
    engine.dispose()


def test_slices_keep_disjoint_ranges_through_lowered_raised_and_regenerated_targets(
        store, tmp_path):
    def ranges():
        report = store.status("ex")
        return [(s.first, s.last, s.state) for s in report.chapter_list[0].slices]

    path = write_syllabus(tmp_path / "exams", "ex", [("a", 120)])
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=1000), slice_questions=50)
    assert plan.slices == [("a", 0), ("a", 1), ("a", 2)]
    assert ranges() == [(1, 50, "pending"), (51, 100, "pending"), (101, 120, "pending")]
    claim = store.claim("ex", "a", "w", 10.0, 8, slice_no=1)
    assert isinstance(claim, Claimed) and (claim.first_number, claim.target) == (51, 50)
    call = store.start_call(claim, 51, 10, lease_s=10.0)
    store.commit_batch(claim, 10.0, call, _qs(10, 51), model="m", usage=Usage(1, 1, 0.0))
    store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="test")
    # Lowered to 60: the second slice ends at 60 and is done (51-60 stored), the third
    # covers nothing (and is not shown); the first keeps its range.
    _sync(store, tmp_path, [("a", 60)])
    assert ranges() == [(1, 50, "pending"), (51, 60, "done")]
    # Raised to 130: new slices for 61..130, after the last number any slice covers.
    plan = _sync(store, tmp_path, [("a", 130)])
    assert ranges() == [(1, 50, "pending"), (51, 60, "done"), (61, 110, "pending"),
                        (111, 130, "pending")]
    assert plan.slices == [("a", 0), ("a", 3), ("a", 4)]
    # Regenerated: every question and slice of the chapter goes; it is cut afresh.
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=1000), regenerate=["a"],
                           slice_questions=50)
    assert ranges() == [(1, 50, "pending"), (51, 100, "pending"), (101, 130, "pending")]
    assert store.questions("ex") == [] and plan.slices == [("a", 0), ("a", 1), ("a", 2)]


def test_a_new_run_right_after_a_cancel_lets_the_holder_in_its_call_go_on(store, tmp_path):
    """A cancel, then at once a new run (the API's resume), while a holder is still in its
    call: the slice is running again under that holder, whose commit stores the batch and
    carries on; nobody else can take the slice meanwhile."""
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    call = store.start_call(claim, 1, 5, lease_s=10.0)
    assert store.cancel("ex") == 1
    store.prepare_run("ex")
    assert not isinstance(store.claim("ex", "a", "w2", 10.0, 8), Claimed)
    committed = store.commit_batch(claim, 10.0, call, _qs(5, 1), model="m",
                                   usage=Usage(10, 20, 0.001))
    assert not committed.cancelled and committed.stored == 5
    _commit(store, claim, 5, 6, tag="more")
    assert store.status("ex").as_dict()["chapters"]["done"] == 1


def test_restart_cancelled_puts_cancelled_slices_back_and_names_their_chapters(store, tmp_path):
    # What `producer enqueue` and `producer run` do first, so they undo `producer cancel`;
    # a slice whose holder is still in a call goes on running, the others are pending again.
    _sync(store, tmp_path, [("a", 5), ("b", 5), ("c", 5)])
    claim = store.claim("ex", "b", "w", 10.0, 8)
    store.start_call(claim, 1, 5, lease_s=10.0)
    assert store.cancel("ex", ["a", "b"]) == 2
    assert store.restart_cancelled("ex") == ["a", "b"]
    assert {c.id: c.state for c in store.status("ex").chapter_list} == {
        "a": "pending", "b": "running", "c": "pending"}
    assert store.restart_cancelled("ex") == []
