"""Persistence: the SQLModel tables, the engine, Alembic migrations and the chapter store."""

from storage.db import connect, migrate
from storage.store import Store


def open_store(database_url: str, *, pool_size: int = 10) -> Store:
    """The store on `database_url`, its schema brought up to date first (every entry point)."""
    engine = connect(database_url, pool_size=pool_size)
    migrate(engine)
    return Store(engine)


__all__ = ["Store", "connect", "migrate", "open_store"]
