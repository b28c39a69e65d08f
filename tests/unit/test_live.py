"""The live view's words (producer/live.py): its ETA and its plain lines off a terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from producer.live import ETA_AFTER_S, LiveView, eta_s
from storage.report_types import ChapterCounts, ExamReport, Progress, UsageTotals


def report(done: int = 0, target: int = 600, *, state: str = "active", pending: int = 1,
           running: int = 1, cancelled: int = 0, last_minute: int = 0,
           elapsed_s: float | None = 30.0) -> ExamReport:
    return ExamReport(
        exam="ex", title="Ex", state=state, pause_reason=None,
        chapters=ChapterCounts(total=pending + running + cancelled + 1, pending=pending,
                               running=running, cancelled=cancelled),
        questions=Progress(target=target, done=done), usage=UsageTotals(), cost_usd=0.0,
        usage_by_endpoint={}, unpriced_calls={}, budget_usd=None, spent_usd=0.0,
        reserved_usd=0.0, chapter_list=[], started_at=1.0, elapsed_s=elapsed_s,
        questions_last_minute=last_minute)


def test_no_eta_once_nothing_more_will_come():
    # Cancelled (nothing pending or running) with questions stored in the last minute: the
    # old ETA divided what is left by that rate, as if the exam were still running.
    cancelled = report(100, state="active", pending=0, running=0, cancelled=2, last_minute=40)
    assert eta_s(cancelled) is None
    assert eta_s(report(100, state="paused", last_minute=40)) is None
    assert eta_s(report(600, pending=0, running=0, last_minute=40)) == 0.0


def test_no_eta_while_nothing_runs():
    # A `run` stopped by Ctrl-C: chapters pending, none running, no call in flight, and the
    # questions of the last minute still counted. Nothing will come until something runs.
    assert eta_s(report(100, pending=3, running=0, last_minute=40)) is None
    assert eta_s(report(100, pending=3, running=1, last_minute=40)) is not None


def test_eta_holds_steady_from_the_first_seconds():
    # A steady 2 questions a second from the first call: in the first minute the last minute
    # holds only what the elapsed seconds stored. Read as a full minute's count, the ETA fell
    # from 2.5 hours (at 2 s) to 4 minutes (at 59 s) for the same rate.
    def at(t: float) -> float | None:
        return eta_s(report(int(2 * t), last_minute=int(2 * min(t, 60)), elapsed_s=t))

    assert at(2) is None and at(ETA_AFTER_S - 1) is None  # too early to tell
    for t in (ETA_AFTER_S, 20, 30, 45, 59, 60, 120):
        left_s = (600 - 2 * t) / 2
        assert at(t) == pytest.approx(left_s, rel=0.05), t


def _plain_view() -> tuple[LiveView, io.StringIO]:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=100_000, soft_wrap=True)
    return LiveView(console, interval_s=5.0), buf


def test_the_last_line_is_not_printed_twice():
    # `run` shows the report at start and reads it again at the end: on an exam with nothing
    # left to do (a rerun of the demo), both say the same, and both were printed.
    view, buf = _plain_view()
    with view:
        view.show(report(600, pending=0, running=0))
        view.show(report(600, pending=0, running=0))  # a new object, the same words
    assert len(buf.getvalue().splitlines()) == 1, buf.getvalue()


def test_a_changed_last_state_is_still_printed_at_the_end():
    view, buf = _plain_view()
    with view:
        view.show(report(0))
        view.show(report(600, pending=0, running=0))  # within the interval: held back
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and "600/600" in lines[1], lines
