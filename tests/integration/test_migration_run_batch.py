"""Migration 0019 (run.batch) on a database that holds runs, on both databases: existing runs
are synchronous, and their fingerprints (which never held `batch`) still match a repeat of
their request."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from producer.api.runs import fingerprint
from storage import Store, connect, migrate
from storage.db import alembic_config


def test_0019_keeps_existing_runs_synchronous_and_their_keys_valid(db_url: str):
    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0018")
        conn.execute(text(
            "INSERT INTO run (exam, client, idempotency_key, fingerprint, call_floor, "
            "created_at, updated_at) VALUES ('ex', '', 'k', :fp, 0, 1, 1)"),
            {"fp": fingerprint("ex", None)})
    migrate(engine)
    store = Store(engine)
    [run] = store.exam_runs("ex")
    assert run.batch is False
    # The same request (no batch) is the same run; asking for batch mode with its key is not.
    again, created = store.create_run("ex", "k", fingerprint("ex", None, False), None)
    assert (again.id, created) == (run.id, False)
    assert fingerprint("ex", None, True) != run.fingerprint
    made, created = store.create_run("ex", "k2", fingerprint("ex", None, True), None,
                                     batch=True)
    assert created and made.batch is True and store.run(made.id).batch is True
    engine.dispose()
