"""Engines for SQLite and PostgreSQL, the database clock, and schema migration via Alembic."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import event, inspect, literal_column, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import create_engine

from examforge.errors import ConfigError, DatabaseUnavailable
from examforge.settings import check_database_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# The newest migration. Checked against Alembic's own head by a test, so it cannot drift; it
# saves importing Alembic (a tenth of a short command's CPU) when the schema is current.
SCHEMA_REVISION = "0015"
READ_ONLY = "examforge_read_only"
# Any fixed number: serialises concurrent `upgrade` runs on PostgreSQL.
_MIGRATION_LOCK_ID = 0x65786166


def connect(url: str, *, pool_size: int = 10) -> Engine:
    """An engine for `url`. SQLite gets WAL, a busy timeout and `BEGIN IMMEDIATE` transactions."""
    try:
        url = check_database_url(url)
        parsed = make_url(url)
    except ValueError as exc:
        raise ConfigError(f"DATABASE_URL: {exc}") from None
    except ArgumentError:
        raise ConfigError(f"DATABASE_URL: not a database URL: {url!r}") from None
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            url, connect_args={"timeout": 60, "check_same_thread": False}, pool_size=pool_size
        )
        _make_sqlite_transactions_immediate(engine)
        return engine
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=60,
        connect_args={"connect_timeout": 5} if parsed.get_backend_name() == "postgresql" else {},
    )


def _make_sqlite_transactions_immediate(engine: Engine) -> None:
    # pysqlite's default deferred transactions let two writers both read, then one fails with
    # "database is locked" on upgrade to a write lock. BEGIN IMMEDIATE takes the write lock up
    # front, so claims and commits serialise cleanly (SQLAlchemy's documented recipe).
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        # Reads (Store._read) stay deferred: in WAL mode they never block the writers.
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


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


def database_error(exc: DBAPIError, url: URL | None = None) -> ConfigError | DatabaseUnavailable:
    """What a failed connection means, in one line: a ConfigError (exit 2) for a database or
    user that does not exist or a SQLite file that cannot be created, DatabaseUnavailable
    (exit 3) for a database that is down or refuses for a while."""
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
    shown = url.render_as_string(hide_password=True) if url is not None else None
    if any(p.search(reason) for p in _CONFIG_MISTAKES):
        return ConfigError(f"DATABASE_URL: {shown}: {reason}" if shown else
                           f"DATABASE_URL: {reason}")
    return DatabaseUnavailable(f"database {shown} unreachable: {reason}" if shown else
                               f"database error: {reason}")


def check_reachable(engine: Engine) -> None:
    """Fail fast with one line when the database cannot be reached, or does not exist."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, DBAPIError) as exc:
        raise database_error(exc, engine.url) from None


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
