"""storage.group's leader and followers on a SQLite file: who leads, who waits, and for how
long a leader waits for commits being prepared (never when none is). The store's members and
their crashes are tests/integration/test_group_commit_store.py and tests/e2e/test_group_commit_kill.py."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

from sqlalchemy import create_engine, text

from helpers import wait_for
from storage.group import GroupCommit


def _group(tmp_path: Any, **kw: Any) -> tuple[GroupCommit, Any]:
    engine = create_engine(f"sqlite:///{tmp_path / 'g.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (k TEXT PRIMARY KEY)"))
    begins: list[int] = []

    @contextlib.contextmanager
    def begin() -> Iterator[Any]:
        begins.append(1)
        with engine.begin() as conn:
            yield conn

    group = GroupCommit(begin, "sqlite", **kw)
    group.begins = begins  # type: ignore[attr-defined]
    return group, engine


def _insert(k: str) -> Any:
    def work(conn: Any) -> str:
        conn.execute(text("INSERT INTO t VALUES (:k)"), {"k": k})
        return k
    return work


def test_a_commit_alone_runs_at_once_in_its_own_thread(tmp_path):
    group, engine = _group(tmp_path, wait_s=5.0)
    ran_in: list[str] = []

    def work(conn: Any) -> int:
        ran_in.append(threading.current_thread().name)
        return 1

    started = time.monotonic()
    assert group.run(("a",), work) == 1
    # Nobody is preparing a commit: the 5 s wait is not taken.
    assert time.monotonic() - started < 2.5
    assert ran_in == [threading.current_thread().name]
    assert group.stats == {"groups": 1, "members": 1, "largest": 1, "alone_again": 0}


def test_a_leader_waits_for_a_commit_being_prepared_and_takes_it_in(tmp_path):
    group, engine = _group(tmp_path, wait_s=30.0)
    preparing, go = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def late() -> None:
        with group.coming():
            preparing.set()
            assert go.wait(30)
            results["late"] = group.run(("b",), _insert("b"))

    t = threading.Thread(target=late)
    t.start()
    assert preparing.wait(30)
    leader = threading.Thread(target=lambda: results.update(first=group.run(("a",),
                                                                             _insert("a"))))
    leader.start()
    time.sleep(0.2)  # the leader is waiting for the one being prepared, not committing
    assert "first" not in results
    go.set()
    leader.join(30)
    t.join(30)
    assert results == {"first": "a", "late": "b"}
    assert group.stats["groups"] == 1 and group.stats["largest"] == 2


def test_a_preparer_that_gives_up_releases_the_waiting_leader(tmp_path):
    group, engine = _group(tmp_path, wait_s=30.0)
    preparing, go = threading.Event(), threading.Event()

    def gives_up() -> None:
        with group.coming():
            preparing.set()
            assert go.wait(30)  # then returns without a commit (its slice was cancelled)

    t = threading.Thread(target=gives_up)
    t.start()
    assert preparing.wait(30)
    done = threading.Event()
    leader = threading.Thread(target=lambda: (group.run(("a",), _insert("a")), done.set()))
    leader.start()
    go.set()
    assert done.wait(10)  # not the 30 s wait
    t.join(30)
    leader.join(30)


def test_members_queued_during_a_commit_are_one_group_with_savepoints(tmp_path):
    group, engine = _group(tmp_path)
    release, inside = threading.Event(), threading.Event()

    def blocker(conn: Any) -> None:
        inside.set()
        assert release.wait(30)

    threading.Thread(target=group.run, args=(("",), blocker)).start()
    assert inside.wait(30)
    results: dict[str, Any] = {}

    def member(k: str) -> None:
        work = _insert(k)
        if k == "c":
            def work(conn: Any) -> str:  # writes, then fails: rolled back alone
                conn.execute(text("INSERT INTO t VALUES ('c')"))
                raise ValueError("c failed")
        try:
            results[k] = group.run((k,), work)
        except ValueError as exc:
            results[k] = str(exc)

    threads = [threading.Thread(target=member, args=(k,)) for k in "dcba"]
    for t in threads:
        t.start()
    wait_for(lambda: group.queued() == 4, 30, "four members queued")
    begins = len(group.begins)  # type: ignore[attr-defined]
    release.set()
    for t in threads:
        t.join(30)
    assert results == {"a": "a", "b": "b", "c": "c failed", "d": "d"}
    assert len(group.begins) - begins == 1  # type: ignore[attr-defined]  # one transaction
    with engine.connect() as conn:
        assert sorted(conn.execute(text("SELECT k FROM t")).scalars()) == ["a", "b", "d"]


def test_off_each_commit_is_its_own_transaction(tmp_path):
    group, engine = _group(tmp_path, enabled=False)
    for k in "abc":
        assert group.run((k,), _insert(k)) == k
    assert len(group.begins) == 3  # type: ignore[attr-defined]
    assert group.stats["groups"] == 0


def test_a_leader_that_dies_hands_the_lead_on(tmp_path):
    """A SystemExit (a worker's shutdown) out of a group: its member gets it, its leader's
    thread raises it, and the members queued behind get a leader: nobody waits for one
    gone."""
    group, engine = _group(tmp_path, max_members=1)
    release, inside = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def blocker(conn: Any) -> str:
        inside.set()
        assert release.wait(30)
        return "a"

    def member(k: str) -> None:
        def dies(conn: Any) -> str:
            raise SystemExit(1)
        try:
            got[k] = group.run((k,), dies if k == "b" else _insert(k))
        except SystemExit:
            got[k] = "SystemExit"

    threads = [threading.Thread(target=lambda: got.__setitem__("a", group.run(("a",),
                                                                              blocker)))]
    threads[0].start()
    assert inside.wait(30)
    for i, k in enumerate("bcd"):
        threads.append(threading.Thread(target=member, args=(k,)))
        threads[-1].start()
        wait_for(lambda: group.queued() == i + 1, 30, f"{k} queued")
    release.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a member waits for a leader gone"
    assert got == {"a": "a", "b": "SystemExit", "c": "c", "d": "d"}
    with engine.connect() as conn:
        assert sorted(conn.execute(text("SELECT k FROM t")).scalars()) == ["c", "d"]
