"""The store's guarantees, on SQLite and on the real PostgreSQL (db_url runs both)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from examforge.errors import LeaseLost
from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import Store, connect, migrate
from storage.store import Claimed, NotClaimed


@pytest.fixture
def store(db_url):
    engine = connect(db_url)
    migrate(engine)
    yield Store(engine)
    engine.dispose()


def _sync(store, tmp_path, chapters, slug="ex", **kw):
    path = write_syllabus(tmp_path / "exams", slug, chapters, **kw)
    return store.sync_exam(slug, load_syllabus(path, max_questions=1000))


def _qs(n, start=0, tag="q"):
    return [Question(f"{tag} {start + i}?", ("a", "b", "c", "d"), 0, "") for i in range(n)]


def _commit(store, claim, n, first=1, lease_s=10.0, tag="q"):
    call = store.start_call(claim, first, n)
    return call, store.commit_batch(claim, lease_s, call, first, _qs(n, first, tag), model="m",
                                    prompt_tokens=10, completion_tokens=20, cost_usd=0.001)


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
    first = store.claim("ex", "a", "frozen", 0.3, 8)
    assert isinstance(first, Claimed)
    time.sleep(0.5)  # the lease expires while "frozen" is paused
    second = store.claim("ex", "a", "new", 10.0, 8)
    assert isinstance(second, Claimed)
    call = store.start_call(first, 1, 5)
    with pytest.raises(LeaseLost):
        store.commit_batch(first, 10.0, call, 1, _qs(5), model="m", prompt_tokens=7,
                           completion_tokens=9, cost_usd=0.0)
    status = store.status("ex")
    assert status["questions"]["done"] == 0
    assert status["usage"]["calls_wasted"] == 1
    assert status["usage"]["completion_tokens"] == 9  # the wasted call is still accounted
    assert store.renew(["frozen", "new"], 10.0) == {"new"}


def test_expired_lease_cannot_be_renewed_or_committed_even_if_nobody_took_it(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "slow", 0.2, 8)
    time.sleep(0.4)
    assert store.renew(["slow"], 10.0) == set()
    with pytest.raises(LeaseLost):
        _commit(store, claim, 5)


def test_takeover_marks_in_flight_calls_of_the_dead_holder_wasted(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    dead = store.claim("ex", "a", "dead", 0.2, 8)
    store.start_call(dead, 1, 5)  # the process dies before the reply
    time.sleep(0.4)
    new = store.claim("ex", "a", "new", 10.0, 8)
    assert isinstance(new, Claimed) and new.took_over_calls == 1
    usage = store.status("ex")["usage"]
    assert usage["calls_wasted"] == 1 and usage["calls_in_flight"] == 0


def test_batches_commit_until_done_and_resume_skips_committed(store, tmp_path):
    _sync(store, tmp_path, [("a", 12)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert _commit(store, claim, 5, 1)[1].done is False
    assert _commit(store, claim, 5, 6)[1].done is False
    store.release(claim, retry_in_s=0, error="simulated crash")
    again = store.claim("ex", "a", "w2", 10.0, 8)
    assert isinstance(again, Claimed) and again.stored == 10 and len(again.known) == 10
    assert _commit(store, again, 2, 11)[1].done is True
    assert store.claim("ex", "a", "w3", 10.0, 8) == NotClaimed("done")
    assert [q["number"] for q in store.questions("ex")] == list(range(1, 13))


def test_release_with_backoff_blocks_claims_until_it_ends(store, tmp_path):
    _sync(store, tmp_path, [("a", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    store.release(claim, retry_in_s=0.5, error="transient: HTTP 429")
    blocked = store.claim("ex", "a", "w2", 10.0, 8)
    assert isinstance(blocked, NotClaimed) and blocked.reason == "backoff"
    assert 0 < blocked.retry_in_s <= 0.5
    time.sleep(0.6)
    assert isinstance(store.claim("ex", "a", "w2", 10.0, 8), Claimed)


def test_attempt_cap_fails_a_chapter_that_never_progresses(store, tmp_path):
    _sync(store, tmp_path, [("a", 5)])
    for i in range(3):
        claim = store.claim("ex", "a", f"w{i}", 10.0, 3)
        assert isinstance(claim, Claimed) and claim.attempt == i + 1
        store.release(claim, retry_in_s=0, error="boom")
    capped = store.claim("ex", "a", "w9", 10.0, 3)
    assert capped.reason == "cap"
    chapter = store.status("ex")["chapter_list"][0]
    assert chapter["state"] == "failed" and "attempt cap" in chapter["last_error"]
    assert chapter["attempts"] == 3


def test_progress_resets_the_attempt_streak(store, tmp_path):
    _sync(store, tmp_path, [("a", 20)])
    for i in range(6):
        claim = store.claim("ex", "a", f"w{i}", 10.0, 3)
        assert isinstance(claim, Claimed), claim
        _commit(store, claim, 1, i + 1)
        store.release(claim, retry_in_s=0, error="transient")
    assert store.status("ex")["chapter_list"][0]["attempts_since_progress"] == 0


def test_auth_failures_pause_the_exam(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    store.fail(claim, "auth: HTTP 401", pause_exam_after=1)
    report = store.status("ex")
    assert report["state"] == "paused" and "401" in report["pause_reason"]
    assert store.claim("ex", "b", "w", 10.0, 8).reason == "paused"
    assert store.resume("ex") == ["a", "b"]
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
    assert store.status("ex")["chapter_list"][0]["questions"]["done"] == 0


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
    assert store.status("ex")["chapters"]["total"] == 20


def test_orphans_finds_picked_chapters_without_a_live_lease_and_lost_epochs(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5), ("c", 5)])
    store.mark_enqueued("ex", ["a", "b", "c"], "epoch-1")
    assert store.orphans(grace_s=0, epoch="epoch-1") == []  # all waiting in the queue
    store.mark_picked("ex", "a")
    dead = store.claim("ex", "a", "dead", 0.2, 8)
    assert isinstance(dead, Claimed)
    assert store.orphans(grace_s=0, epoch="epoch-1") == []  # lease is live
    time.sleep(0.4)
    assert store.orphans(grace_s=0, epoch="epoch-1") == [("ex", "a")]
    # The broker lost its data: every unfinished chapter of the old epoch is an orphan.
    assert store.orphans(grace_s=0, epoch="epoch-2") == [("ex", "a"), ("ex", "b"), ("ex", "c")]
    store.mark_enqueued("ex", ["a", "b", "c"], "epoch-2")
    assert store.orphans(grace_s=0, epoch="epoch-2") == []


def test_cancel_stops_a_running_holder(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert store.cancel("ex") == 1
    assert store.renew(["w"], 10.0) == set()
    with pytest.raises(LeaseLost):
        _commit(store, claim, 5)
    assert store.status("ex")["chapters"]["cancelled"] == 1


def test_unique_question_numbers_make_a_double_commit_impossible(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 5, 1)
    with pytest.raises(LeaseLost):  # same numbers again: the UNIQUE constraint refuses
        _commit(store, claim, 5, 1, tag="other")
    assert store.status("ex")["questions"]["done"] == 5
    usage = store.status("ex")["usage"]
    assert (usage["calls_used"], usage["calls_wasted"], usage["calls_failed"]) == (1, 1, 0)


def test_schema_revision_constant_matches_alembics_head():
    from alembic.script import ScriptDirectory

    from storage.db import SCHEMA_REVISION, alembic_config

    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == SCHEMA_REVISION


def test_questions_done_counts_up_to_each_target(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    _commit(store, claim, 5)
    assert store.questions_done("ex") == 5
    _sync(store, tmp_path, [("a", 3), ("b", 5)])  # target lowered below what is stored
    assert store.questions_done("ex") == 3 == store.status("ex")["questions"]["done"]


def test_a_reader_does_not_block_a_writer_on_sqlite(sqlite_url, tmp_path):
    engine = connect(sqlite_url)
    migrate(engine)
    store = Store(engine)
    _sync(store, tmp_path, [("a", 5)])
    with store._read() as reader:
        reader.exec_driver_sql("SELECT count(*) FROM chapter").all()
        started = time.monotonic()
        assert isinstance(store.claim("ex", "a", "w", 10.0, 8), Claimed)  # not blocked
        assert time.monotonic() - started < 30  # blocked would mean the 60 s busy timeout


def test_reads_see_one_snapshot_while_a_batch_commits(store, tmp_path):
    """status() pairs each chapter's state with its question count from the same moment."""
    from storage.store import C, Q

    _sync(store, tmp_path, [("a", 10)])
    claim = store.claim("ex", "a", "w", 30.0, 8)
    _commit(store, claim, 5, 1)
    with store._read() as conn:
        stored = conn.execute(select(func.count()).select_from(Q)).scalar_one()
        _commit(store, claim, 5, 6)  # the last batch lands between the two statements
        state = conn.execute(select(C.c.state)).scalar_one()
    assert (stored, state) == (5, "running")
    assert store.status("ex")["chapter_list"][0]["state"] == "done"


@pytest.mark.parametrize("via", ["claim", "reconciler"])
def test_failing_at_the_cap_explains_the_dead_holders_call(store, tmp_path, via):
    _sync(store, tmp_path, [("a", 5)])
    dead = store.claim("ex", "a", "dead", 0.2, 1)
    store.start_call(dead, 1, 5)  # the process dies mid-call, at its last allowed attempt
    time.sleep(0.4)
    if via == "claim":
        assert store.claim("ex", "a", "next", 10.0, 1).reason == "cap"
    else:
        assert store.fail_capped(1) == 1
    report = store.status("ex")
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
        if statement.startswith("INSERT INTO question") and failures:
            failures.pop()
            raise OperationalError(statement, {}, Exception("server closed the connection"))

    with pytest.raises(OperationalError):
        _commit(store, claim, 5)
    event.remove(store.engine, "before_cursor_execute", fail_once)
    usage = store.status("ex")["usage"]
    assert (usage["calls_wasted"], usage["calls_in_flight"]) == (1, 0)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (10, 20)
    assert store.status("ex")["questions"]["done"] == 0


def test_an_0001_database_with_calls_upgrades_to_head_keeping_its_rows(db_url):
    from alembic import command
    from sqlalchemy import text

    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0001")
        conn.execute(text(
            "INSERT INTO call (exam, chapter_id, attempt, first_number, requested, worker, "
            "outcome, prompt_tokens, completion_tokens, cost_usd, questions_stored, started_at) "
            "VALUES ('ex', 'a', 1, 1, 5, 'w', 'used', 10, 20, 0.5, 5, 1.0)"))
    migrate(engine)  # what every command does on start
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0002"
        rows = conn.execute(text("SELECT prompt_tokens, cost_usd, endpoint FROM call")).all()
    assert [tuple(r) for r in rows] == [(10, 0.5, None)]
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
