"""Group commit (storage.group) on both databases: the commits a process's threads ask for
while another commit is in progress go in one transaction, each fenced by its own lease, each
committed once or not at all, and each booked.

Each test holds the process's group busy with a blocker (a member that waits inside its
commit), queues real `commit_batch` calls from threads behind it, waits until all are queued,
then lets go: they are then one group, deterministically. SIGKILLs mid-group are in
tests/e2e/test_group_commit_kill.py."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from examforge.errors import LeaseLost
from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import wait_for, wait_lease_expired, write_syllabus
from storage import Store
from storage.group import GroupCommit
from storage.store import Claimed, Usage

pytestmark = pytest.mark.integration

CHAPTERS = [f"c{i}" for i in range(6)]


def _group(store: Store) -> GroupCommit:
    """The group a paid call's commit goes through: PostgreSQL's one-statement commits have
    their own (storage.fastpath), SQLite's general path the other."""
    return store.fast_group if store.engine.dialect.name == "postgresql" else store.group


def _setup(store: Store, tmp_path: Any) -> list[tuple[Claimed, int]]:
    path = write_syllabus(tmp_path / "exams", "ex", [(c, 5) for c in CHAPTERS])
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    held = []
    for c in CHAPTERS:
        claim = store.claim("ex", c, f"w-{c}", 30.0, 8)
        assert isinstance(claim, Claimed)
        held.append((claim, store.start_call(claim, 1, 5, lease_s=30.0)))
    return held


def _questions(chapter: str) -> list[Question]:
    return [Question(f"{chapter}: question {i}?", ("a", "b", "c", "d"), 0, "")
            for i in range(5)]


def _in_one_group(store: Store, held: list[tuple[Claimed, int]],
                  on_release: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Commit every held call from its own thread, all queued behind a blocker, so that they
    are committed as one group (of at most 32: SQLite's default is 4); each chapter's result
    or exception. `on_release` runs once they are all queued, right before the group goes."""
    group = _group(store)
    group.max_members = 32
    release, inside = threading.Event(), threading.Event()

    def blocker(_: Any) -> None:
        inside.set()
        assert release.wait(30)

    blocking = threading.Thread(target=group.run, args=(("",), blocker, {}))
    blocking.start()
    assert inside.wait(30)
    results: dict[str, Any] = {}

    def commit(claim: Claimed, call: int) -> None:
        try:
            results[claim.chapter_id] = store.commit_batch(
                claim, 30.0, call, _questions(claim.chapter_id), model="m",
                usage=Usage(10, 20, 0.001))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            results[claim.chapter_id] = exc

    threads = [threading.Thread(target=commit, args=h) for h in held]
    for t in threads:
        t.start()
    wait_for(lambda: group.queued() == len(held), 30, "every commit to queue behind the blocker")
    before = dict(group.stats)
    on_release()
    release.set()
    for t in threads + [blocking]:
        t.join(30)
    results["stats"] = {k: group.stats[k] - before.get(k, 0) for k in ("groups", "members",
                                                                      "alone_again")}
    results["largest"] = group.stats["largest"]
    return results


def _calls(store: Store) -> dict[str, tuple[str, str | None, int | None]]:
    with store.engine.connect() as conn:
        return {r.chapter_id: (r.outcome, r.reason, r.questions_stored) for r in conn.execute(
            text("SELECT chapter_id, outcome, reason, questions_stored FROM call "
                 "WHERE exam = 'ex'"))}


def _stored(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return dict(conn.execute(text(  # type: ignore[arg-type]
            "SELECT chapter_id, count(*) FROM question WHERE exam = 'ex' GROUP BY chapter_id")
        ).all())


def test_commits_that_arrive_during_a_commit_are_committed_together(store, tmp_path):
    held = _setup(store, tmp_path)
    results = _in_one_group(store, held)
    # One group of all six (the blocker was a group of its own before).
    assert results["stats"]["groups"] == 1 and results["stats"]["members"] == len(held)
    assert results["stats"]["alone_again"] == 0
    for c in CHAPTERS:
        assert results[c].stored == 5 and results[c].done, results[c]
    assert _stored(store) == {c: 5 for c in CHAPTERS}
    assert _calls(store) == {c: ("used", None, 5) for c in CHAPTERS}
    status = store.status("ex").as_dict()
    assert status["chapters"]["done"] == len(CHAPTERS)
    assert status["usage"]["calls"] == len(CHAPTERS)
    assert status["usage"]["prompt_tokens"] == 10 * len(CHAPTERS)


def test_a_member_whose_fence_fails_is_booked_alone_and_the_others_commit(store, tmp_path):
    held = _setup(store, tmp_path)
    # c0's holder froze past its lease and another worker took the slice over.
    lost, _ = held[0]
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE slice SET lease_expires_at = 0 WHERE exam = 'ex' AND "
                          "chapter_id = 'c0'"))
    wait_lease_expired(store, "ex", "c0")
    taken = store.claim("ex", "c0", "new-holder", 30.0, 8)
    assert isinstance(taken, Claimed) and taken.took_over_calls == 1
    results = _in_one_group(store, held)
    assert isinstance(results["c0"], LeaseLost)
    for c in CHAPTERS[1:]:
        assert results[c].stored == 5, results[c]
    assert _stored(store) == {c: 5 for c in CHAPTERS[1:]}
    calls = _calls(store)
    assert calls["c0"][:2] == ("wasted", "lease_lost")  # booked, with its tokens
    assert all(calls[c] == ("used", None, 5) for c in CHAPTERS[1:])
    assert store.status("ex").as_dict()["usage"]["prompt_tokens"] == 10 * len(CHAPTERS)


def test_a_group_whose_commit_fails_commits_each_member_alone_once(store, tmp_path):
    """The group's transaction fails at its end (here: the database connections are cut on
    PostgreSQL, an error at COMMIT on SQLite): nothing of it is stored, and each member is
    committed again on its own, once."""
    held = _setup(store, tmp_path)
    group = _group(store)
    fired: list[str] = []
    pg = store.engine.dialect.name == "postgresql"

    def fail_once(step: str, kinds: Any) -> None:
        if step != "group_commit_before_commit" or fired:
            return
        fired.append(step)
        if pg:  # the server drops every connection of the database but this one
            with store.engine.connect() as conn:
                conn.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                    "current_database() AND pid <> pg_backend_pid()"))
                conn.commit()
            return
        raise OperationalError("COMMIT", {}, Exception("disk I/O error"))

    group.hook = fail_once
    results = _in_one_group(store, held)
    assert fired
    assert results["stats"]["alone_again"] == len(held)
    for c in CHAPTERS:
        assert results[c].stored == 5, results[c]
    assert _stored(store) == {c: 5 for c in CHAPTERS}
    assert _calls(store) == {c: ("used", None, 5) for c in CHAPTERS}


def test_a_database_that_stays_down_books_each_member_as_failed_commit(tmp_path):
    """SQLite (PostgreSQL's connection loss is the test above; a server that stays down,
    tests/e2e/test_outages.py): the group's commit and every member's own commit fail (the
    disk is full, say): each member's caller gets the error and its call is booked
    `commit_failed`, as without grouping."""
    from storage import connect, migrate

    engine = connect(f"sqlite:///{tmp_path / 'examforge.db'}")
    migrate(engine)
    store = Store(engine)
    held = _setup(store, tmp_path)
    group = store.group
    down = threading.Event()
    down.set()

    def fail(step: str, kinds: Any) -> None:
        if step == "group_commit_before_commit" and down.is_set():
            raise OperationalError("COMMIT", {}, Exception("database or disk is full"))

    group.hook = fail
    real_alone = group._alone

    def alone(member: Any) -> None:  # every member's own commit fails too (not its booking)
        if getattr(getattr(member.work, "func", None), "__name__", "") != "_commit":
            real_alone(member)
            return

        def broken(conn: Any) -> Any:
            member_work(conn)
            raise OperationalError("COMMIT", {}, Exception("database or disk is full"))
        member_work = member.work
        member.work = broken
        real_alone(member)
        member.work = member_work

    group._alone = alone  # type: ignore[method-assign]
    results = _in_one_group(store, held)
    group._alone = real_alone  # type: ignore[method-assign]
    for c in CHAPTERS:
        assert isinstance(results[c], OperationalError), results[c]
    assert _stored(store) == {}
    # Booked, each with its tokens: the reply arrived, the database failed it.
    assert _calls(store) == {c: ("wasted", "commit_failed", 0) for c in CHAPTERS}
    engine.dispose()


def test_a_postgresql_group_yields_a_lock_to_the_other_transaction(pg_url, tmp_path):
    """PostgreSQL: a group holds several members' rows at once, so it could close a cycle
    with a statement that locks them in another order (a cancel's UPDATE of an exam's
    slices). It waits at most storage.group.LOCK_TIMEOUT_MS for a lock and then yields: the
    other transaction here holds c3's slice row for a second and is never the one to fail;
    the group gives up, and each member commits alone, c3 once the row is free."""
    from storage import connect, migrate

    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    held = _setup(store, tmp_path)
    other = engine.connect()
    tx = other.begin()
    other.execute(text("SELECT 1 FROM slice WHERE exam = 'ex' AND chapter_id = 'c3' "
                       "FOR UPDATE"))
    # The second counts from the group's start, not from before its members queue (which
    # took over a second on a loaded machine: the row was free when the group came).
    let_go = threading.Timer(1.0, lambda: (tx.commit(), other.close()))
    try:
        results = _in_one_group(store, held, on_release=let_go.start)
    finally:
        if let_go.ident is None:  # never started: the test failed before the group went
            tx.rollback()
            other.close()
        else:
            let_go.join(30)
    assert tx.is_active is False  # the other transaction committed: it was not the victim
    assert results["stats"]["alone_again"] == len(held)
    for c in CHAPTERS:
        assert results[c].stored == 5, results[c]
    assert _stored(store) == {c: 5 for c in CHAPTERS}
    assert _calls(store) == {c: ("used", None, 5) for c in CHAPTERS}
    engine.dispose()


def test_a_groups_size_is_the_databases_unless_group_commit_max_says(db_url):
    """Unset, GROUP_COMMIT_MAX is 8 on PostgreSQL (a group is one pipeline, but it holds its
    exams' question-order locks to its end) and 4 on SQLite (a group saves little beyond
    BEGIN and COMMIT, and each member waits for all of it); set, it is the same on both."""
    from examforge.settings import Settings
    from storage import connect

    engine = connect(db_url)
    try:
        store = Store(engine)
        default = 8 if engine.dialect.name == "postgresql" else 4
        assert store.group.max_members == store.fast_group.max_members == default
        settings = Settings()
        assert settings.group_commit_max is None
        store.configure_group(True, 0.002, settings.group_commit_max)
        assert store.group.max_members == store.fast_group.max_members == default
        store.configure_group(True, 0.002, Settings(group_commit_max=16).group_commit_max)
        assert store.group.max_members == store.fast_group.max_members == 16
    finally:
        engine.dispose()


def test_a_postgresql_group_is_one_round_trip_commit_included(pg_url, tmp_path, monkeypatch):
    """PostgreSQL: a group's BEGIN, statements and COMMIT go in one pipeline, one round trip.
    Each member's `ef_commit` takes its exam's question-order lock, held to the transaction's
    end: a COMMIT sent in a round trip of its own, after the results were read, held that
    lock across it and across the interpreter lock's waits, and other processes' groups
    timed out behind it (storage.base.StoreBase._auto_group)."""
    from psycopg import _cursor_base, _pipeline_base, generators

    from storage import connect, migrate

    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    held = _setup(store, tmp_path)
    counting = threading.local()
    trips: list[str] = []

    def exchange(execute: Any) -> Any:
        def counted(pgconn: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(counting, "on", False):
                trips.append("execute")
            return (yield from execute(pgconn, *args, **kwargs))
        return counted

    sync = _pipeline_base.BasePipeline._enqueue_sync

    def counted_sync(self: Any) -> None:
        if getattr(counting, "on", False):
            trips.append("sync")
        sync(self)

    monkeypatch.setattr(_cursor_base, "execute", exchange(_cursor_base.execute))
    monkeypatch.setattr(generators, "execute", exchange(generators.execute))
    monkeypatch.setattr(_pipeline_base.BasePipeline, "_enqueue_sync", counted_sync)
    real_batch = store.fast_group._batch
    assert real_batch is not None
    sizes: list[int] = []

    def batch(params: list[Any]) -> list[Any]:
        counting.on = True
        try:
            return real_batch(params)
        finally:
            counting.on = False
            sizes.append(len(params))

    store.fast_group._batch = batch
    results = _in_one_group(store, held)
    assert results["stats"] == {"groups": 1, "members": len(held), "alone_again": 0}, results
    assert sizes == [len(held)]
    assert trips == ["sync"], trips  # no COMMIT of its own after the pipeline
    assert _stored(store) == {c: 5 for c in CHAPTERS}
    assert _calls(store) == {c: ("used", None, 5) for c in CHAPTERS}
    engine.dispose()
