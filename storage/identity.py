"""The database's identity (migration 0013): what task messages carry, so that a worker on
another database than its producer's (a relative `sqlite:///examforge.db` opened from two
directories) leaves their messages alone instead of finding "no work" and acking them."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from storage.base import StoreBase
from storage.db import shown_url
from storage.models import DatabaseIdentity

I = DatabaseIdentity.__table__  # type: ignore[attr-defined]


class Identity(StoreBase):
    _database_id: str | None = None

    def database_id(self) -> str:
        """The id written with the schema; read once per store (it never changes)."""
        if self._database_id is None:
            with self._read() as conn:
                self._database_id = conn.execute(
                    select(I.c.database_id).where(I.c.id == 1)).scalar_one()
        return self._database_id

    def database_label(self) -> str:
        """The database as a person finds it: a SQLite file by its absolute path (the URL
        may be relative to a directory the reader does not know), else the URL without its
        password."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            return f"sqlite:///{Path(url.database).resolve()}"
        return shown_url(url)
