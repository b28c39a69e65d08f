"""The commands that only read (status, exams, export, doctor, prune --dry-run) never create
or upgrade a schema: pointed at the wrong database, they say so in one line and exit 2,
and the database is as it was. On both databases. The first read of each test runs in a real
process (its exit code and stderr as a shell sees them), `doctor` too (it reaches the broker);
the others run the same CLI in this process (Deployment.cli_in_process), which shows the same
without a Python start-up each."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine, inspect

pytestmark = pytest.mark.e2e

READS = [["status", "demo"], ["status", "demo", "--json"], ["exams"], ["export", "demo"],
         ["prune", "--older-than", "0s", "--dry-run"]]


def _read(dep, i: int, command: list[str], **env: str):
    """The first read in a real process, the others in this one."""
    return (dep.cli if i == 0 else dep.cli_in_process)(*command, **env)


def _tables(url: str) -> list[str]:
    from examforge.settings import normalise_database_url

    engine = create_engine(normalise_database_url(url))
    try:
        return sorted(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _assert_one_line(result, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: DATABASE_URL: "), result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_reads_of_a_missing_sqlite_file_create_nothing(deploy, tmp_path):
    dep = deploy()
    path = tmp_path / "elsewhere" / "examforge.db"
    path.parent.mkdir()
    url = f"sqlite:///{path}"
    for i, command in enumerate(READS):
        _assert_one_line(_read(dep, i, command, DATABASE_URL=url), "no such database file",
                         "migrate")
    doctor = dep.cli("doctor", DATABASE_URL=url)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert "fail database: DATABASE_URL:" in doctor.stdout and "no such database file" in \
        doctor.stdout, doctor.stdout
    assert not path.exists()


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_reads_of_a_database_without_schema_write_none(deploy, database, tmp_path, request):
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'other.db'}"
        sqlite3.connect(tmp_path / "other.db").close()  # a database, empty
    else:
        url = request.getfixturevalue("pg_url")  # as the shared `postgres` database would be
    dep = deploy(database_url=url, migrated=False)
    # Every read on SQLite; two on PostgreSQL (the same code path, a second per command).
    for i, command in enumerate(READS if database == "sqlite" else [READS[0], READS[-1]]):
        _assert_one_line(_read(dep, i, command), "has no examforge schema", "migrate")
    doctor = dep.cli("doctor")
    assert doctor.returncode == 2 and "has no examforge schema" in doctor.stdout, doctor.stdout
    assert _tables(url) == []
    # The commands that write still create it.
    assert dep.cli_in_process("migrate").returncode == 0
    assert "alembic_version" in _tables(url)
    unknown = dep.cli_in_process("status", "demo")
    assert unknown.returncode == 2 and "demo" in unknown.stderr, unknown.stderr


def test_reads_of_an_older_schema_do_not_upgrade_it(deploy, tmp_path):
    from alembic import command
    from alembic.script import ScriptDirectory

    from storage.db import SCHEMA_REVISION, alembic_config, connect, current_revision

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = connect(url, pool_size=1)
    with engine.begin() as conn:
        config = alembic_config(conn)
        # The revision before the head (numbers may skip one: a branch's migration renumbered).
        older = ScriptDirectory.from_config(config).get_revision(SCHEMA_REVISION).down_revision
        command.upgrade(config, older)
    dep = deploy(database_url=url, migrated=False)
    for i, command_line in enumerate((READS[0], READS[-1])):
        _assert_one_line(_read(dep, i, command_line), f"revision {older}", "migrate")
    assert current_revision(engine) == older
    dep.syllabus("demo", [("a", 5)])
    # A dry run reads too.
    assert dep.cli("enqueue", "demo", "--dry-run").returncode == 0
    assert current_revision(engine) == older
    engine.dispose()
