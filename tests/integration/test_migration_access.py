"""Migration 0030 (api_token, audit, run.started_by) on both databases, from 0029 with data:
the runs stored before it keep their client hash and read it as who started them; named
tokens and audit rows work at once; a name is unique among live tokens only; a downgrade
drops what it added and keeps the runs."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from storage import Store, connect, migrate
from storage.db import alembic_config


def test_0030_over_stored_runs_and_back(db_url: str):
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0029")
    names = inspect(engine).get_table_names()
    assert "api_token" not in names and "audit" not in names
    assert "started_by" not in {c["name"] for c in inspect(engine).get_columns("run")}
    # A run stored by the schema before names: its client is a hash of its token.
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO run (exam, client, idempotency_key, fingerprint, call_floor, batch, "
            "created_at, updated_at) VALUES ('ex', 'c0783c55aaaabbbbccccddddeeeeffff', 'k1', "
            "'f', 0, false, 1.0, 1.0)"))
    migrate(engine)
    old = store.exam_runs("ex")[0]
    assert (old.client, old.started_by) == ("c0783c55aaaabbbbccccddddeeeeffff", None)
    from producer.api.runs import _started_by
    assert _started_by(old) == "c0783c55aaaabbbbccccddddeeeeffff"  # the hash, where no name
    new, _ = store.create_run("ex", "k2", "f", None, "hash2", started_by="alice")
    assert _started_by(new) == "alice"
    # Tokens: a live name is unique; revoked, it can be issued again.
    assert store.add_token("alice", "reviewer", ["ex"], "a" * 64, "cli:me") is not None
    assert store.add_token("alice", "reader", None, "b" * 64, "cli:me") is None
    assert store.revoke_token("alice") is not None
    again = store.add_token("alice", "reader", None, "c" * 64, "cli:me")
    assert again is not None and again.exams is None
    assert store.live_token("a" * 64) is None and store.live_token("c" * 64) == again
    store.touch_token(again.id, 60)
    touched = store.live_token("c" * 64)
    assert touched is not None and touched.last_used_at is not None
    store.touch_token(again.id, 60)  # within the minute: not written again
    assert store.live_token("c" * 64).last_used_at == touched.last_used_at
    assert [t.name for t in store.tokens(revoked=True)] == ["alice", "alice"]
    # The audit.
    ids = [store.record_audit("cli:me", "run.start", "ex", {"n": i}, "ok") for i in range(3)]
    items, cursor = store.audit_page(limit=2)
    assert [r.id for r in items] == ids[::-1][:2] and cursor is not None
    rest, end = store.audit_page(limit=2, after=cursor)
    assert [r.id for r in rest] == [ids[0]] and end is None
    assert store.audit_page(exam="other")[0] == []
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0029")
        runs = conn.execute(text("SELECT idempotency_key FROM run ORDER BY id")).scalars().all()
    assert runs == ["k1", "k2"]
    assert "api_token" not in inspect(engine).get_table_names()
    migrate(engine)
    engine.dispose()
