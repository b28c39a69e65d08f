"""Persistence: the SQLModel tables, the engine, Alembic migrations and the chapter store."""

from pathlib import Path

from examforge.errors import ConfigError
from storage.db import SCHEMA_REVISION, check_reachable, connect, current_revision, migrate
from storage.store import Store


def open_store(database_url: str, *, pool_size: int = 10) -> Store:
    """The store on `database_url`, its schema brought up to date first (the commands that
    write, the workers and the API)."""
    engine = connect(database_url, pool_size=pool_size)
    migrate(engine)
    return Store(engine)


class NoSchema(ConfigError):
    """The database has no examforge schema, or an older one, and the command only reads."""


def open_existing_store(database_url: str, *, pool_size: int = 10) -> Store:
    """The store on `database_url` for a command that only reads (status, exams, export,
    doctor, prune --dry-run): it never creates a database, a schema or a migration, so a
    read pointed at the wrong database (the shared `postgres` one, a SQLite path relative
    to another directory) changes nothing there. NoSchema (exit 2) says what is missing."""
    engine = connect(database_url, pool_size=pool_size)
    shown = engine.url.render_as_string(hide_password=True)
    fix = "(python -m producer migrate creates it, as enqueue, run and the workers do)"
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database not in (None, "", ":memory:") \
            and not Path(database).exists():
        engine.dispose()  # connecting would create the file
        raise NoSchema(f"DATABASE_URL: {shown}: no such database file {fix}")
    try:
        check_reachable(engine)
        revision = current_revision(engine)
    except BaseException:
        engine.dispose()
        raise
    if revision != SCHEMA_REVISION:
        engine.dispose()
        if revision is None:
            raise NoSchema(f"DATABASE_URL: {shown} has no examforge schema {fix}")
        raise NoSchema(f"DATABASE_URL: {shown} has the examforge schema of revision "
                       f"{revision}, this version reads {SCHEMA_REVISION} (python -m producer "
                       "migrate upgrades an older one)")
    return Store(engine)


__all__ = ["NoSchema", "Store", "connect", "migrate", "open_existing_store", "open_store"]
