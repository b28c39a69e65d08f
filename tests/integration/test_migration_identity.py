"""Migration 0015 (the database's identity) on a database that holds rows, on both
databases: one row with a random id, kept by every later open."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import text

from storage import Store, connect, migrate
from storage.db import alembic_config


def test_0015_gives_a_database_holding_rows_an_id_of_its_own(db_url: str, tmp_path: Path):
    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0014")
    # The rows as revision 0014 wrote them, in SQL: today's models have later columns.
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                          "reserved_usd, created_at, updated_at) VALUES "
                          "('ex', 'Ex', 'active', 0, 0, 0, 1, 1)"))
        conn.execute(text("INSERT INTO slice (exam, chapter_id, slice_no, first_number, "
                          "position, title, spec_hash, target, state, attempts, "
                          "attempts_since_progress, requeues, updated_at) VALUES "
                          "('ex', 'a', 0, 1, 0, 'A', 'h', 5, 'pending', 0, 0, 0, 1)"))
    migrate(engine)
    store = Store(engine)
    ident = store.database_id()
    assert len(ident) == 32 and int(ident, 16) >= 0
    assert store.status("ex").questions.target == 5  # the rows are kept
    assert Store(engine).database_id() == ident  # written once, read again
    migrate(engine)  # a no-op: no second row, no new id
    assert Store(engine).database_id() == ident
    other = connect(f"sqlite:///{tmp_path / 'other.db'}")
    migrate(other)
    assert Store(other).database_id() != ident
    other.dispose()
    engine.dispose()
