"""The live view of a run: `status --watch` and `producer run`. It reads only the database
(`Store.status`), so it can run anywhere, beside any number of workers. On a terminal it
redraws in place (rich's Live); anywhere else it prints one plain line per refresh, for CI
logs and `| tee`."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from producer.words import duration
from storage.report_types import ExamReport, waiting_text


def _clock(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M:%S")


# No ETA before the exam has run this long: its first batches land together, and a rate read
# from one or two of them would swing the ETA from hours to seconds and back.
ETA_AFTER_S = 15.0


def eta_s(report: ExamReport) -> float | None:
    """Time left at the rate of the last minute (of the time since the first call, in the
    first minute: a count over 20 s is not a rate per 60 s); None while too young to tell
    (ETA_AFTER_S), when nothing was stored in that window, and when nothing more will come
    (the exam is cancelled, failed or paused: no work is pending or running, or none is sent),
    and while nothing runs at all."""
    left = report.questions.target - report.questions.done
    if left <= 0:
        return 0.0
    if report.finished or report.state == "paused" or report.questions_last_minute <= 0:
        return None
    if not report.chapters.running and not report.usage.calls_in_flight:
        return None  # nothing runs (a `run` stopped by Ctrl-C, no worker): no time to tell
    if report.elapsed_s is None or report.elapsed_s < ETA_AFTER_S:
        return None
    return left / (report.questions_last_minute / min(60.0, report.elapsed_s))


def _money(report: ExamReport) -> str:
    text = f"${report.cost_usd:.4f}"
    if report.budget_usd is not None:
        text += f" of ${report.budget_usd:.4f} budget (reserved ${report.reserved_usd:.4f})"
    return text


def _endpoints(report: ExamReport) -> str:
    """Calls by the endpoint that served them (none yet: in flight, or no reply came)."""
    return ", ".join(f"{name if name != 'unknown' else 'none yet'} {e.calls}"
                     for name, e in sorted(report.usage_by_endpoint.items())) or "-"


def plain_line(report: ExamReport) -> str:
    """One line of the view, for output that is not a terminal."""
    q, ch, u = report.questions, report.chapters, report.usage
    pct = 100.0 * q.done / q.target if q.target else 100.0
    eta = eta_s(report)
    return (f"{_clock(time.time())} {report.exam} {report.state}: {q.done}/{q.target} questions "
            f"({pct:.0f}%); chapters {ch.done}/{ch.total} done, {ch.running} running, "
            f"{ch.pending} pending, {ch.failed} failed, {ch.cancelled} cancelled; "
            f"{report.questions_last_minute}/min, ETA {duration(eta) if eta is not None else '-'}"
            f"; calls {u.calls_used} used, {u.calls_wasted} wasted, {u.calls_failed} failed"
            f"{_last_cause(report)}, "
            f"{u.calls_in_flight} in flight; tokens {u.prompt_tokens}+{u.completion_tokens}; "
            f"{_money(report)}; elapsed {duration(report.elapsed_s)}"
            + "".join(f"; {text}" for text in _waiting(report)))


def _last_cause(report: ExamReport) -> str:
    """Why the latest call that went wrong did, for the plain line: " (last: connection:
    ConnectError ...)", or nothing."""
    if not report.usage.calls_failed or not report.recent_errors:
        return ""
    last = report.recent_errors[0]
    why = f"{last.reason or ''}: {last.detail or ''}".strip(": ")
    return f" (last: {why[:80]})" if why else ""


def _waiting(report: ExamReport) -> list[str]:
    """What the exam's live provider batches are doing (batch mode): a run that waits on one
    for hours says so instead of looking stuck."""
    return [waiting_text(b) for b in reversed(report.batches) if b.live]


def render(report: ExamReport) -> RenderableType:
    """The view on a terminal."""
    q, ch, u = report.questions, report.chapters, report.usage
    title = Text(f"{report.title} ({report.exam}) — {report.state}", style="bold")
    if report.state == "paused":
        title.append(f": {report.pause_reason}", style="red")
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(q.target, 1), completed=q.done, width=50,
                            complete_style="green", finished_style="bold green"),
                f"{q.done}/{q.target} questions")
    eta = eta_s(report)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim")
    facts.add_column()
    facts.add_row("chapters", f"{ch.done}/{ch.total} done, {ch.running} running, "
                              f"{ch.pending} pending, {ch.failed} failed, "
                              f"{ch.cancelled} cancelled")
    facts.add_row("rate", f"{report.questions_last_minute} questions in the last minute; "
                          f"ETA {duration(eta) if eta is not None else '-'}")
    facts.add_row("calls", f"{u.calls_used} used, {u.calls_wasted} wasted, {u.calls_failed} "
                           f"failed, {u.calls_in_flight} in flight")
    facts.add_row("tokens", f"{u.prompt_tokens} prompt + {u.completion_tokens} completion")
    facts.add_row("cost", _money(report))
    facts.add_row("endpoints", _endpoints(report))
    for text in _waiting(report):
        facts.add_row("batch", text)
    facts.add_row("time", f"started {_clock(report.started_at)}, "
                          f"elapsed {duration(report.elapsed_s)}"
                  + (f", finished {_clock(report.finished_at)}" if report.finished_at else ""))
    parts: list[RenderableType] = [title, bar, facts]
    if report.recent_errors:
        errors = Table(title="last errors", title_justify="left", show_edge=False, box=None)
        for col, width in (("time", 8), ("chapter", 14), ("slice", 5), ("outcome", 7)):
            errors.add_column(col, style="dim" if col == "time" else None, no_wrap=True,
                              min_width=width)
        errors.add_column("why", no_wrap=True, overflow="ellipsis", max_width=60)
        for e in report.recent_errors:
            why = f"{e.reason or ''}: {e.detail or ''}".strip(": ")
            errors.add_row(_clock(e.at), e.chapter, str(e.slice), e.outcome,
                           why if len(why) <= 90 else why[:89] + "…")
        parts.append(errors)
    return Group(*parts)


class LiveView:
    """The view as a context manager: `show(report)` redraws it on a terminal, or prints a
    plain line at most every `interval_s` elsewhere (and always the last one, on exit)."""

    def __init__(self, console: Console, interval_s: float = 2.0) -> None:
        self.console = console
        self.interval_s = interval_s
        self._live: Live | None = None
        self._printed_at = 0.0
        self._last: ExamReport | None = None
        self._last_printed: str | None = None  # the last line printed, without its clock

    def __enter__(self) -> "LiveView":
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def due(self) -> bool:
        """Whether `show` would draw now (so a caller reads the database only then)."""
        period = 0.5 if self._live is not None else self.interval_s
        return time.monotonic() - self._printed_at >= period

    def show(self, report: ExamReport) -> None:
        self._last = report
        if self._live is not None:
            self._live.update(render(report))
            self._printed_at = time.monotonic()
            return
        if time.monotonic() - self._printed_at >= self.interval_s:
            self._print(report)

    def _print(self, report: ExamReport) -> None:
        line = plain_line(report)
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self._printed_at = time.monotonic()
        self._last_printed = line.split(" ", 1)[1]

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
        elif self._last is not None and \
                plain_line(self._last).split(" ", 1)[1] != self._last_printed:
            # The last state, unless the last line said it already (`run` reads the report
            # again once its work is over: a fresh object, the same words).
            self._print(self._last)


def watch(read: Callable[[], ExamReport], console: Console, interval_s: float,
          until: Callable[[ExamReport], bool] | None = None) -> ExamReport:
    """Show `read()` every `interval_s` until `until(report)` (by default: no chapter is
    pending or running); returns the last report."""
    until = until or (lambda r: r.finished)
    with LiveView(console, interval_s=0) as view:
        report = read()
        view.show(report)
        while not until(report):
            time.sleep(interval_s)
            report = read()
            view.show(report)
    return report
