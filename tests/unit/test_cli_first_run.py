"""What a new user tripped over following README in a fresh clone (issue 10): bad settings and
typos are one line naming the variable or option, a non-zero exit, no traceback, nothing
written. The CLI runs in this process (producer.cli.main) against SQLite; no service."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import text

from examforge.errors import PauseCode, SliceReason
from examforge.settings import Settings, load_settings
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from producer.cli import main
from storage import open_store


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A clean environment (no .env, no inherited settings) with a SQLite file in tmp_path."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    values = {"DATABASE_URL": f"sqlite:///{tmp_path / 'examforge.db'}",
              "EXAMS_DIR": str(tmp_path / "exams"), "BROKER_URL": "redis://127.0.0.1:1/0"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    load_settings.cache_clear()
    yield values
    load_settings.cache_clear()


def cli(capsys: pytest.CaptureFixture[str], *args: str, **env: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m producer ARGS` with ENV on top."""
    mp = pytest.MonkeyPatch()
    root = logging.getLogger()
    # main() points the root logger at this test's captured stderr: put back what was there,
    # or threads of later tests would log to a closed file.
    mp.setattr(root, "handlers", list(root.handlers))
    mp.setattr(root, "level", root.level)
    try:
        for name, value in env.items():
            mp.setenv(name, value)
        load_settings.cache_clear()
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
    finally:
        mp.undo()
        load_settings.cache_clear()
    return code, captured.out, captured.err


def assert_one_line(code: int, stderr: str, *needles: str, exit_code: int = 2) -> str:
    lines = stderr.strip().splitlines()
    assert code == exit_code, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _exam(env: dict[str, str], chapters: list[tuple[str, int]], slug: str = "ex") -> Any:
    path = write_syllabus(Path(env["EXAMS_DIR"]), slug, chapters)
    store = open_store(env["DATABASE_URL"])
    store.sync_exam(slug, load_syllabus(path, max_questions=1000))
    return store


@pytest.mark.parametrize("url", [
    "mysql://x@localhost/db", "mysql+pymysql://x:s3cret@localhost/db",
    "postgresql+asyncpg://postgres@127.0.0.1/db", "postgresql+psycopg2://postgres@127.0.0.1/db",
    "oracle://x@h/d", "examforge.db",
])
def test_an_unsupported_database_driver_is_one_line_naming_the_supported_urls(env, capsys, url):
    for command in (["status", "ex"], ["enqueue", "ex", "--dry-run"], ["migrate"]):
        code, _, stderr = cli(capsys, *command, DATABASE_URL=url)
        line = assert_one_line(code, stderr, "DATABASE_URL", "sqlite:///PATH",
                               "postgresql://USER@HOST:PORT/DB")
        assert "s3cret" not in line
    assert not list(Path(".").glob("*.db"))


@pytest.mark.parametrize("url, scheme", [
    ("sqlite:///x.db", "sqlite"), ("sqlite+pysqlite:///x.db", "sqlite+pysqlite"),
    ("postgresql://u@h/d", "postgresql+psycopg"), ("postgres://u@h/d", "postgresql+psycopg"),
    ("postgresql+psycopg://u@h/d", "postgresql+psycopg"),
])
def test_the_supported_database_urls_are_accepted(url, scheme):
    assert Settings(_env_file=None, database_url=url).database_url.split("://")[0] == scheme


def test_a_sqlite_file_in_a_missing_directory_is_a_configuration_error(env, capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}"
    code, _, stderr = cli(capsys, "migrate", DATABASE_URL=url)
    assert_one_line(code, stderr, "DATABASE_URL", f"no such directory {tmp_path / 'no' / 'such' / 'dir'}")
    code, _, stderr = cli(capsys, "status", "ex", DATABASE_URL=url)  # reads: never creates
    assert_one_line(code, stderr, "DATABASE_URL", "no such directory")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("url, shown", [
    ("http://localhost", "http://"), ("localhost:6379", "not a broker URL"),
    ("unix:///tmp/redis.sock", "unix://"),
])
def test_a_broker_url_that_is_no_broker_is_a_configuration_error(env, capsys, url, shown):
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 5)])
    code, _, stderr = cli(capsys, "enqueue", "ex", BROKER_URL=url)
    assert_one_line(code, stderr, "BROKER_URL", shown, "redis://")
    assert not Path(env["DATABASE_URL"].removeprefix("sqlite:///")).exists()


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h/0", "amqp://g@h//",
                                 "memory://", "sqla+postgresql://u@h/d", "sentinel://h:26379"])
def test_every_kombu_transport_is_accepted_as_a_broker(url):
    # Sentinel needs the master's name beside it (tests/unit/test_sentinel_settings.py).
    master = {"broker_sentinel_master": "ef"} if url.startswith("sentinel://") else {}
    assert Settings(_env_file=None, broker_url=url, **master).broker_url == url


def test_a_redis_url_kombu_cannot_use_is_a_configuration_error_not_an_outage():
    # check_broker itself, on an app of its own: the tasks app keeps the broker of the
    # environment it was first imported in, a real Redis this test must not publish to.
    from celery import Celery

    from examforge.errors import ConfigError
    from tasks.broker import check_broker

    url = "redis://127.0.0.1:6379/x"
    settings = Settings(_env_file=None, broker_url=url, broker_connect_timeout_s=1)
    with pytest.raises(ConfigError, match=r"^BROKER_URL: .*not x$"):
        check_broker(Celery(broker=url), settings)


def test_cancel_says_which_chapters_a_call_in_flight_may_still_finish(env, capsys):
    store = _exam(env, [("a", 5), ("b", 5)])
    claim = store.claim("ex", "a", "live", 60.0, 8)
    store.start_call(claim, 1, 5, lease_s=60.0)
    code, stdout, _ = cli(capsys, "cancel", "ex")
    assert code == 0 and stdout.strip() == (
        "cancelled 2 chapters of ex (1 with a call in flight: its reply is paid for and kept "
        "when it comes, and may finish its chapter)")


def test_cancel_of_an_unknown_chapter_is_refused_and_cancels_nothing(env, capsys):
    store = _exam(env, [("a", 5), ("b", 5)])
    code, stdout, stderr = cli(capsys, "cancel", "ex", "--chapter", "a", "--chapter", "nope")
    assert_one_line(code, stderr, "--chapter", "'nope'", "ex")
    assert stdout == ""
    assert {c.id: c.state for c in store.status("ex").chapter_list} == {
        "a": "pending", "b": "pending"}
    code, stdout, _ = cli(capsys, "cancel", "ex", "--chapter", "a")
    assert code == 0 and stdout.strip() == "cancelled 1 chapter of ex"
    assert {c.id: c.state for c in store.status("ex").chapter_list} == {
        "a": "cancelled", "b": "pending"}


def test_cancel_of_an_unknown_exam_is_refused(env, capsys):
    code, _, stderr = cli(capsys, "cancel", "ghost", "--chapter", "a")
    assert_one_line(code, stderr, "ghost")


@pytest.mark.slow
def test_piped_status_never_wraps_a_line(env, tmp_path):
    """Off a terminal (`| tee`, CI logs) rich wrapped at 80 columns, then at 200: a table row
    and the usage line each stay one line, however long."""
    long_id = "a-chapter-whose-identifier-alone-is-longer-than-forty-characters"
    store = _exam(env, [(long_id, 5), ("b", 5)])
    error = "connection: " + " ".join(["the provider reset the connection"] * 6)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE slice SET last_error = :e, last_error_at = 1800000000 "
                          "WHERE chapter_id = :c"), {"e": error, "c": long_id})
    result = subprocess.run([sys.executable, "-m", "producer", "status", "ex"],
                            env={**os.environ, **env, "COLUMNS": "80"}, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    row = [line for line in lines if long_id in line]
    assert len(row) == 1 and "2027-01-15T08:00:00+00:00 connection: the provider" in row[0]
    assert row[0].rstrip(" │").endswith("…")  # cut by _short at 120 characters, not wrapped
    assert max(len(line) for line in lines) > 200
    assert len([line for line in lines if line.startswith("│")]) == 2  # one line per chapter
    usage = [line for line in lines if line.startswith("calls: ")]
    assert len(usage) == 1 and usage[0].endswith("cost: $0.0000")


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    code, stdout, _ = cli(capsys, "--version")
    assert code == 0 and stdout.strip() == f"examforge, version {version('examforge')}"


def test_counts_of_one_are_singular(env, capsys):
    # "1 exams", "would prune 1 exams" read as a mistake to a newcomer.
    _exam(env, [("a", 5)])
    code, stdout, _ = cli(capsys, "exams")
    assert code == 0 and stdout.splitlines()[0].strip() == "1 exam", stdout
    code, stdout, _ = cli(capsys, "cancel", "ex")
    assert code == 0 and stdout.strip() == "cancelled 1 chapter of ex"
    code, stdout, _ = cli(capsys, "prune", "--older-than", "0s", "--dry-run")
    assert code == 0, stdout
    assert "would prune ex: 1 chapter (1 slice), 0 questions, 0 calls" in stdout, stdout
    assert "would prune 1 exam (0 questions, 0 calls)" in stdout, stdout


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "five"])
def test_a_budget_that_is_no_amount_of_dollars_is_one_plain_line(env, capsys, value):
    # click's FloatRange let nan and inf through (nan was stored as "no budget" after a dry
    # run saying "$nan: does not fit") and refused "five" as "not a valid float range".
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 5)])
    for command in (["enqueue", "ex", "--dry-run"], ["run", "ex"], ["enqueue", "ex"]):
        code, stdout, stderr = cli(capsys, *command, "--budget-usd", value)
        line = assert_one_line(code, stderr, "--budget-usd", f"{value!r} is not an amount of "
                               "dollars: give a number above 0")
        assert "float range" not in line and stdout == ""
    assert not (Path(env["DATABASE_URL"].removeprefix("sqlite:///"))).exists()


def test_an_import_report_of_one_question_is_singular():
    from producer.importer import report_lines
    from storage.imports import ChapterImport, FilledSlice, ImportResult

    one = ChapterImport("a", imported=1, near_duplicates=1,
                        slices=[FilledSlice(0, 1, 1, done=False, call_id=1)])
    lines = report_lines(ImportResult("ex", [one]))
    assert lines[0] == "imported  ex/a: 1 question, slice 0 numbers 1", lines
    assert "1 near-duplicate," in lines[1] and "1 near-duplicates" not in lines[1], lines


def test_a_read_of_another_programs_sqlite_file_changes_nothing_in_it(env, capsys, tmp_path):
    # The engine's connections switch a file to WAL: a read-only command pointed at a file
    # that is not examforge's (another program's database, an empty file) must not.
    import sqlite3

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('mine')")
    conn.close()
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (other, empty):
        before = path.read_bytes()
        for command in (["status", "ex"], ["exams"], ["export", "ex"], ["doctor"]):
            code, stdout, stderr = cli(capsys, *command, DATABASE_URL=f"sqlite:///{path}")
            assert code == 2 and "has no examforge schema" in stdout + stderr, (command, stderr)
        assert path.read_bytes() == before, path
        assert not path.with_name(path.name + "-wal").exists()
    with sqlite3.connect(other) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_a_database_in_a_directory_that_does_not_exist_says_which(env, capsys, tmp_path):
    code, _, stderr = cli(capsys, "status", "ex",
                          DATABASE_URL=f"sqlite:///{tmp_path / 'nosuch' / 'x.db'}")
    assert_one_line(code, stderr, f"no such directory {tmp_path / 'nosuch'}")
    code, _, stderr = cli(capsys, "status", "ex")  # the default, relative to where it runs
    assert_one_line(code, stderr, "no such database file", "a relative path is read from",
                    "point DATABASE_URL at the file")


@pytest.mark.parametrize("typed", ["postgresql://me:s3cret@127.0.0.1:1/exams",
                                   "postgres://me:s3cret@127.0.0.1:1/exams"])
def test_a_database_error_names_the_url_as_typed_with_its_password_masked(env, capsys, typed):
    # Port 1: nothing listens, so the connection is refused at once (no service needed).
    code, stdout, stderr = cli(capsys, "status", "ex", DATABASE_URL=typed)
    assert code != 0 and "Traceback" not in stderr, stderr
    assert "postgresql://me:***@127.0.0.1:1/exams" in stderr, stderr
    assert "+psycopg" not in stderr and "s3cret" not in stdout + stderr, stderr


def test_doctor_says_how_to_start_a_local_model_server_that_is_not_running(env, capsys):
    from examforge.settings import Settings
    from producer.doctor import _model_endpoint

    local = Settings(_env_file=None, llm_base_url="http://127.0.0.1:1/v1")
    finding = _model_endpoint(local)
    assert finding.level.value == "fail" and "unreachable" in finding.message
    assert "python -m producer mock-llm" in finding.message, finding.message
    remote = Settings(_env_file=None, llm_base_url="http://nosuch.invalid/v1")
    assert "mock-llm" not in _model_endpoint(remote).message


def test_a_dry_run_in_batch_mode_is_priced_at_the_batch_discount(env, capsys):
    """enqueue/run --batch --dry-run price what batch mode will reserve and book: every rate at
    LLM_BATCH_DISCOUNT (a newcomer saw the full price and a budget verdict batch mode
    contradicted)."""
    import json as _json

    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 20), ("b", 35)])
    prices = {"LLM_PRICE_PROMPT_PER_MTOK": "0.15", "LLM_PRICE_COMPLETION_PER_MTOK": "0.60",
              "LLM_BATCH_DISCOUNT": "0.5"}
    runs = {}
    for mode in ("--no-batch", "--batch"):
        code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", "--json", mode, **prices)
        assert code == 0, stdout
        runs[mode] = _json.loads(stdout)
    sync, batch = runs["--no-batch"], runs["--batch"]
    assert (sync["mode"], batch["mode"]) == ("sync", "batch")
    assert batch["calls"] == sync["calls"] and batch["worst_usd"] > 0
    assert batch["worst_usd"] == pytest.approx(sync["worst_usd"] * 0.5, rel=1e-3)
    assert batch["expected_usd"] == pytest.approx(sync["expected_usd"] * 0.5, rel=1e-3)
    budget = (batch["worst_usd"] + sync["worst_usd"]) / 2  # fits batch's worst case only
    code, stdout, _ = cli(capsys, "run", "ex", "--dry-run", "--batch",
                          "--budget-usd", f"{budget:.6f}", **prices)
    assert code == 0 and "in batch mode" in stdout and "fits even at worst case" in stdout, \
        stdout
    assert not (Path(env["DATABASE_URL"].removeprefix("sqlite:///"))).exists()


def test_status_says_what_ends_a_pause_by_its_code_not_its_text(env, capsys):
    store = _exam(env, [("a", 5)])
    # A budget's pause whose text does not start "budget:", and a provider's pause whose
    # text does: the code decides what status tells the user to do.
    assert store.pause_exam("ex", "nothing more fits in $1.00", PauseCode.budget)
    code, stdout, _ = cli(capsys, "status", "ex")
    assert code == 0 and "raise the budget with: python -m producer enqueue ex" in stdout
    store.resume("ex")
    assert store.pause_exam("ex", "budget: said the provider", PauseCode.provider)
    code, stdout, _ = cli(capsys, "status", "ex")
    assert code == 0 and "resume with: python -m producer resume ex" in stdout
    assert "raise the budget" not in stdout


def test_status_json_has_each_reason_as_a_code_beside_its_text(env, capsys):
    store = _exam(env, [("a", 5)])
    claim = store.claim("ex", "a", "w", 10.0, 8)
    store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="HTTP 503: busy")
    code, stdout, _ = cli(capsys, "status", "ex", "--json")
    chapter = json.loads(stdout)["chapter_list"][0]
    assert code == 0 and chapter["last_error_code"] == "transient"
    assert chapter["last_error"] == "transient: HTTP 503: busy"
    assert chapter["slices"][0]["last_error_code"] == "transient"
    code, stdout, _ = cli(capsys, "status", "ex")
    assert "transient: HTTP 503: busy" in stdout


def test_a_dry_run_counts_the_blind_solves_of_verify_and_their_cost(env, capsys):
    """VERIFY adds one blind solve per generation call, of its questions: --dry-run counts
    those calls, their tokens and cost, and its totals include them."""
    import json as _json

    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 20), ("b", 35)])
    prices = {"LLM_PRICE_PROMPT_PER_MTOK": "0.15", "LLM_PRICE_COMPLETION_PER_MTOK": "0.60"}
    runs = {}
    for mode in ("off", "replace"):
        code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", "--json", VERIFY=mode,
                              **prices)
        assert code == 0, stdout
        runs[mode] = _json.loads(stdout)
    off, on = runs["off"], runs["replace"]
    assert off["verify"] is None
    v = on["verify"]
    assert v["mode"] == "replace" and v["calls"] == on["calls"] == off["calls"]
    assert v["questions"] == on["questions"] == 55
    assert v["prompt_tokens"] > 0 and v["max_completion_tokens"] > 0 and v["worst_usd"] > 0
    # Each figure is rounded to 6 decimals on its own: the sum of two may be 1e-6 off.
    assert on["worst_usd"] == pytest.approx(off["worst_usd"] + v["worst_usd"], abs=1.5e-6)
    assert on["expected_usd"] == pytest.approx(off["expected_usd"] + v["expected_usd"],
                                               abs=1.5e-6)
    code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", VERIFY="flag",
                          VERIFY_MODEL="gpt-4o-mini", **prices)
    assert code == 0 and "blind solves (policy flag)" in stdout and "gpt-4o-mini" in stdout, \
        stdout


def test_verify_in_batch_mode_is_said_not_to_apply(env, capsys):
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 5)])
    code, stdout, stderr = cli(capsys, "enqueue", "ex", "--dry-run", "--batch", VERIFY="flag")
    assert code == 0, stdout
    assert "policy (flag) does not apply in batch mode" in stderr
    assert "blind solves" not in stdout
