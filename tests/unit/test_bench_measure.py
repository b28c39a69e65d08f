"""The benchmark's wait for an exam to finish (bench/measure.py): workers that stop finishing
chapters are reported at once, with where they are stuck, instead of at the deadline."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.measure import Stalled, wait_done


class _Probe:
    """Chapters finished, poll by poll (the last one stays); with `busy`, the slices still at
    work first, as the probe of examforge's own database reads them."""

    def __init__(self, counts: list[int], busy: list[int] | None = None) -> None:
        self.counts = counts
        self.busy = busy
        self.full_reads = 0

    def slices_busy(self, slug: str) -> int | None:
        if self.busy is None:
            return None
        return self.busy.pop(0) if len(self.busy) > 1 else self.busy[0]

    def chapters_finished(self, slug: str) -> int:
        self.full_reads += 1
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c",
                             "import time\ndef stuck_here():\n time.sleep(60)\nstuck_here()"])


@pytest.mark.slow
def test_a_stall_is_reported_long_before_the_deadline_with_the_stacks():
    proc = _sleeper()
    try:
        time.sleep(0.5)  # the interpreter is in stuck_here
        started = time.monotonic()
        with pytest.raises(Stalled) as info:
            wait_done(_Probe([0, 1, 1]), "demo", 3, timeout_s=300, procs=[proc], stall_s=0.5)
        assert time.monotonic() - started < 30
        assert "demo: 1 of 3 chapters finished, unchanged for 0 s" in str(info.value)
        assert "stuck_here" in str(info.value)  # py-spy's dump of the stuck process
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_progress_keeps_the_wait_going_and_the_end_returns():
    counts = [0] * 5 + [1] * 5 + [2] * 5 + [3]
    assert wait_done(_Probe(counts), "demo", 3, timeout_s=30, procs=[], poll_s=0.01,
                     stall_s=0.2) > 0


@pytest.mark.slow
def test_slices_at_work_are_the_progress_and_the_full_count_says_the_end():
    """No slice at work yet (the exam being enqueued) is not the end: the full count is read
    then, and only then; fewer slices at work keep the wait going; slices that stop moving
    are a stall."""
    probe = _Probe([0, 0, 3], busy=[0, 0, 9, 9, 8, 5, 5, 2, 1, 0])
    assert wait_done(probe, "demo", 3, timeout_s=30, procs=[], poll_s=0.01, stall_s=1) > 0
    assert probe.full_reads == 3  # two before the slices existed, one at the end
    proc = _sleeper()
    try:
        with pytest.raises(Stalled) as info:
            wait_done(_Probe([0], busy=[9, 4]), "demo", 3, timeout_s=300, procs=[proc],
                      stall_s=0.3)
        assert "demo: 4 slices at work, unchanged for 0 s" in str(info.value)
    finally:
        proc.kill()
        proc.wait()
