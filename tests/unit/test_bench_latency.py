"""The `latency` part's summary of traced spans (bench/parts/latency.py): means over the middle
of the run, and over all of it when a short run under load has no task inside the middle."""

from __future__ import annotations

from bench.parts.latency import cycle_ms, summarise


def _task(thread: int, start: float, end: float) -> tuple[str, tuple[int, str, float, float, float]]:
    return ("p1", (thread, "task", start, end, 0.001))


def test_the_middle_of_a_long_run_leaves_its_edges_out():
    spans = [_task(t, i * 1.0, i * 1.0 + 0.9) for t in (1, 2) for i in range(10)]
    spans.append(("p1", (1, "claim", 0.0, 0.5, 0.001)))  # at the start: left out
    spans.append(("p1", (1, "claim", 5.0, 5.004, 0.001)))
    summary = summarise(spans)
    assert summary["steps"]["claim"]["n"] == 1
    assert abs(summary["steps"]["claim"]["wall_ms"] - 4) < 1e-6
    assert summary["tasks"] == 16  # 8 a thread inside the middle 80 %
    assert abs(summary["gap_ms"] - 100) < 1e-6
    assert abs(cycle_ms(summary) - 1000) < 1e-6


def test_a_short_run_with_no_task_inside_its_middle_is_measured_whole():
    # Two waves, each task as long as half the run: none lies inside the middle 80 %.
    spans = [_task(t, 0.0, 1.0) for t in (1, 2)] + [_task(t, 1.05, 2.1) for t in (1, 2)]
    summary = summarise(spans)
    assert summary["tasks"] == 4
    assert abs(summary["gap_ms"] - 50) < 1e-6
    assert cycle_ms(summary) is not None
