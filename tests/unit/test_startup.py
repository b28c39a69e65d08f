"""The commands that need no database start at once: `--help`, `--version` and the mock's
`--help` import neither SQLAlchemy, Celery, httpx nor the settings (0.5 s of imports, against
0.15 s for the whole start). What is imported is checked, not the time, which a loaded
machine would make flaky: `python -X importtime` names every module a run imports.

The commands that only read (status, exams, review, export of a small exam; issue 28) import
neither Celery, kombu, Alembic, tiktoken, httpx nor FastAPI, on a database with the schema
and on one without it (today's one-line error); on a SQLite file they import neither
SQLAlchemy nor SQLModel (the plain-driver path), nor rich with --json. One generous time
bound beside: a read command against `--version`, each the median of five launches
(bench/launch.py measures the same thing for the benchmark table)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "celery", "httpx", "pydantic_settings", "rich", "asyncio")


# What a command that only reads must never import: the broker, the migrations, the
# tokenizer, the HTTP client and the API (each a tenth of a second or more of start-up).
NOT_FOR_READING = ("celery", "kombu", "alembic", "tiktoken", "httpx", "fastapi", "starlette",
                   "uvicorn", "mockllm", "runner", "tasks")


def _env(**env_vars: str) -> dict[str, str]:
    return {**os.environ, **env_vars, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def _imported(*argv: str, exit_code: int = 0, **env_vars: str) -> set[str]:
    """The top-level packages `python -X importtime ARGV` imports; it must exit `exit_code`."""
    result = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=REPO_ROOT,
                            env=_env(**env_vars), capture_output=True, text=True, timeout=60)
    assert result.returncode == exit_code, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert lines, "python -X importtime printed nothing"
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines}


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ("-m", "producer", "--version"),
    ("-m", "producer", "--help"),
    ("-m", "producer", "status", "--help"),
    ("-m", "producer", "enqueue", "--help"),
    ("-m", "producer", "mock-llm", "--help"),
    ("-m", "mockllm", "--help"),
], ids=" ".join)
def test_a_command_that_needs_no_database_imports_none_of_its_libraries(
        argv: tuple[str, ...]) -> None:
    imported = _imported(*argv)
    assert "click" in imported or "argparse" in imported  # the measure sees the parser
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


@pytest.mark.slow
def test_a_command_that_runs_imports_its_implementation(tmp_path: Path) -> None:
    """The counter-check: the measure does see a command's libraries once it runs."""
    imported = _imported("-m", "producer", "migrate",
                         DATABASE_URL=f"sqlite:///{tmp_path / 'examforge.db'}")
    assert {"sqlalchemy", "pydantic_settings", "rich"} <= imported


def test_python_m_producer_alone_prints_the_help_and_exits_0():
    bare = subprocess.run([sys.executable, "-m", "producer"], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0, bare.stderr
    assert bare.stderr == ""
    assert bare.stdout.startswith("Usage: python -m producer [OPTIONS] COMMAND [ARGS]...")
    helped = subprocess.run([sys.executable, "-m", "producer", "--help"], cwd=REPO_ROOT,
                            env=_env(), capture_output=True, text=True, timeout=60)
    assert bare.stdout == helped.stdout


@pytest.fixture(scope="module")
def small_exam(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite database holding one finished exam of 100 questions in 8 chapters."""
    from bench.seed import seed_exam

    url = f"sqlite:///{tmp_path_factory.mktemp('launch') / 'examforge.db'}"
    seed_exam(url, "small", 100, 8)
    return url


def _read_commands(folder: Path) -> list[tuple[str, ...]]:
    return [("status", "small"), ("status", "small", "--json"), ("exams",),
            ("review", "small"), ("export", "small", "-o", str(folder / "small.jsonl")),
            ("export", "small", "--format", "gift", "-o", str(folder / "small.gift.txt"))]


@pytest.mark.slow
def test_a_command_that_only_reads_imports_neither_celery_nor_migrations(small_exam, tmp_path):
    for argv in _read_commands(tmp_path):
        imported = _imported("-m", "producer", *argv, DATABASE_URL=small_exam)
        assert "sqlite3" in imported  # the measure sees the database's driver
        assert not imported & set(NOT_FOR_READING), (argv, sorted(imported & set(NOT_FOR_READING)))


# What the plain-driver path of a SQLite file never imports (producer/read_sqlite.py,
# producer/export_sqlite.py): the store, about 0.7 s of CPU; and with --json, rich.
# (`review --json` is GET /exams/SLUG/review's answer with each filter's count, which only
# the store's path reads.)
THE_STORE = ("sqlalchemy", "sqlmodel", "alembic")


@pytest.mark.slow
def test_a_read_of_a_sqlite_file_takes_the_plain_driver(small_exam, tmp_path):
    for argv in _read_commands(tmp_path)[:-1] + [("status", "small", "--json"),
                                                 ("exams", "--json")]:
        imported = _imported("-m", "producer", *argv, DATABASE_URL=small_exam)
        assert "sqlite3" in imported and "click" in imported  # the measure sees them
        assert not imported & set(THE_STORE), (argv, sorted(imported & set(THE_STORE)))
        if "--json" in argv:
            assert "rich" not in imported, argv


@pytest.mark.slow
@pytest.mark.parametrize("argv", [("status", "x"), ("exams",), ("review", "x"),
                                  ("export", "x")], ids=" ".join)
def test_a_read_of_a_database_without_the_schema_is_one_line_without_migrating(
        argv: tuple[str, ...], tmp_path: Path) -> None:
    """A read never migrates: a file without the schema is refused in one line (exit 2),
    without importing Alembic, and stays as it was."""
    import sqlite3

    db = tmp_path / "other.db"
    sqlite3.connect(db).close()
    url = f"sqlite:///{db}"
    imported = _imported("-m", "producer", *argv, exit_code=2, DATABASE_URL=url)
    assert not imported & set(NOT_FOR_READING), sorted(imported & set(NOT_FOR_READING))
    result = subprocess.run([sys.executable, "-m", "producer", *argv], cwd=REPO_ROOT,
                            env=_env(DATABASE_URL=url), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: DATABASE_URL: {url} has no examforge schema (python -m producer migrate "
        "creates it, as enqueue, run and the workers do)"]
    assert db.stat().st_size == 0


def _median_launch_s(argv: tuple[str, ...], env: dict[str, str], runs: int = 5) -> float:
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "producer", *argv], cwd=REPO_ROOT, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                       check=True)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


# Generous bounds, medians of five launches against `--version`'s: issue 28 asks for 0.5 s
# against its 0.12 s (about 4x) on an idle machine. On SQLite the four commands take the
# plain-driver path (about 3.5x in instructions, bench/results-launch.md); the store's path
# is about 9x, so a bound of 8x fails when one of them falls back to it for good.
BOUNDS = {("exams",): 8.0, ("status", "small"): 8.0, ("status", "small", "--json"): 8.0,
          ("review", "small"): 8.0}


@pytest.mark.slow
def test_a_read_command_takes_a_few_times_what_version_takes(small_exam):
    env = _env(DATABASE_URL=small_exam)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a deployment: with its .pyc files
    for argv in BOUNDS:
        _median_launch_s(argv, env, runs=1)  # writes the bytecode caches
    version = _median_launch_s(("--version",), env)
    for argv, bound in BOUNDS.items():
        took = _median_launch_s(argv, env)
        assert took < bound * version, (argv, took, version)
