"""The prefork pool: a killed child's message is requeued (task_reject_on_worker_lost), and the
attempt cap in the database stops a chapter that kills its worker every time."""

from __future__ import annotations

import math
import os
import signal
import subprocess

import pytest

from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def test_prefork_completes_an_exam(deploy, mock):
    dep = deploy("sqlite")
    chapters = [(f"ch-{i}", 10) for i in range(4)]
    dep.syllabus("demo", chapters)
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    dep.worker(2, "-P", "prefork")  # the harness passes -P threads first; the last one wins
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 4, dump(report) + dep.worker_logs()
    assert mock.stats()["calls_total"] == 4 * math.ceil(10 / 5)
    assert_stored_exactly_once(dep, "demo", dict(chapters))


def test_a_chapter_that_kills_its_prefork_child_every_time_stops_at_the_attempt_cap(
        deploy, mock):
    mock.configure(latency_s=3.0)
    dep = deploy("sqlite", lease_s=2, max_attempts=3, reconcile_interval_s=1)
    dep.syllabus("demo", [("poison", 10)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    worker = dep.worker(1, "-P", "prefork")
    for attempt in range(1, 4):
        # At the provider, not only booked: a child killed between the booking and the
        # send has paid for nothing (a loaded machine made that the case once).
        wait_for(lambda: (r := dep.status("demo"))["chapter_list"][0]["attempts"] == attempt
                 and r["usage"]["calls_in_flight"] == 1 and mock.stats()["inflight"] == 1,
                 30, f"attempt {attempt} to call the model")
        for child in _children(worker.pid):
            os.kill(child, signal.SIGKILL)  # the "poison" takes the child down mid-call
    report = wait_for(lambda: (r := dep.status("demo"))["chapters"]["failed"] == 1 and r,
                      40, "the chapter to fail at its attempt cap")
    chapter = report["chapter_list"][0]
    assert chapter["last_error_code"] == "attempt_cap", chapter
    assert chapter["attempts"] == 3
    assert mock.stats()["calls_total"] == 3
    usage = report["usage"]
    assert (usage["calls_wasted"], usage["calls_in_flight"]) == (3, 0)  # each one explained
    assert worker.poll() is None  # the worker itself lives on
