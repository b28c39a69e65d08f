"""GET /metrics: Prometheus metrics read from the database.

Read from the database rather than counted in the process: the database is the record, so
every replica serves the same figures, and a restart loses nothing.

What a scrape costs follows the work in progress, not the history (issue 19: at 10,000
finished exams, reading every exam's slices and ledger and formatting 70,000 samples with
prometheus_client took 32 s, past Prometheus's 10 s timeout). Each replica keeps every
exam's figures, aggregated in SQL, and at each scrape re-reads only the exams that may have
moved: those with work left or a call in flight (the partial indexes), those that had at the
last scrape (they may have finished since), those whose own row changed or that are new; a
deleted exam is dropped. The first full read starts with the server (a thread of its own).
Whatever else could change a finished exam (a late reply re-booking a call settled as
crashed, a lowered target) shows at the next full read, which runs in the background every
`refresh_s`, while scrapes go on being served. The text is written here, in the exposition
format prometheus_client writes, each exam's samples once when it is read.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from prometheus_client.utils import floatToGoString

from storage.report_types import ExamStatus, ExamSummary

if TYPE_CHECKING:
    from storage import Store

log = logging.getLogger("examforge.api")
EXAM_STATES = [s.value for s in ExamStatus]
# How often every exam's figures are read again in full, seconds (the background read).
FULL_REFRESH_S = 300.0
CHUNK = 500  # exams per read of the ones that moved


# The per-exam families, in the order they are written: (name, type, help).
FAMILIES = (
    ("examforge_exam_state", "gauge", "1 for the exam's current state."),
    ("examforge_exam_questions_stored", "gauge",
     "Questions stored, up to each chapter's target."),
    ("examforge_exam_questions_target", "gauge", "Questions the syllabus asks for."),
    ("examforge_exam_calls_total", "counter", "Model calls by outcome."),
    ("examforge_exam_tokens_total", "counter", "Tokens of the model calls."),
    ("examforge_exam_cost_usd_total", "counter", "What the model calls cost, USD."),
)


@dataclass
class ExamFigures:
    summary: ExamSummary
    # outcome -> calls; and the exam's tokens and cost over every outcome
    calls: dict[str, int] = field(default_factory=dict)
    prompt: int = 0
    completion: int = 0
    cost: float = 0.0
    read_at: float = 0.0  # time.monotonic() when read
    # Its samples, one string per family of FAMILIES ("" for none), written when read: a
    # scrape only joins them.
    lines: tuple[str, ...] = ()

    def write(self) -> None:
        e, g, s = _label(self.summary.exam), floatToGoString, self.summary
        billed = bool(self.calls)
        self.lines = (
            f'examforge_exam_state{{exam="{e}",state="{s.state}"}} 1.0',
            f'examforge_exam_questions_stored{{exam="{e}"}} {g(s.questions.done)}',
            f'examforge_exam_questions_target{{exam="{e}"}} {g(s.questions.target)}',
            "\n".join(f'examforge_exam_calls_total{{exam="{e}",outcome="{_label(o)}"}} {g(n)}'
                      for o, n in sorted(self.calls.items())),
            (f'examforge_exam_tokens_total{{exam="{e}",kind="prompt"}} {g(self.prompt)}\n'
             f'examforge_exam_tokens_total{{exam="{e}",kind="completion"}} '
             f'{g(self.completion)}') if billed else "",
            f'examforge_exam_cost_usd_total{{exam="{e}"}} {g(round(self.cost, 6))}'
            if billed else "",
        )


def _figures(summaries: list[ExamSummary], totals: Iterable[Any], now: float
             ) -> dict[str, ExamFigures]:
    out = {s.exam: ExamFigures(s, read_at=now) for s in summaries}
    for r in totals:
        f = out.get(r.exam)
        if f is None:
            continue
        f.calls[r.outcome] = int(r.calls)
        f.prompt += int(r.prompt)
        f.completion += int(r.completion)
        f.cost += float(r.cost)
    for f in out.values():
        f.write()
    return out


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class StoreMetrics:
    """The figures of every exam, kept up to date scrape by scrape (see the module)."""

    def __init__(self, store: Store, refresh_s: float = FULL_REFRESH_S) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._exams: dict[str, ExamFigures] = {}
        self._marks: dict[str, float] = {}
        self._live: set[str] = set()
        self._full_at: float | None = None
        self._refreshing = False

    def _read_all(self) -> dict[str, ExamFigures]:
        now = time.monotonic()
        summaries, totals = self.store.exam_figures()
        return _figures(summaries, totals, now)

    def _refresh_in_background(self) -> None:
        started = time.monotonic()
        try:
            fresh = self._read_all()
        except Exception:  # noqa: BLE001 - the next due scrape tries again
            with self._lock:
                self._refreshing = False
            return
        with self._lock:
            for slug, f in fresh.items():
                old = self._exams.get(slug)
                # A scrape that read the exam after this read began has newer figures.
                if slug in self._marks and (old is None or old.read_at < started):
                    self._exams[slug] = f
            self._full_at, self._refreshing = started, False

    def warm(self) -> None:
        """The first full read, at the server's start (in a thread of its own): a scrape
        that comes meanwhile waits for it rather than reading everything a second time."""
        try:
            self.update()
        except Exception:  # noqa: BLE001 - the first scrape reads again, and says why
            log.debug("metrics: the first read failed", exc_info=True)

    def update(self) -> dict[str, ExamFigures]:
        """Bring the figures up to date as a scrape needs them; returns them."""
        marks, live = self.store.exam_marks()
        with self._lock:
            if self._full_at is None:
                self._full_at = time.monotonic()
                self._exams = self._read_all()
            else:
                moved = {slug for slug, changed in marks.items()
                         if self._marks.get(slug) != changed or slug not in self._exams}
                moved |= (live | self._live) & marks.keys()
                ordered = sorted(moved)
                for i in range(0, len(ordered), CHUNK):
                    chunk = ordered[i:i + CHUNK]
                    now = time.monotonic()
                    summaries, totals = self.store.exam_figures(chunk)
                    for slug in chunk:
                        self._exams.pop(slug, None)
                    self._exams.update(_figures(summaries, totals, now))
                for slug in self._exams.keys() - marks.keys():
                    del self._exams[slug]  # deleted (prune)
                if (time.monotonic() - self._full_at > self.refresh_s
                        and not self._refreshing):
                    self._refreshing = True
                    threading.Thread(target=self._refresh_in_background, daemon=True,
                                     name="metrics-refresh").start()
            self._marks, self._live = marks, live
            return dict(self._exams)

    def render(self) -> bytes:
        """The exposition text (format 0.0.4), as prometheus_client would write it."""
        exams = list(self.update().values())
        by_state = {state: 0 for state in EXAM_STATES}
        for f in exams:
            by_state[f.summary.state] = by_state.get(f.summary.state, 0) + 1
        parts = ["# HELP examforge_exams Exams in the database by state.",
                 "# TYPE examforge_exams gauge"]
        parts += [f'examforge_exams{{state="{s}"}} {floatToGoString(n)}'
                  for s, n in by_state.items()]
        for i, (name, kind, help_text) in enumerate(FAMILIES):
            parts += (f"# HELP {name} {help_text}", f"# TYPE {name} {kind}")
            parts.extend(line for f in exams if (line := f.lines[i]))
        return ("\n".join(parts) + "\n").encode()
