"""Migration 0016 (batch mode) on a database that holds rows, on both databases: existing
exams are in sync mode, and the batch table starts empty."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from storage import Store, connect, migrate
from storage.db import alembic_config
from storage.models import ExamMode


def test_0016_keeps_existing_exams_in_sync_mode(db_url: str):
    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0015")
        conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                          "reserved_usd, created_at, updated_at) VALUES ('ex', 'Ex', 'active', "
                          "0, 0, 0, 1, 1)"))
    migrate(engine)
    store = Store(engine)
    assert store.exam_mode("ex") is ExamMode.sync
    assert store.exam_batches("ex") == [] and store.live_batches() == []
    assert store.set_exam_mode("ex", "batch") and store.exam_mode("ex") is ExamMode.batch
    assert not store.set_exam_mode("nope", "batch")
    assert store.batch_exams() == ["ex"]
    engine.dispose()
