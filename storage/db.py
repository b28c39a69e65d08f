"""Engines for SQLite and PostgreSQL, the database clock, and schema migration via Alembic."""

from __future__ import annotations

import functools
import logging
import os
import re
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import event, inspect, literal_column, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import create_engine

from examforge.errors import ConfigError, DatabaseCorrupt, DatabaseUnavailable
from examforge.settings import check_database_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# The newest migration. Checked against Alembic's own head by a test, so it cannot drift; it
# saves importing Alembic (a tenth of a short command's CPU) when the schema is current.
SCHEMA_REVISION = "0034"
READ_ONLY = "examforge_read_only"
# Any fixed number: serialises concurrent `upgrade` runs on PostgreSQL.
_MIGRATION_LOCK_ID = 0x65786166


log = logging.getLogger(__name__)

# How long a SQLite writer waits for the database's write lock before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 60


def connect(url: str, *, pool_size: int = 10, background_checkpoint: bool = False) -> Engine:
    """An engine for `url`. SQLite gets WAL, a busy timeout and `BEGIN IMMEDIATE` transactions;
    with `background_checkpoint`, its WAL checkpoints in a thread of this process rather than
    in its commits (`Checkpointer`: the workers' and `producer run`'s stores)."""
    try:
        url = check_database_url(url)
        parsed = make_url(url)
    except ValueError as exc:
        raise ConfigError(f"DATABASE_URL: {exc}") from None
    except ArgumentError:
        raise ConfigError(f"DATABASE_URL: not a database URL: {url!r}") from None
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
            pool_size=pool_size)
        _make_sqlite_transactions_immediate(engine, background_checkpoint)
    else:
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_timeout=60,
            # The connection checked in last goes out first: the busy ones stay warm (no
            # ping, _ping_when_idle) and the surplus of a quiet spell is what sits idle.
            pool_use_lifo=True,
            connect_args={"connect_timeout": 5} if parsed.get_backend_name() == "postgresql"
            else {},
        )
        _ping_when_idle(engine)
    _refuse_damage(engine)
    return engine


# A pooled connection unused for longer than this is pinged before it is handed out.
PING_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's pre-ping, only for a connection that sat in the pool PING_IDLE_S or more
    (its documented pessimistic recipe: a `checkout` listener that raises
    DisconnectionError, and the pool retries with a new connection). `pool_pre_ping` pinged
    at every checkout: a round trip more for each step of a paid call, whose steps are one
    round trip each on PostgreSQL (storage.fastpath). A connection back in the pool for less
    than a second was working a second ago; one idle longer (a database restarted, a
    connection cut by a firewall) is checked as before."""

    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _fresh(_dbapi_conn, record):  # type: ignore[no-untyped-def]
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, _proxy):  # type: ignore[no-untyped-def]
        since = record.info.get("idle_since")
        if since is not None and time.monotonic() - since < PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(str(exc)) from exc
        if not alive:
            raise DisconnectionError("the connection did not answer a ping")


def _refuse_damage(engine: Engine) -> None:
    """Every statement, on every engine, turns a damaged database into DatabaseCorrupt (one
    line, exit 4) at the one place SQLAlchemy hands out its errors (its documented
    `handle_error` hook): the commands, the API and the workers then need no list of the
    statements that may read a damaged page, and no caller can mistake it for an outage."""

    @event.listens_for(engine, "handle_error")
    def _on_error(context):  # type: ignore[no-untyped-def]
        return corruption(context.original_exception, engine.url)


def _make_sqlite_transactions_immediate(engine: Engine, background_checkpoint: bool = False
                                        ) -> None:
    # pysqlite's default deferred transactions let two writers both read, then one fails with
    # "database is locked" on upgrade to a write lock. BEGIN IMMEDIATE takes the write lock up
    # front, so claims and commits serialise cleanly (SQLAlchemy's documented recipe).
    database = engine.url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        background_checkpoint = False
    path = os.path.abspath(database)
    if background_checkpoint:
        _IN_BACKGROUND.add(engine)
        # A disposed engine no longer keeps the thread running (one listener an engine).
        event.listen(engine, "engine_disposed", functools.partial(Checkpointer._disposed, path))
    ref = weakref.ref(engine)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys=ON")
        if background_checkpoint:
            cur.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_BACKSTOP_PAGES}")
            engine_now = ref()
            if engine_now is not None:
                Checkpointer.ensure(path, engine_now)
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        # Reads (Store._read) stay deferred: in WAL mode they never block the writers.
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


# SQLite's WAL checkpoints, off the commit path, for the processes that run paid calls (the
# workers, `producer run`): SQLite's own checkpoint runs inside the COMMIT that takes the WAL
# past `wal_autocheckpoint` (1,000 pages), and with its fsyncs that commit took up to 5-9 ms
# (p99 4.4-5.3 ms, median 76 µs, measured on a worker's claims and commits), holding the
# write lock and every other writer of every process behind it. There a thread of the
# process runs a PASSIVE checkpoint every CHECKPOINT_EVERY_S on a connection of its own: it
# waits for nobody, takes no write lock, and SQLite lets writers commit while it copies and
# fsyncs. The connections of such a process (the store's and the lease heartbeat's) keep an
# automatic checkpoint as a backstop at CHECKPOINT_BACKSTOP_PAGES. Under steady writes the
# backstop is what starts the WAL again from its beginning (a writer does that only when
# every frame was copied, and a passive checkpoint that runs beside writers rarely ends so),
# and its checkpoint then has little left to copy; it also bounds the WAL should the thread
# fall behind (a process frozen mid-checkpoint holds the checkpoint lock, and the others'
# passive checkpoints skip until it lets go). Written by hand: SQLite and sqlite3 have no
# background checkpointer, and SQLAlchemy none either.
CHECKPOINT_EVERY_S = 0.2
CHECKPOINT_BACKSTOP_PAGES = 4_000


# The engines made with background_checkpoint (storage.leases' heartbeat engine asks).
_IN_BACKGROUND: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def checkpoints_in_background(engine: Engine) -> bool:
    """Whether `engine` was made with `background_checkpoint` (and is SQLite)."""
    return engine in _IN_BACKGROUND


def _checkpointer_lock_after_fork() -> None:
    Checkpointer._lock = threading.Lock()  # a fork's child may have copied it held


class Checkpointer:
    """The background checkpoints of one SQLite file in this process: a daemon thread,
    started by the first connection of an engine that asks for it (and again in a forked
    child: threads do not survive a fork), running while any engine that asked for it is
    alive and not disposed, and while the file exists."""

    _lock = threading.Lock()
    _running: dict[tuple[int, str], "Checkpointer"] = {}

    def __init__(self, path: str) -> None:
        self.path = path
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._wake = threading.Event()  # an engine was disposed: see whether any is left
        # The last checkpoint's (busy, frames in the WAL, frames checkpointed), as SQLite's
        # `PRAGMA wal_checkpoint` gives them.
        self.last: tuple[int, int, int] | None = None
        self._thread = threading.Thread(target=self._loop, name="examforge-checkpoint",
                                        daemon=True)

    @classmethod
    def ensure(cls, path: str, engine: Engine) -> "Checkpointer":
        """The running checkpointer of `path` in this process, serving `engine` too."""
        key = (os.getpid(), path)
        with cls._lock:
            running = cls._running.get(key)
            fresh = running is None or not running._thread.is_alive()
            if fresh:
                running = cls._running[key] = cls(path)
            assert running is not None
            running._engines.add(engine)
            if fresh:
                running._thread.start()
        return running

    @classmethod
    def _disposed(cls, path: str, engine: Engine) -> None:
        with cls._lock:
            running = cls._running.get((os.getpid(), path))
        if running is not None:
            running._engines.discard(engine)
            running._wake.set()

    def _loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                if self._wake.wait(CHECKPOINT_EVERY_S):
                    self._wake.clear()
                with self._lock:
                    if not self._engines or not os.path.exists(self.path):
                        if self._running.get((os.getpid(), self.path)) is self:
                            del self._running[(os.getpid(), self.path)]
                        return
                try:
                    if conn is None:
                        # mode=rw: a file deleted since the check is not made again, empty.
                        conn = sqlite3.connect(f"file:{quote(self.path)}?mode=rw", uri=True,
                                               isolation_level=None, check_same_thread=False)
                    self.last = tuple(conn.execute(  # type: ignore[assignment]
                        "PRAGMA wal_checkpoint(PASSIVE)").fetchone())
                    if self.last[0]:  # type: ignore[index]
                        log.debug("background checkpoint of %s: busy (another process's "
                                  "checkpoint holds the lock)", self.path)
                except Exception as exc:  # the commits' backstop checkpoints meanwhile
                    log.warning("background checkpoint of %s failed: %s", self.path, exc)
                    if conn is not None:
                        conn.close()
                        conn = None
        finally:
            if conn is not None:
                conn.close()


os.register_at_fork(after_in_child=_checkpointer_lock_after_fork)


def db_now(dialect_name: str) -> ColumnElement[float]:
    """The database's clock as float epoch seconds: the only clock leases are compared against."""
    if dialect_name == "postgresql":
        return literal_column("CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


# Refusals that name a mistake in DATABASE_URL rather than a service that is down: waiting
# does not fix them. PostgreSQL sends no SQLSTATE before the connection is up, so its message
# is matched (the server's English messages, the default lc_messages).
_CONFIG_MISTAKES = (
    re.compile(r'database ".*" does not exist'),
    re.compile(r'role ".*" does not exist'),
    re.compile(r"unable to open database file"),  # SQLite: a missing or unwritable directory
)


def shown_url(url: URL | str) -> str:
    """A database URL as the user wrote it in DATABASE_URL, for messages: the password masked,
    and PostgreSQL's driver name (`postgresql+psycopg://`, which examforge puts in place of a
    plain `postgresql://` or `postgres://`) left out."""
    parsed = make_url(url) if isinstance(url, str) else url
    text = parsed.render_as_string(hide_password=True)
    return text.replace("postgresql+psycopg://", "postgresql://", 1)


def database_error(exc: DBAPIError, url: URL | None = None) -> ConfigError | DatabaseUnavailable:
    """What a failed connection means, in one line: a ConfigError (exit 2) for a database or
    user that does not exist or a SQLite file that cannot be created, DatabaseUnavailable
    (exit 3) for a database that is down or refuses for a while."""
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
    shown = shown_url(url) if url is not None else None
    if any(p.search(reason) for p in _CONFIG_MISTAKES):
        return ConfigError(f"DATABASE_URL: {shown}: {reason}" if shown else
                           f"DATABASE_URL: {reason}")
    return DatabaseUnavailable(f"database {shown} unreachable: {reason}" if shown else
                               f"database error: {reason}")


# SQLite's primary result codes for a damaged file (the extended codes, e.g. 779
# SQLITE_CORRUPT_INDEX, keep them in their low byte).
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_SQLITE_DAMAGE = ("database disk image is malformed", "file is not a database")


def corruption(exc: BaseException, url: URL | None = None) -> DatabaseCorrupt | None:
    """DatabaseCorrupt when the driver's error says the database's own data is damaged:
    SQLite's SQLITE_CORRUPT ("database disk image is malformed") and SQLITE_NOTADB ("file is
    not a database"), PostgreSQL's SQLSTATE class XX (XX001 data_corrupted: "invalid page in
    block", XX002 index_corrupted, XX000 internal_error, which a damaged tuple also raises:
    "invalid memory alloc request size"); None for any other error. The line names the database (no password) and the way back."""
    orig = getattr(exc, "orig", None) or exc
    sqlstate = getattr(orig, "sqlstate", None)
    code = getattr(orig, "sqlite_errorcode", None)
    first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    if isinstance(sqlstate, str) and sqlstate.startswith("XX"):
        reason = f"SQLSTATE {sqlstate}: {first}"
    elif isinstance(code, int) and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        reason = first
    elif type(orig).__module__ == "sqlite3" and first in _SQLITE_DAMAGE:
        reason = first  # a driver without sqlite_errorcode (Python < 3.11)
    else:
        return None
    return _damaged(shown_url(url) if url is not None
                    else "DATABASE_URL", reason)


def _damaged(shown: str, reason: str, done: str = "") -> DatabaseCorrupt:
    if reason == "file is not a database":
        # SQLite cannot tell a damaged header from a file that never was a database: a
        # DATABASE_URL that names the wrong file is the likelier mistake, so say it first.
        return DatabaseCorrupt(
            f"database {shown} is damaged or is no SQLite database at all ({reason}): check "
            f"that DATABASE_URL names the right file; if it does, {done}stop the workers and "
            "restore the last backup (docs/how-to/backup-and-restore.md); python -m "
            "producer doctor checks it")
    return DatabaseCorrupt(f"database {shown} is damaged ({reason}): {done}stop the workers "
                           "and restore the last backup (docs/how-to/backup-and-"
                           "restore.md); python -m producer doctor checks it")


def check_reachable(engine: Engine) -> None:
    """Fail fast with one line when the database cannot be reached, or does not exist."""
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database not in (None, "", ":memory:") \
            and not Path(database).parent.is_dir():
        # SQLite says only "unable to open database file": name what is missing.
        raise ConfigError(f"DATABASE_URL: {shown_url(engine.url)}: "
                          f"no such directory {Path(database).parent.resolve()} (create it, or "
                          "point DATABASE_URL elsewhere)")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, DBAPIError) as exc:
        raise database_error(exc, engine.url) from None


def backup_sqlite(url: str, target: Path) -> int:
    """A consistent copy of a live SQLite database at `target` (its size in bytes), with
    SQLite's online backup API (`sqlite3.Connection.backup`).

    The copy is taken in one step, inside one read transaction: in WAL mode (every examforge
    engine sets it) a reader never blocks the writers and sees one committed state, so
    workers keep committing while it runs and the copy holds exactly the transactions
    committed before it began. (A copy in several steps would restart each time another
    connection writes, and might never finish beside busy workers.) It is written to a
    temporary file beside `target`, checked with `PRAGMA quick_check` (the API copies pages
    as they are, damage included), and renamed over `target` only then.

    ConfigError for a URL that is not a SQLite file, a missing database or a target in a
    directory that does not exist; DatabaseCorrupt when the database (so the copy) is
    damaged."""
    import os
    import sqlite3
    import tempfile

    parsed = make_url(check_database_url(url))
    shown = shown_url(parsed)
    if parsed.get_backend_name() != "sqlite":
        raise ConfigError(f"backup copies a SQLite database; {shown} is PostgreSQL: use "
                          "pg_dump -Fc (docs/how-to/backup-and-restore.md)")
    if parsed.database in (None, "", ":memory:") or not Path(parsed.database).is_file():
        raise ConfigError(f"DATABASE_URL: {shown}: no database file to back up")
    source_path = Path(parsed.database).resolve()
    target = target.expanduser()
    if not target.parent.is_dir():
        raise ConfigError(f"{target}: directory {target.parent} does not exist")
    if target.resolve() == source_path:
        raise ConfigError(f"{target}: is the database itself; choose another path")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        source = sqlite3.connect(f"{source_path.as_uri()}?mode=ro", uri=True, timeout=60)
        copy = sqlite3.connect(tmp)
        try:
            source.backup(copy)
            problems = [row[0] for row in copy.execute("PRAGMA quick_check(3)")]
            # The copy as one file: no -wal beside it to lose on the way to its storage.
            copy.execute("PRAGMA journal_mode=DELETE")
        finally:
            copy.close()
            source.close()
        if problems != ["ok"]:
            found = " ".join(line.strip() for row in problems for line in str(row).splitlines()
                             if line.strip() and not line.startswith("***"))
            raise _damaged(shown, f"quick_check: {found[:300]}", "no backup written; ")
        os.chmod(tmp, source_path.stat().st_mode & 0o777)  # mkstemp's file is 0600
        os.replace(tmp, target)
    except sqlite3.DatabaseError as exc:
        raise corruption(exc, parsed) or DatabaseUnavailable(
            f"database {shown}: backup failed: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target.stat().st_size


def alembic_config(connection: Connection | None = None):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def current_revision(engine: Engine) -> str | None:
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision; safe to call from many processes at once."""
    check_reachable(engine)
    if current_revision(engine) == SCHEMA_REVISION:
        return
    from alembic import command

    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_ID})
        command.upgrade(alembic_config(conn), "head")
