"""The tests' replay of the migrated schema (tests/schema_template.py) makes exactly what
Alembic makes: every table, index, trigger, function and row, on both databases."""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.engine import make_url

import schema_template
from storage import connect, migrate


def _is_identity(line: str) -> bool:
    return line.startswith(("INSERT INTO \"database_identity\"",
                            "INSERT INTO public.database_identity"))


def _identities(lines: list[str]) -> list[str]:
    found = [line for line in lines if _is_identity(line)]
    assert len(found) == 1, found
    return found


def _without_identity(lines: list[str]) -> list[str]:
    return [line for line in lines if not _is_identity(line)]


def _sqlite_canonical(statements: list[str]) -> list[tuple[str, ...]]:
    """Each statement's lines in order of their text: Alembic's batch mode writes a recreated
    table's constraints in an order that changes from run to run (two of its own runs
    differ)."""
    return sorted(tuple(sorted(line.strip().rstrip(",") for line in s.splitlines()))
                  for s in _without_identity(statements))


def _pg_canonical(script: str) -> list[str]:
    """The dump's lines, casts and parentheses out: a partial index's predicate, written
    back by pg_dump and read again, comes out with its casts in other places (the same
    expression: `state::text = ANY(ARRAY['pending'::varchar, ...]::text[])`)."""
    strip = ("(", ")", "::character varying", "::text[]", "::text", " ")
    lines = []
    for line in _without_identity(script.splitlines()):
        for token in strip:
            line = line.replace(token, "")
        lines.append(line)
    return lines


def _migrated(url: str, alembic: bool) -> None:
    engine = connect(url)
    try:
        if alembic:
            with schema_template.alembic_only():
                migrate(engine)
        else:
            migrate(engine)
        assert inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_the_replay_makes_alembics_schema_on_sqlite(tmp_path):
    _migrated(f"sqlite:///{tmp_path / 'replayed.db'}", alembic=False)
    _migrated(f"sqlite:///{tmp_path / 'alembic.db'}", alembic=True)
    replayed = schema_template.sqlite_schema(tmp_path / "replayed.db")
    made = schema_template.sqlite_schema(tmp_path / "alembic.db")
    assert any("CREATE INDEX" in s for s in made)
    assert _identities(replayed) != _identities(made)  # each database its own id
    assert _sqlite_canonical(replayed) == _sqlite_canonical(made)


def test_the_replay_makes_alembics_schema_on_postgresql(pg_url):
    base = make_url(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with schema_template.scratch_pg_database(base) as other:
        _migrated(base.render_as_string(hide_password=False), alembic=False)
        _migrated(other.render_as_string(hide_password=False), alembic=True)
        replayed = schema_template.pg_schema(base)
        made = schema_template.pg_schema(other)
    assert "CREATE FUNCTION public.ef_claim" in made and "alembic_version" in made
    assert _identities(replayed.splitlines()) != _identities(made.splitlines())
    assert _pg_canonical(replayed) == _pg_canonical(made)


def test_a_database_with_a_table_or_a_revision_goes_through_alembic(tmp_path):
    # Upgrading to a revision, then to head: Alembic's steps both times (the replay is only
    # for an empty database going to head), and the result is the same schema.
    from alembic import command

    from storage.db import alembic_config

    url = f"sqlite:///{tmp_path / 'stepwise.db'}"
    engine = connect(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0001")
    assert schema_template.sqlite_schema(tmp_path / "stepwise.db") != []
    migrate(engine)
    engine.dispose()
    _migrated(f"sqlite:///{tmp_path / 'alembic.db'}", alembic=True)
    assert _sqlite_canonical(schema_template.sqlite_schema(tmp_path / "stepwise.db")) == \
        _sqlite_canonical(schema_template.sqlite_schema(tmp_path / "alembic.db"))
