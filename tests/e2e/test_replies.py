"""Replies that never finish and replies that are too large, with real Redis, workers and beat
against the mock's `trickle` and `oversized` faults."""

from __future__ import annotations

import time

import pytest

from examforge.errors import ErrorKind
from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e


def test_a_reply_that_trickles_is_abandoned_at_the_deadline_and_the_chapter_finishes(deploy,
                                                                                      mock):
    # The scenario: one chapter's first reply comes in 60 pieces, one a second.
    mock.configure(latency_s=0.05, trickle_pieces=60, trickle_interval_s=1.0,
                   script={"exam/slow": ["trickle"]})
    dep = deploy("sqlite", llm_timeout_s=5, reconcile_interval_s=1)
    dep.syllabus("exam", [("slow", 10), ("fast", 10)])
    assert dep.cli_in_process("enqueue", "exam").returncode == 0
    started = time.monotonic()
    dep.worker(4)
    dep.beat()
    report = dep.wait_done("exam", 40)
    took = time.monotonic() - started
    assert report["chapters"]["done"] == 2, dump(report)
    assert took < 25, took  # the trickle alone would hold the chapter for 60 s
    assert_stored_exactly_once(dep, "exam", {"slow": 10, "fast": 10})
    abandoned = [c for c in dep.calls("exam") if c["outcome"] == "wasted"]
    assert len(abandoned) == 1 and abandoned[0]["chapter_id"] == "slow", dump(abandoned)
    assert abandoned[0]["reason"] == ErrorKind.deadline
    # The provider may bill the abandoned call: booked at its worst case, marked estimated.
    assert abandoned[0]["usage_estimated"] and abandoned[0]["prompt_tokens"] > 0
    # Abandoned means the connection was closed, not left to trickle on in the background.
    wait_for(lambda: mock.stats()["inflight"] == 0, 10, "the trickling connection to close")
    print(f"\nREPLIES trickle: chapter done {took:.1f}s after the workers started")


def test_an_oversized_reply_is_refused_and_re_asked(deploy, mock):
    mock.configure(latency_s=0.05, oversized_bytes=16 * 1024 * 1024,
                   script={"exam/big": ["oversized"]})
    dep = deploy("sqlite", llm_max_reply_bytes=1024 * 1024)
    dep.syllabus("exam", [("big", 10)])
    assert dep.cli_in_process("enqueue", "exam").returncode == 0
    worker = dep.worker(2)
    dep.beat()
    report = dep.wait_done("exam", 40)
    assert report["chapters"]["done"] == 1, dump(report) + dep.worker_logs()
    assert worker.poll() is None  # the worker is alive and well
    wasted = [c for c in dep.calls("exam") if c["outcome"] == "wasted"]
    assert len(wasted) == 1 and wasted[0]["reason"] == ErrorKind.reply_too_large, dump(wasted)
    assert report["usage"]["calls_used"] == 2
    assert_stored_exactly_once(dep, "exam", {"big": 10})
