"""A SQLite database file opened with the plain sqlite3 driver for one read snapshot, if it
has the schema revision of this code: what the fast paths of the commands that only read
(producer/read_sqlite.py: exams, status, review; producer/export_sqlite.py: export) start
from, without importing SQLAlchemy or the store (issue 28), nor each other's writers."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

VERSIONS = Path(__file__).resolve().parent.parent / "storage" / "migrations" / "versions"


def head_revision() -> str | None:
    """The newest migration's revision, from the file names ("0017_active_indexes.py"): the
    schema this code reads (storage.db.SCHEMA_REVISION, which a unit test holds equal),
    without importing storage."""
    try:
        numbers = [n[:4] for n in os.listdir(VERSIONS) if n[:4].isdigit() and n.endswith(".py")]
    except OSError:
        return None
    return max(numbers) if numbers else None


def sqlite_path(database_url: str) -> Path | None:
    """The file of a plain `sqlite:///PATH` URL (relative to the working directory, as
    SQLAlchemy reads it); None for anything else (memory, query options, other databases)."""
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if database_url.startswith(prefix):
            rest = database_url[len(prefix):]
            if not rest or "?" in rest or rest == ":memory:":
                return None
            return Path(rest)
    return None


def open_snapshot(database_url: str) -> sqlite3.Connection | None:
    """The SQLite file of `database_url` in a read transaction, if it exists and has the
    schema revision of this code; None otherwise (the caller takes the store's path)."""
    path = sqlite_path(database_url)
    if path is None or not path.is_file():
        return None
    head = head_revision()
    try:
        # mode=rw: never creates the file; journal mode untouched. One read transaction: the
        # exam check and the rows see the same snapshot, as the store's _read gives.
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True,
                               isolation_level=None, timeout=60)
    except sqlite3.Error:
        return None
    try:
        conn.execute("BEGIN")
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        revision = None
    if revision is None or head is None or str(revision[0]) != head:
        conn.close()
        return None
    return conn
