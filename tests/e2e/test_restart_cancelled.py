"""A cancelled exam is restarted from the command line as the HTTP API's new run restarts it:
`enqueue` (and `run`, its local form) put cancelled chapters back to work; `resume` and
`retry` leave them alone and say which command restarts them. Real CLI processes, the real
Redis queue; the mock's paid calls are counted."""

from __future__ import annotations

import pytest
import redis

pytestmark = pytest.mark.e2e


def test_enqueue_and_run_restart_a_cancelled_exam(deploy, mock):
    # On SQLite; the store's restart_cancelled runs on both databases in
    # tests/integration/test_store.py.
    dep = deploy()
    dep.syllabus("demo", [("a", 5), ("b", 5)])
    queue = redis.Redis.from_url(dep.env["BROKER_URL"])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    assert dep.cli_in_process("cancel", "demo").stdout.strip() == "cancelled 2 chapters of demo"
    queue.delete(dep.env["TASK_QUEUE"])  # no worker took them; cancelled, they do nothing

    resumed = dep.cli_in_process("resume", "demo")
    assert resumed.returncode == 0, resumed.stderr
    assert "0 chapters enqueued" in resumed.stdout
    assert "2 chapters of demo cancelled, left as they are; restart them with: python -m " \
        "producer enqueue demo" in resumed.stdout, resumed.stdout
    assert queue.llen(dep.env["TASK_QUEUE"]) == 0

    dry = dep.cli_in_process("enqueue", "demo", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "cancelled chapters: 2 (a, b), restarted by this command" in dry.stdout, dry.stdout
    assert "questions to generate: 10 in 2 of 2 chapters" in dry.stdout, dry.stdout
    assert dep.status("demo")["chapters"]["cancelled"] == 2  # a dry run changes nothing

    enqueued = dep.cli_in_process("enqueue", "demo")
    assert enqueued.returncode == 0, enqueued.stderr
    assert "restarted demo/a (was cancelled)" in enqueued.stdout
    assert "2 enqueued, 0 skipped" in enqueued.stdout, enqueued.stdout
    assert queue.llen(dep.env["TASK_QUEUE"]) == 2
    assert dep.status("demo")["chapters"]["pending"] == 2

    # `run`, the same without a broker: cancel again, and run generates the exam.
    assert dep.cli_in_process("cancel", "demo").returncode == 0
    ran = dep.cli_in_process("run", "demo")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "restarted demo/b (was cancelled)" in ran.stderr
    report = dep.status("demo")
    assert report["questions"]["done"] == 10 and report["chapters"]["done"] == 2
    assert mock.stats()["calls_total"] == 2  # 5 questions a call: one call per chapter
