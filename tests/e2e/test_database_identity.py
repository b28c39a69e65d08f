"""A producer and a worker on different databases (a relative sqlite:///examforge.db read from
two directories): the worker says so, naming both, and leaves the message for a worker on
the producer's database, which then does the work. Real worker processes, the real Redis."""

from __future__ import annotations

import signal

import pytest
import redis

from helpers import wait_for

pytestmark = pytest.mark.e2e


def test_a_worker_on_another_database_leaves_the_message_and_says_so(deploy, mock, tmp_path):
    dep = deploy()
    dep.syllabus("demo", [("a", 5)])
    other = tmp_path / "elsewhere" / "examforge.db"
    other.parent.mkdir()
    wrong = dep.worker(2, DATABASE_URL=f"sqlite:///{other}")
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    mine = dep.store.database_id()
    log = dep.workdir / "worker-0.log"
    wait_for(lambda: "task from another database" in (log.read_text() if log.exists() else ""),
             60, "the wrong worker's warning")
    line = next(ln for ln in log.read_text().splitlines() if "task from another database" in ln)
    assert f"id {mine}" in line and str(dep.workdir / "examforge.db") in line, line
    assert str(other) in line, line
    assert mock.stats()["calls_total"] == 0
    assert dep.status("demo")["chapters"]["pending"] == 1

    # Stopped as operators stop a worker: the message goes back to the broker (warm shutdown
    # hands it back), where a worker on the right database takes it.
    dep.kill(wrong, signal.SIGTERM)
    dep.worker(2)
    report = dep.wait_done("demo", timeout_s=90)
    assert report["chapters"]["done"] == 1 and mock.stats()["calls_total"] == 1

    doctor = dep.cli("doctor")
    assert f"database id {mine}" in doctor.stdout, doctor.stdout
    assert redis.Redis.from_url(dep.env["BROKER_URL"]).llen(dep.env["TASK_QUEUE"]) == 0
