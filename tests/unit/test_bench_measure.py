"""The benchmark's wait for an exam to finish (bench/measure.py): workers that stop finishing
chapters are reported at once, with where they are stuck, instead of at the deadline."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.measure import Stalled, wait_done


class _Probe:
    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    def chapters_finished(self, slug: str) -> int:
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
        assert "1/3 chapters finished and none for 0 s" in str(info.value)
        assert "stuck_here" in str(info.value)  # py-spy's dump of the stuck process
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_progress_keeps_the_wait_going_and_the_end_returns():
    counts = [0] * 5 + [1] * 5 + [2] * 5 + [3]
    assert wait_done(_Probe(counts), "demo", 3, timeout_s=30, procs=[], poll_s=0.01,
                     stall_s=0.2) > 0
