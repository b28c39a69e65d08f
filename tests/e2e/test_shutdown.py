"""SIGTERM: running calls finish and commit, the rest is handed back; nothing lost or repeated."""

from __future__ import annotations

import math
import signal
import time

import pytest

from storage.models import CallReason
from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e


def test_sigterm_finishes_running_calls_and_hands_chapters_back(deploy, mock):
    mock.configure(latency_s=1.0)
    # A 10 s deadline for 1 s calls: on a loaded machine a reply slowed past the usual 3 s is
    # retried, and the test counts every paid call.
    dep = deploy("sqlite", worker_soft_shutdown_s=20, llm_timeout_s=10)
    chapters = [(f"ch-{i}", 30) for i in range(4)]
    dep.syllabus("demo", chapters)
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    first = dep.worker(4)
    wait_for(lambda: dep.status("demo")["usage"]["calls_in_flight"] == 4
             and dep.status("demo")["questions"]["done"] >= 10, 60, "four calls in flight")
    started = time.monotonic()
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    took = time.monotonic() - started
    assert took < 15, f"warm shutdown took {took:.1f}s"
    report = dep.status("demo")
    usage = report["usage"]
    # Every call that was running finished and was committed: nothing in flight, nothing wasted.
    assert usage["calls_in_flight"] == 0 and usage["calls_wasted"] == 0, dump(report)
    assert report["chapters"]["running"] == 0
    assert report["chapters"]["done"] < 4
    dep.worker(4)
    report = dep.wait_done("demo", 90)
    assert report["chapters"]["done"] == 4, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "demo", dict(chapters))
    needed = 4 * math.ceil(30 / 5)
    # Paid once each: the mock's count, and the ledger's calls sent. A next call recorded by
    # a commit just before the stop and never sent is booked as such (failed, "not sent:
    # stopping"): a row, not a payment (seen under load: 25 rows for 24 calls).
    usage = report["usage"]
    assert mock.stats()["calls_total"] == needed, dump(report)
    assert usage["calls_used"] + usage["calls_wasted"] == needed, dump(report)
    assert usage["calls"] - usage["calls_failed"] == needed, dump(report)


def test_a_call_outliving_the_window_escalates_to_a_cold_shutdown(deploy, mock):
    mock.configure(latency_s=30.0)
    dep = deploy("sqlite", worker_soft_shutdown_s=1, llm_timeout_s=60)
    dep.syllabus("demo", [("slow", 5)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    first = dep.worker(2)
    # In flight at the provider, not only booked: a call booked and not yet sent when the
    # signal comes is never sent (a loaded machine made that the case once).
    wait_for(lambda: dep.status("demo")["usage"]["calls_in_flight"] == 1
             and mock.stats()["inflight"] == 1, 30, "a call in flight")
    started = time.monotonic()
    first.send_signal(signal.SIGTERM)
    first.wait(30)
    assert time.monotonic() - started < 15  # the 1 s window, then cold: not the 30 s call
    mock.configure(latency_s=0.05)
    dep.worker(2)
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 1, dump(report) + dep.worker_logs()
    calls = dep.calls("demo")
    wasted = [c for c in calls if c["outcome"] == "wasted"]
    assert len(wasted) == 1 and wasted[0]["reason"] == CallReason.crash_before_commit
    assert_stored_exactly_once(dep, "demo", {"slow": 5})
