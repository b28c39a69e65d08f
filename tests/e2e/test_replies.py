"""Replies that never finish and replies that are too large, with real Redis, workers and beat
against the mock's `trickle` and `oversized` faults."""

from __future__ import annotations

import time

import pytest

from examforge.errors import ErrorKind
from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e


def test_a_reply_that_trickles_is_abandoned_at_the_deadline_and_an_oversized_one_re_asked(
        deploy, mock):
    # Formerly two tests, each with its own worker and beat: one exam now has a chapter for
    # each fault (and one without), and each chapter is checked as its test checked it.
    # The scenario: one chapter's first reply comes in 60 pieces, one a second.
    mock.configure(latency_s=0.05, trickle_pieces=60, trickle_interval_s=1.0,
                   oversized_bytes=16 * 1024 * 1024,
                   script={"exam/slow": ["trickle"], "exam/big": ["oversized"]})
    dep = deploy("sqlite", llm_timeout_s=5, reconcile_interval_s=1,
                 llm_max_reply_bytes=1024 * 1024)
    targets = {"slow": 10, "fast": 10, "big": 10}
    dep.syllabus("exam", list(targets.items()))
    assert dep.cli_in_process("enqueue", "exam").returncode == 0
    started = time.monotonic()
    worker = dep.worker(4)
    dep.beat()
    report = dep.wait_done("exam", 40)
    took = time.monotonic() - started
    assert report["chapters"]["done"] == 3, dump(report) + dep.worker_logs()
    assert took < 25, took  # the trickle alone would hold the chapter for 60 s
    assert_stored_exactly_once(dep, "exam", targets)
    wasted = {c["chapter_id"]: c for c in dep.calls("exam") if c["outcome"] == "wasted"}
    assert sorted(wasted) == ["big", "slow"], dump(wasted)
    abandoned = wasted["slow"]
    assert abandoned["reason"] == ErrorKind.deadline
    # The provider may bill the abandoned call: booked at its worst case, marked estimated.
    assert abandoned["usage_estimated"] and abandoned["prompt_tokens"] > 0
    # Abandoned means the connection was closed, not left to trickle on in the background.
    wait_for(lambda: mock.stats()["inflight"] == 0, 10, "the trickling connection to close")
    print(f"\nREPLIES trickle: chapter done {took:.1f}s after the workers started")
    # The oversized reply: refused, booked wasted, asked again; the worker is alive and well.
    assert wasted["big"]["reason"] == ErrorKind.reply_too_large, dump(wasted)
    assert worker.poll() is None
    used = [c for c in dep.calls("exam") if c["outcome"] == "used"]
    assert len([c for c in used if c["chapter_id"] == "big"]) == 2, dump(used)
