"""The SQLite writer's turn between processes (storage.base.FileTurn): a second process waits
for it and takes it as it is let go, a forked child is not let in by its parent's lock, and a
holder that hangs is waited for only as long as SQLite's own lock would be."""

from __future__ import annotations

import multiprocessing
import time

from helpers import wait_for

from storage import connect, migrate, open_store
from storage.base import FileTurn, file_turn

FORK = multiprocessing.get_context("fork")


def _enter_and_report(turn: FileTurn, trying, entered, left_at) -> None:  # type: ignore[no-untyped-def]
    trying.set()
    with turn:
        left_at.value = time.monotonic()
        entered.set()


def test_a_forked_process_waits_for_its_parents_turn_and_takes_it_when_let_go(tmp_path):
    turn = FileTurn(str(tmp_path / "db-writer"))
    trying, entered = FORK.Event(), FORK.Event()
    entered_at = FORK.Value("d", 0.0)
    with turn:  # opened in this process before the fork: the child must open its own
        child = FORK.Process(target=_enter_and_report, args=(turn, trying, entered, entered_at))
        child.start()
        assert trying.wait(10)
        # A negative can only be watched for a while: with the parent's descriptor shared,
        # the child would be in at once.
        assert not entered.wait(0.3)
        released_at = time.monotonic()
    assert entered.wait(10)
    child.join(10)
    assert child.exitcode == 0
    assert entered_at.value >= released_at


def test_a_holder_that_hangs_is_waited_for_only_as_long_as_sqlite_would(tmp_path, monkeypatch):
    monkeypatch.setattr(FileTurn, "GIVE_UP_S", 0.5)
    turn = FileTurn(str(tmp_path / "db-writer"))
    trying, entered = FORK.Event(), FORK.Event()
    entered_at = FORK.Value("d", 0.0)
    with turn:  # never let go while the child waits
        started = time.monotonic()
        child = FORK.Process(target=_enter_and_report, args=(turn, trying, entered, entered_at))
        child.start()
        assert entered.wait(30)  # went on without the turn; SQLite's lock decides then
        child.join(10)
        assert child.exitcode == 0  # and leaving a turn it did not get raised nothing
        assert entered_at.value - started >= 0.5


def test_a_store_on_a_sqlite_file_has_a_turn_beside_it_and_others_have_none(tmp_path, pg_url):
    engine = connect(f"sqlite:///{tmp_path / 'examforge.db'}")
    migrate(engine)
    turn = file_turn(engine)
    assert turn is not None and turn.path == str(tmp_path / "examforge.db-writer")
    with turn:
        pass
    assert (tmp_path / "examforge.db-writer").exists()
    engine.dispose()
    assert file_turn(connect("sqlite://")) is None  # in memory: one process only
    assert file_turn(connect(pg_url)) is None


def test_every_write_of_a_store_takes_the_turn(tmp_path):
    """With the turn held by another process, a store's write waits for it."""
    db = tmp_path / "examforge.db"
    store = open_store(f"sqlite:///{db}")
    other = FileTurn(str(db) + "-writer")
    trying, entered = FORK.Event(), FORK.Event()
    entered_at = FORK.Value("d", 0.0)

    def write(trying, entered, entered_at):  # type: ignore[no-untyped-def]
        store.engine.dispose(close=False)  # the parent's pooled connections stay the parent's
        trying.set()
        with store._write():
            entered_at.value = time.monotonic()
            entered.set()

    with other:
        child = FORK.Process(target=write, args=(trying, entered, entered_at))
        child.start()
        assert trying.wait(10)
        assert not entered.wait(0.3)
        released_at = time.monotonic()
    wait_for(entered.is_set, 10, "the store's write to get the turn")
    child.join(10)
    assert child.exitcode == 0 and entered_at.value >= released_at
    store.engine.dispose()


def test_a_turn_it_cannot_open_leaves_the_writers_to_sqlites_lock(tmp_path):
    turn = FileTurn(str(tmp_path / "no-such-folder" / "db-writer"))
    with turn:  # no error: the file is an optimisation, SQLite's lock is the guarantee
        pass
