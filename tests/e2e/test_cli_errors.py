"""Bad input: one clear line on stderr, a non-zero exit, no traceback, nothing written or
enqueued. Runs the real CLI in a subprocess; where a test gives the same mistake to several
commands, the ones after the first that never reach the broker (status, export) run the same
CLI in this process (Deployment.cli_in_process): the real process's exit code and stderr are
checked by the first."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis

pytestmark = pytest.mark.e2e

GOOD = {"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 5}]}


def _write(dep, slug, content: bytes | str | dict) -> None:
    folder = dep.workdir / "exams" / slug
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content)
    data = content.encode() if isinstance(content, str) else content
    (folder / "syllabus.json").write_bytes(data)


def _assert_refused(dep, result, *needles: str, code: int = 2) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    queue = redis.Redis.from_url(dep.env["BROKER_URL"])
    assert queue.llen(dep.env["TASK_QUEUE"]) == 0
    if dep.store.exam_exists("bad") or dep.store.exam_exists("exam"):
        pytest.fail("an exam row was written for refused input")


def test_a_bad_syllabus_is_refused_by_the_real_process(deploy):
    # One case in a real process (its exit code and stderr as a shell sees them); every kind
    # of bad syllabus and slug is refused in-process by tests/unit/test_cli_refusals.py.
    dep = deploy()
    _write(dep, "exam", '{"title": "T", "chapters": [')
    _assert_refused(dep, dep.cli("enqueue", "exam"), "syllabus.json", "malformed JSON")
    _assert_refused(dep, dep.cli("enqueue", "--", "../etc"))


def test_broker_down_fails_fast_and_writes_nothing(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    started = time.monotonic()
    result = dep.cli("enqueue", "exam", BROKER_URL="redis://127.0.0.1:1/0")
    assert time.monotonic() - started < 15
    _assert_refused(dep, result, "broker", "unreachable", code=3)


def test_unreachable_database_is_one_line(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    for i, command in enumerate((["enqueue", "exam"], ["status", "exam"], ["export", "exam"])):
        result = (dep.cli if i == 0 else dep.cli_in_process)(
            *command, DATABASE_URL="postgresql://postgres@127.0.0.1:1/none")
        _assert_refused(dep, result, "database", "unreachable", code=3)


def test_a_database_that_does_not_exist_is_a_configuration_error_not_an_outage(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    for command in (["enqueue", "exam"], ["enqueue", "exam", "--dry-run"], ["status", "exam"]):
        result = (dep.cli if command[0] == "enqueue" else dep.cli_in_process)(
            *command, DATABASE_URL="postgresql://postgres@127.0.0.1:5432/nope")
        _assert_refused(dep, result, "DATABASE_URL", 'database "nope" does not exist', code=2)


def test_a_broker_url_that_is_no_broker_is_a_configuration_error(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    result = dep.cli("enqueue", "exam", BROKER_URL="http://localhost")
    _assert_refused(dep, result, "BROKER_URL", "http://", "redis://", code=2)


def test_an_unsupported_database_driver_is_one_line(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    for i, url in enumerate(("mysql://x@localhost/db",
                             "postgresql+asyncpg://postgres@127.0.0.1/db")):
        result = (dep.cli if i == 0 else dep.cli_in_process)("status", "exam", DATABASE_URL=url)
        _assert_refused(dep, result, "DATABASE_URL", "sqlite:///PATH", code=2)


def test_a_sqlite_url_with_two_slashes_is_one_line(deploy):
    # SQLAlchemy reads sqlite://examforge.db as a host and raises "Invalid SQLite URL" with a
    # traceback on first use.
    dep = deploy()
    _write(dep, "exam", GOOD)
    for command in (["status", "exam"], ["enqueue", "exam"]):
        result = (dep.cli_in_process if command[0] == "status" else dep.cli)(
            *command, DATABASE_URL="sqlite://examforge.db")
        _assert_refused(dep, result, "DATABASE_URL", "sqlite://examforge.db",
                        "sqlite:///relative.db", code=2)


def test_invalid_setting_is_one_line(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    result = dep.cli("enqueue", "exam", QUESTIONS_PER_CALL="lots")
    _assert_refused(dep, result, "QUESTIONS_PER_CALL")


def test_a_model_url_without_a_scheme_is_one_line(deploy):
    dep = deploy()
    _write(dep, "exam", GOOD)
    result = dep.cli("enqueue", "exam", LLM_BASE_URL="localhost:8089/v1")
    _assert_refused(dep, result, "LLM_BASE_URL", "http://")


@pytest.mark.parametrize("command", [["worker", "-P", "threads"], ["beat"]])
def test_a_worker_or_beat_with_an_invalid_setting_exits_with_one_line(deploy, command):
    # Celery would otherwise print "Unable to load celery application" and a traceback.
    dep = deploy()
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", *command],
        cwd=dep.workdir, env={**dep.env, "LEASE_S": "1", "HEARTBEAT_S": "5"},
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert len(output.splitlines()) == 1 and output.startswith("error: environment/.env: "), output
    assert "HEARTBEAT_S must be at most LEASE_S / 4" in output


@pytest.mark.parametrize("setting", [
    {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/nope"},
    {"DATABASE_URL": "mysql://x@localhost/db"},
    {"BROKER_URL": "http://localhost"},
    {"DATABASE_URL": "sqlite://examforge.db"},
], ids=["no-such-database", "mysql", "http-broker", "sqlite-two-slashes"])
def test_a_worker_with_a_configuration_mistake_exits_with_one_line(deploy, setting):
    dep = deploy()
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "threads"],
        cwd=dep.workdir, env={**dep.env, **setting}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    # Celery may warn about running as root first; ours is the one error line, and the last.
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and output.strip().splitlines()[-1] == errors[0], output
    assert next(iter(setting)) in errors[0]


def test_a_worker_started_while_its_database_is_down_keeps_running(deploy):
    # An outage is not a configuration mistake: the worker waits for the database.
    dep = deploy()
    proc = dep.worker(1, DATABASE_URL="postgresql://postgres@127.0.0.1:1/none")
    log = dep.workdir / "worker-0.log"
    deadline = time.monotonic() + 60
    while "ready." not in (log.read_text() if log.exists() else "") and proc.poll() is None:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert proc.poll() is None, log.read_text()
    assert "unreachable" in log.read_text()


def test_status_and_export_of_an_unknown_exam(deploy):
    dep = deploy()
    dep.store  # the schema (status and export never create one)
    _assert_refused(dep, dep.cli("status", "ghost", "--json"), "ghost")
    _assert_refused(dep, dep.cli_in_process("export", "ghost"), "ghost")


def test_enqueue_of_a_paused_exam_points_to_resume(deploy, mock):
    mock.configure(api_key="sk-right")
    dep = deploy()
    dep.syllabus("demo", [("a", 5), ("b", 5)])
    # 401: the chapter fails and the exam pauses; a pause is exit 5 (producer.exits)
    assert dep.cli("run", "demo").returncode == 5
    result = dep.cli("enqueue", "demo")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if "resume demo" in line]
    assert "0 enqueued" in result.stdout


def test_doctor_fails_on_a_key_the_model_endpoint_rejects(deploy, mock):
    # /v1/models checks the key, as OpenAI's does: a doctor that said "reachable" would send
    # a newcomer to enqueue an exam whose every call then fails with 401.
    mock.configure(api_key="sk-right")
    dep = deploy()
    assert dep.cli("migrate").returncode == 0
    doctor = dep.cli("doctor")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "fail model endpoint:" in doctor.stdout and "rejected LLM_API_KEY (HTTP 401)" in \
        doctor.stdout, doctor.stdout
    right = dep.cli("doctor", LLM_API_KEY="sk-right")
    assert "ok   model endpoint:" in right.stdout, right.stdout


def test_run_against_an_endpoint_that_refuses_every_connection_pauses_and_says_why_once(deploy):
    from services import free_port

    port = free_port()  # nothing listens there: every connection is refused at once
    dep = deploy("sqlite", llm_base_url=f"http://127.0.0.1:{port}/v1",
                 llm_unreachable_pause_s=2)
    dep.syllabus("exam", [("a", 10), ("b", 10)])
    run = dep.cli("run", "exam", timeout=120)
    assert run.returncode == 5, (run.returncode, run.stdout, run.stderr)  # paused
    assert "Traceback" not in run.stderr + run.stdout
    said = [line for line in run.stderr.splitlines() if line.startswith("paused: ")]
    assert len(said) == 1, run.stderr
    assert f"http://127.0.0.1:{port}/v1" in said[0] and "refused or dropped every" in said[0]
    assert "python -m producer resume exam" in said[0]
    status = dep.status("exam")
    assert status["state"] == "paused" and status["pause_code"] == "unreachable", status
    assert status["cost_usd"] == 0 and status["usage"]["calls_in_flight"] == 0
    # The endpoint fixed (here: the mock), `resume` as the line says, then the same `run`:
    # the exam finishes, and the provider is paid for exactly the calls it needs.
    fixed = {"LLM_BASE_URL": dep.mock.base_url}
    resumed = dep.cli("resume", "exam", **fixed)
    assert resumed.returncode == 0, resumed.stderr
    assert dep.status("exam")["state"] != "paused"
    run = dep.cli("run", "exam", timeout=120, **fixed)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    status = dep.status("exam")
    assert status["questions"]["done"] == 20 and status["pause_code"] is None, status
    assert dep.mock.stats()["calls_total"] == 4  # 20 questions, 5 a call
