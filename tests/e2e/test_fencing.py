"""Fencing and clocks: a frozen worker cannot commit late, and skewed worker clocks do not
matter because every lease is compared on the database's clock."""

from __future__ import annotations

import glob
import math
import os
import signal

import pytest

from storage.models import CallReason
from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e


def test_a_worker_frozen_past_its_lease_cannot_commit_when_thawed(deploy, mock):
    mock.configure(latency_s=1.5)
    dep = deploy("sqlite", lease_s=3, reconcile_interval_s=1)
    dep.syllabus("demo", [("only", 25)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    frozen = dep.worker(1)
    wait_for(lambda: dep.status("demo")["questions"]["done"] >= 5
             and dep.status("demo")["usage"]["calls_in_flight"] == 1, 30, "a call in flight")
    frozen.send_signal(signal.SIGSTOP)
    frozen_call = [c for c in dep.calls("demo") if c["outcome"] == "in_flight"][0]
    mock.configure(latency_s=0.05)
    dep.worker(2)
    dep.beat()
    try:
        report = dep.wait_done("demo", 60)  # taken over and finished while the first sleeps
    finally:
        frozen.send_signal(signal.SIGCONT)
    assert report["chapters"]["done"] == 1
    # The thawed worker's reply arrives now; its commit must change nothing.
    wait_for(lambda: next(c for c in dep.calls("demo") if c["id"] == frozen_call["id"])
             ["reason"] == CallReason.lease_lost, 30, "the late call to be recorded as lost")
    late = next(c for c in dep.calls("demo") if c["id"] == frozen_call["id"])
    assert late["outcome"] == "wasted" and late["completion_tokens"] > 0, late
    assert_stored_exactly_once(dep, "demo", {"only": 25})
    calls = dep.calls("demo")
    assert [c["id"] for c in calls if c["outcome"] == "wasted"] == [frozen_call["id"]]
    assert mock.stats()["max_inflight_by_chapter"]["demo/only"] <= 2  # frozen + the new holder


def _faketime() -> str:
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not found:
        message = "libfaketime is not installed (apt-get install faketime)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


def test_workers_with_skewed_clocks_never_steal_each_others_live_leases(deploy, mock):
    """On PostgreSQL: SQLite has no server clock (each process reads its own), and it is a
    one-machine database, where all processes share the machine's clock anyway."""
    lib = _faketime()
    mock.configure(latency_s=0.4)
    dep = deploy("postgres", lease_s=3)
    chapters = [(f"ch-{i}", 20) for i in range(6)]
    dep.syllabus("demo", chapters)
    for skew in ("+1h", "-1h"):
        dep.worker(3, LD_PRELOAD=lib, FAKETIME=skew, FAKETIME_DONT_FAKE_MONOTONIC="1")
    for _ in range(3):  # every chapter delivered three times: both workers contend for each
        assert dep.cli_in_process("enqueue", "demo").returncode == 0
    report = dep.wait_done("demo", 90)
    assert report["chapters"]["done"] == 6, dump(report) + dep.worker_logs()
    stats = mock.stats()
    assert max(stats["max_inflight_by_chapter"].values()) == 1, dump(stats)
    assert stats["calls_total"] == 6 * math.ceil(20 / 5), dump([(c["chapter_id"], c["outcome"], c["reason"], c["worker"]) for c in dep.calls("demo")])
    assert report["usage"]["calls_wasted"] == 0
    assert_stored_exactly_once(dep, "demo", dict(chapters))
