"""The migrated schema, replayed: how this test process brings an empty database to head.

The tests create about 600 empty databases in one run and migrate each (`storage.migrate`, the
`store` fixtures, the local runner). Alembic's steps cost 0.2 s a database on SQLite and 0.4 s
on PostgreSQL, 220 s of a 10-minute fast tier. Here the first upgrade of an empty database to
head on each dialect is Alembic's own, run once on a scratch database; what it made is dumped
(sqlite3's `iterdump`, PostgreSQL's `pg_dump --inserts`), and every later upgrade of an empty
database to head replays that dump in the caller's transaction, under the caller's locks.

The dumps are made once a test run, not once a process: the first of pytest-xdist's workers
to need one makes it, under a file lock, and writes it to a folder of the run
(EXAMFORGE_TEST_SCHEMA_DIR, made by the run's first pytest process and removed at its exit),
from which the other workers read it (each of six workers had run Alembic twice, some 0.8 s of
its CPU and 0.5 s of PostgreSQL's).

Only an upgrade of an *empty* database to *head*, and only in this process: a migration test
upgrading to a revision, a database with a table in it, and every worker and CLI process of
tests/e2e (and every CLI call of tests/e2e made in this process, Deployment.cli_in_process)
run Alembic itself. Set EXAMFORGE_TEST_ALEMBIC=1 to run Alembic everywhere. Written
here because neither Alembic nor pytest has a template for a migrated database.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

_lock = threading.Lock()
_making = threading.local()  # set while this thread runs Alembic to make a dump
_dumps: dict[str, Any] = {}  # dialect -> SQLite's statements or PostgreSQL's script
_original: Any = None


def _empty(connection: Any) -> bool:
    from sqlalchemy import inspect

    return not inspect(connection).get_table_names()


@contextlib.contextmanager
def alembic_only() -> Iterator[None]:
    """Inside: this thread's upgrades are Alembic's own."""
    before = getattr(_making, "on", False)
    _making.on = True
    try:
        yield
    finally:
        _making.on = before


def sqlite_schema(path: Path) -> list[str]:
    """What a SQLite database holds, as the statements that make it again."""
    raw = sqlite3.connect(path)
    try:
        skip = ("BEGIN TRANSACTION;", "COMMIT;", "PRAGMA ")
        return [s for s in raw.iterdump() if not s.startswith(skip)]
    finally:
        raw.close()


def _pg_dump_binary() -> str | None:
    found = shutil.which("pg_dump") or next(
        iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_dump"), reverse=True)), None)
    return str(found) if found else None


def pg_schema(url: Any) -> str:
    """What a PostgreSQL database holds (`url`, an SQLAlchemy URL), as one SQL script."""
    pg_dump = _pg_dump_binary()
    assert pg_dump, "pg_dump is not installed"
    env = {**os.environ, **({"PGPASSWORD": url.password} if url.password else {})}
    out = subprocess.run(
        [pg_dump, "--inserts", "--no-owner", "--no-privileges", "--no-comments",
         "-h", url.host or "127.0.0.1", "-p", str(url.port or 5432),
         "-U", url.username or "postgres", url.database],
        capture_output=True, text=True, check=True, env=env).stdout
    # Its SETs and set_config would change the caller's session (search_path to ''); every
    # name in the dump is schema-qualified, so they are not needed. \restrict and
    # \unrestrict are psql's commands (pg_dump since 15.14), not SQL.
    lines = [line for line in out.splitlines()
             if not line.startswith(("--", "SET ", "SELECT pg_catalog.set_config(", "\\"))]
    return "\n".join(line for line in lines if line.strip())


def _sqlite_dump() -> list[str]:
    from storage import connect, migrate

    folder = Path(tempfile.mkdtemp(prefix="ef-schema-"))
    try:
        engine = connect(f"sqlite:///{folder / 'template.db'}")
        with alembic_only():
            migrate(engine)
        engine.dispose()
        return sqlite_schema(folder / "template.db")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def scratch_pg_database(url: Any) -> Iterator[Any]:
    """A new, empty database on `url`'s server (an SQLAlchemy URL), dropped on the way out."""
    import psycopg

    admin = _libpq(url.set(database="postgres"))
    name = f"ef_schema_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name)
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _libpq(url: Any) -> dict[str, Any]:
    """psycopg's connection arguments for an SQLAlchemy URL, as SQLAlchemy's own dialect makes
    them: a multi-host URL (`?host=h1:5432&host=h2:5432`, issue 34) is not a libpq URI."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _, kwargs = PGDialect_psycopg().create_connect_args(url.set(drivername="postgresql+psycopg"))
    return {k: v for k, v in kwargs.items() if k != "context"}


def _pg_dump(url: Any) -> str:
    from storage import connect, migrate

    with scratch_pg_database(url) as target:
        engine = connect(target.render_as_string(hide_password=False))
        with alembic_only():
            migrate(engine)
        engine.dispose()
        return pg_schema(target)


SHARED_DIR = "EXAMFORGE_TEST_SCHEMA_DIR"


def _made_once_a_run(dialect: str, make: Any) -> Any:
    """`make()`, or what another process of this test run made of it (see the module's
    docstring); False (no dump: Alembic every time) is not shared."""
    folder = os.environ.get(SHARED_DIR)
    if not folder or not Path(folder).is_dir():
        return make()
    path = Path(folder) / f"{dialect}.json"
    with open(Path(folder) / f"{dialect}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if path.exists():
            return json.loads(path.read_text(encoding="utf-8"))
        made = make()
        if made is not False:
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(made), encoding="utf-8")
            partial.replace(path)
        return made


def _make_dump(dialect: str, url: Any) -> list[str] | str | bool:
    try:
        return _sqlite_dump() if dialect == "sqlite" else _pg_dump(url)
    except subprocess.CalledProcessError:  # a pg_dump older than the server: Alembic
        return False


def _upgrade(config: Any, revision: str, *args: Any, **kwargs: Any) -> Any:
    connection = config.attributes.get("connection")
    if (getattr(_making, "on", False) or revision != "head" or connection is None or args
            or kwargs or not _empty(connection)):
        return _original(config, revision, *args, **kwargs)
    dialect = connection.dialect.name
    with _lock:
        dump = _dumps.get(dialect)
    if dump is None:
        if dialect not in ("sqlite", "postgresql") or (
                dialect == "postgresql" and _pg_dump_binary() is None):
            return _original(config, revision, *args, **kwargs)  # Alembic, every time
        url = connection.engine.url
        made = _made_once_a_run(dialect, lambda: _make_dump(dialect, url))
        with _lock:
            dump = _dumps.setdefault(dialect, made)
    if dump is False:
        return _original(config, revision, *args, **kwargs)
    if dialect == "sqlite":
        for statement in dump:
            connection.exec_driver_sql(statement)
    else:  # one script, in the caller's transaction (psycopg sends it as one query)
        connection.connection.driver_connection.execute(dump)
    # What migration 0015 writes once per database: its own random id, not the template's.
    connection.exec_driver_sql(
        "UPDATE database_identity SET database_id = ?, created_at = ?" if dialect == "sqlite"
        else "UPDATE database_identity SET database_id = %s, created_at = %s",
        (uuid.uuid4().hex, time.time()))
    return None


def _pg_dump_once(url: Any) -> str | None:
    """This run's PostgreSQL dump (made once a run, as `_upgrade` makes it), or None when
    there is none (no pg_dump, or one older than the server: Alembic every time)."""
    with _lock:
        dump = _dumps.get("postgresql")
    if dump is None:
        if _pg_dump_binary() is None:
            return None
        made = _made_once_a_run("postgresql", lambda: _make_dump("postgresql", url))
        with _lock:
            dump = _dumps.setdefault("postgresql", made)
    return dump if isinstance(dump, str) else None


_TEMPLATE_FILE = "pg_template.json"


def pg_template(admin: str) -> str | None:
    """The name of this run's migrated PostgreSQL database, made once a run (by the first
    process of the run that needs it, under a file lock, as the dumps are) by replaying the
    dump into an empty database: a template that `CREATE DATABASE ... TEMPLATE` copies for
    a test that migrates its database to head before anything else touches it (the
    `migrates_at_once` fixtures of conftest.py). Nobody connects to it after it is made (a
    database being copied must have no connection). Dropped when the run's first process
    exits. None with EXAMFORGE_TEST_ALEMBIC=1, without a shared folder or without a dump:
    such a test then gets an empty database and migrates it, as before. `admin` is a
    libpq URL of the server's `postgres` database."""
    import psycopg
    from sqlalchemy.engine import make_url

    folder = os.environ.get(SHARED_DIR)
    if os.environ.get("EXAMFORGE_TEST_ALEMBIC") or not folder or not Path(folder).is_dir():
        return None
    dump = _pg_dump_once(make_url(admin.replace("postgresql://", "postgresql+psycopg://", 1)))
    if dump is None:
        return None
    path = Path(folder) / _TEMPLATE_FILE
    with open(Path(folder) / "pg_template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if path.exists():
            return str(json.loads(path.read_text(encoding="utf-8"))["name"])
        name = f"ef_template_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
            try:
                with psycopg.connect(f"{admin.rsplit('/', 1)[0]}/{name}") as filling:
                    filling.execute(dump)
            except BaseException:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                raise
        path.write_text(json.dumps({"name": name, "admin": admin}), encoding="utf-8")
        return name


def _drop_pg_template(folder: str) -> None:
    """At the exit of the run's first process: drop the run's template, if one was made."""
    path = Path(folder) / _TEMPLATE_FILE
    if not path.exists():
        return
    try:
        import psycopg

        made = json.loads(path.read_text(encoding="utf-8"))
        with psycopg.connect(made["admin"], autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{made["name"]}" WITH (FORCE)')
    except Exception:  # noqa: BLE001 (PostgreSQL went away: nothing to drop)
        pass


def install() -> None:
    """Route alembic.command.upgrade through the replay (storage.migrate looks it up at each
    call). A no-op with EXAMFORGE_TEST_ALEMBIC=1."""
    global _original
    if os.environ.get("EXAMFORGE_TEST_ALEMBIC") or _original is not None:
        return
    if not os.environ.get(SHARED_DIR):  # the run's first process: its workers inherit it
        folder = tempfile.mkdtemp(prefix="ef-schema-run-")
        os.environ[SHARED_DIR] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        atexit.register(_drop_pg_template, folder)  # first: atexit runs last in, first out
    from alembic import command

    _original = command.upgrade
    command.upgrade = _upgrade
