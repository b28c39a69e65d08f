"""Persistence: the SQLModel tables, the engine, Alembic migrations and the chapter store."""

from storage.db import connect, migrate
from storage.store import Store

__all__ = ["Store", "connect", "migrate"]
