"""SQLite's WAL checkpoints in a thread of the process, not in its commits, for the stores
that run paid calls (storage.db.Checkpointer): a checkpoint inside a COMMIT took 13-32 ms
with its fsyncs while every other writer waited (docs/explanations/benchmarks.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import wait_for
from sqlalchemy import text

import storage.db
from storage.db import CHECKPOINT_BACKSTOP_PAGES, Checkpointer, connect

pytestmark = pytest.mark.integration

ROWS_A_TRANSACTION = 4
ROW_BYTES = 3000  # about four rows a page


def _write_pages(engine, pages: int) -> None:
    """Enough small transactions to put about `pages` pages into the WAL."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, b BLOB)"))
    for _ in range(pages // ROWS_A_TRANSACTION + 1):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t (b) VALUES (randomblob(:n))"),
                         [{"n": ROW_BYTES}] * ROWS_A_TRANSACTION)


def _wal_pages(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size // 4096 if wal.exists() else 0


def _checkpointer(path: Path) -> Checkpointer:
    return Checkpointer._running[(os.getpid(), os.path.abspath(path))]


def test_commits_leave_the_checkpoints_to_the_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(storage.db, "CHECKPOINT_EVERY_S", 3600.0)  # the thread waits
    path = tmp_path / "bg.sqlite"
    engine = connect(f"sqlite:///{path}", background_checkpoint=True)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one() == \
                CHECKPOINT_BACKSTOP_PAGES
        _write_pages(engine, 1600)
        # No commit checkpointed: SQLite's own would have begun the WAL again from its start
        # once it passed 1,000 pages, and it would be no larger than that.
        assert _wal_pages(path) > 1400, _wal_pages(path)
        assert _checkpointer(path).last is None
    finally:
        engine.dispose()  # wakes the thread: no engine left, it ends
    thread = _checkpointer_thread(path)
    if thread is not None:
        wait_for(lambda: not thread.is_alive(), 10, "the checkpoint thread to end")


def _checkpointer_thread(path: Path):
    running = Checkpointer._running.get((os.getpid(), os.path.abspath(path)))
    return None if running is None else running._thread


def test_the_thread_checkpoints_the_wal_and_ends_with_its_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(storage.db, "CHECKPOINT_EVERY_S", 0.02)
    path = tmp_path / "bg.sqlite"
    engine = connect(f"sqlite:///{path}", background_checkpoint=True)
    _write_pages(engine, 300)
    checkpointer = _checkpointer(path)

    def all_checkpointed() -> bool:
        last = checkpointer.last
        return last is not None and last[0] == 0 and last[1] > 0 and last[1] == last[2]

    wait_for(all_checkpointed, 10, "every frame of the WAL checkpointed by the thread")
    # Another engine of the process on the same file shares the thread, which runs until
    # the last of them is disposed.
    other = connect(f"sqlite:///{path}", background_checkpoint=True)
    with other.connect():
        pass
    assert _checkpointer(path) is checkpointer
    engine.dispose()
    with other.begin() as conn:
        conn.execute(text("INSERT INTO t (b) VALUES (x'00')"))
    assert checkpointer._thread.is_alive()
    other.dispose()
    wait_for(lambda: not checkpointer._thread.is_alive(), 10, "the checkpoint thread to end")


def test_an_engine_disposed_and_used_again_keeps_one_listener(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'again.sqlite'}", background_checkpoint=True)
    for _ in range(5):
        with engine.connect():
            pass
        engine.dispose()
    assert len(engine.dispatch.engine_disposed) == 1


def test_other_stores_keep_sqlites_own_checkpoints(tmp_path):
    from storage import Store

    engine = connect(f"sqlite:///{tmp_path / 'plain.sqlite'}")
    beat = Store(engine)._heartbeat_engine()
    try:
        for each in (engine, beat):
            with each.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one() == 1000
        assert (os.getpid(), os.path.abspath(tmp_path / "plain.sqlite")) not in \
            Checkpointer._running
    finally:
        engine.dispose()
        beat.dispose()


def test_a_workers_store_checkpoints_in_the_background(tmp_path, monkeypatch):
    from examforge.settings import load_settings
    from tasks.app import build_runtime

    path = tmp_path / "worker.sqlite"
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{path}")
    monkeypatch.setenv("BROKER_URL", "redis://127.0.0.1:6379/15")
    load_settings.cache_clear()
    try:
        rt = build_runtime(load_settings())
    finally:
        load_settings.cache_clear()
    try:
        with rt.store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one() == \
                CHECKPOINT_BACKSTOP_PAGES
        assert _checkpointer(path)._thread.is_alive()
    finally:
        rt.store.engine.dispose()


def test_producer_runs_store_checkpoints_in_the_background(tmp_path, monkeypatch):
    """`producer run` runs paid calls in its own process, as a worker does: its store asks
    for the thread (stopped right there: the rest of the command is the e2e tests')."""
    import producer.commands
    from examforge.settings import load_settings
    from helpers import write_syllabus

    asked: dict = {}

    class Opened(Exception):
        pass

    def open_store(url, **kwargs):  # type: ignore[no-untyped-def]
        asked.update(kwargs, url=url)
        raise Opened

    write_syllabus(tmp_path / "exams", "ex", [("a", 5)])
    monkeypatch.setenv("EXAMS_DIR", str(tmp_path / "exams"))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'run.sqlite'}")
    monkeypatch.setattr(producer.commands, "open_store", open_store)
    load_settings.cache_clear()
    try:
        with pytest.raises(Opened):
            producer.commands.run("ex", 2, None, False, False)
    finally:
        load_settings.cache_clear()
    assert asked["background_checkpoint"] is True, asked
