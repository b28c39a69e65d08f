"""Persistence: the SQLModel tables, the engine, Alembic migrations and the chapter store.

Two paths to the database:

- The per-call path on PostgreSQL, in plain SQL (storage.fastpath). Each step of a paid call
  is one statement sent as text on psycopg's own cursor (`StoreBase._auto`: SQLAlchemy's
  execution around it cost about a tenth of the worker's CPU per call; psycopg prepares it
  on the server at its first use on a connection), in autocommit: one round trip, one
  transaction, and no lock held while the worker thinks. The claim (`ef_claim`: the lease,
  the previous holder's calls settled, what the first prompt needs, the chapter's course
  material, and the first call's record when the worker planned it before the claim from the
  slice's spec, `Leases.fresh_view`), a call's record with its budget reservation
  (`ef_start_call`), the read before the send of a call a commit recorded (`may_send`), the
  commit (`ef_commit`: the questions, their near-duplicate signatures, the call's usage and
  settlement, the steering reads and the next call's record) and the heartbeat (a
  data-modifying CTE). A chapter of N calls takes 2N round trips: the claim with its first
  call, N commits, N - 1 reads before a send. The functions are installed by migrations 0025
  and 0026. What needs Python is prepared before the commit, optimistically, and the
  function checks that it still holds; when it does not (a changed count or target, a
  duplicate, a near-duplicate index that is behind, a cancelled slice, a budget without
  room, a claim not won, a commit under VERIFY) it writes nothing more than the fence's
  lease extension and says so, and the step goes through the general path below. Why:
  building and running a dozen SQLAlchemy statements in transactions per call was a third of
  a worker's CPU and about 27-33 round trips per paid call
  (bench/results-hot-path-profile.md).
- Everything else, and all of SQLite, through SQLAlchemy Core and SQLModel: the schema, the
  migrations, planning, reports, housekeeping, and the general claim and commit
  (storage.leases, storage.ledger `Ledger._commit`), whose statements are built once
  (`StoreBase._stmt`). SQLite has no round trips to save, and the same steps as SQL text in
  its write transaction measured slower there, so it keeps this path, with one shortcut:
  the general path's per-call statements (`StoreBase._run`) are compiled once and run on
  the sqlite3 cursor inside SQLAlchemy's transaction, keeping its event listeners and its
  error handling (the damaged-database hook), because SQLAlchemy's execution of an
  already compiled statement cost about ten times what SQLite takes to run it. The
  near-duplicate check's reads, its index rows and the steering reads, which live in
  storage.neardup rather than in the store's classes, take the same shortcut
  (`storage.base.execute_hot`).

SQLite's writers take turns before `BEGIN IMMEDIATE` rather than sleep in its busy handler:
a process's threads on `storage.base.WriterLock`, processes on `storage.base.FileTurn` (an
flock on `<database>-writer`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examforge.errors import NoSchema

if TYPE_CHECKING:
    from storage.db import connect, migrate
    from storage.store import Store
else:
    def __getattr__(name: str) -> Any:
        """`Store`, `connect` and `migrate`, imported when first named (PEP 562): they bring
        SQLAlchemy, SQLModel and the tables, about 0.7 s of CPU, which the plain-driver reads
        of the commands that only read (producer/read_sqlite.py) never pay, though they use
        storage.states and storage.report_types (issue 28)."""
        import importlib

        module = {"Store": "storage.store", "connect": "storage.db",
                  "migrate": "storage.db"}.get(name)
        if module is None:
            raise AttributeError(f"module 'storage' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def open_store(database_url: str, *, pool_size: int = 10,
               background_checkpoint: bool = False) -> Store:
    """The store on `database_url`, its schema brought up to date first (the commands that
    write, the workers and the API). `background_checkpoint`: SQLite's WAL checkpoints in a
    thread, not in commits (storage.db.Checkpointer: the processes that run paid calls)."""
    from storage.db import connect, migrate
    from storage.store import Store

    engine = connect(database_url, pool_size=pool_size,
                     background_checkpoint=background_checkpoint)
    migrate(engine)
    return Store(engine)


def open_existing_store(database_url: str, *, pool_size: int = 10) -> Store:
    """The store on `database_url` for a command that only reads (status, exams, export,
    doctor, prune --dry-run): it never creates a database, a schema or a migration, so a
    read pointed at the wrong database (the shared `postgres` one, a SQLite path relative
    to another directory) changes nothing there. NoSchema (exit 2) says what is missing."""
    from storage.db import (SCHEMA_REVISION, check_reachable, connect, corruption,
                            current_revision, shown_url)
    from storage.store import Store

    engine = connect(database_url, pool_size=pool_size)
    shown = shown_url(engine.url)
    fix = "(python -m producer migrate creates it, as enqueue, run and the workers do)"
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database not in (None, "", ":memory:"):
        path = Path(database)
        if not path.parent.is_dir():
            engine.dispose()
            raise NoSchema(f"DATABASE_URL: {shown}: no such directory {path.parent.resolve()}")
        if not path.exists():
            engine.dispose()  # connecting would create the file
            raise NoSchema(
                f"DATABASE_URL: {shown}: no such database file {path.resolve()} (a relative "
                "path is read from the directory the command runs in: point DATABASE_URL at "
                "the file enqueue and the workers use; python -m producer migrate creates an "
                "empty one)")
        try:
            # Read-only first: the engine's connections switch a file to WAL, which must not
            # happen to a file that is not an examforge database at all.
            revision = _sqlite_revision(path)
        except sqlite3.DatabaseError as exc:
            engine.dispose()
            raise corruption(exc, engine.url) or exc
        if revision != SCHEMA_REVISION:
            engine.dispose()
            raise _no_schema(shown, revision, fix)
    try:
        check_reachable(engine)
        revision = current_revision(engine)
    except BaseException:
        engine.dispose()
        raise
    if revision != SCHEMA_REVISION:
        engine.dispose()
        raise _no_schema(shown, revision, fix)
    return Store(engine)


def _no_schema(shown: str, revision: str | None, fix: str) -> NoSchema:
    from storage.db import SCHEMA_REVISION

    if revision is None:
        return NoSchema(f"DATABASE_URL: {shown} has no examforge schema {fix}")
    return NoSchema(f"DATABASE_URL: {shown} has the examforge schema of revision {revision}, "
                    f"this version reads {SCHEMA_REVISION} (python -m producer migrate "
                    "upgrades an older one)")


def _sqlite_revision(path: Path) -> str | None:
    """The examforge schema revision of a SQLite file, read without writing to it (mode=ro:
    no journal mode switched, nothing created)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                        "name = 'alembic_version'").fetchone() is None:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return None if row is None else str(row[0])
    finally:
        conn.close()


__all__ = ["Store", "connect", "migrate", "open_existing_store", "open_store"]
