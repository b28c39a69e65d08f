"""GET /metrics: Prometheus metrics read from the database at each scrape.

A custom collector rather than counters kept in the process: the database is the record, so
every replica serves the same figures, and a restart loses nothing."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from storage.reports import ExamStatus

if TYPE_CHECKING:
    from storage import Store

EXAM_STATES = [s.value for s in ExamStatus]


class StoreCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list[Metric]:
        return []  # figures come from the database at scrape time only

    def collect(self) -> Iterator[Metric]:
        # Aggregated in SQL, one grouped pass over the slices and one over the ledger (the
        # cost comes from the latter): a scrape reads no exam's slices or questions into
        # Python, whatever the history holds (issue 19).
        exams = self.store.exam_figures()
        by_state = GaugeMetricFamily("examforge_exams", "Exams in the database by state.",
                                     labels=["state"])
        counts = Counter(e.state for e in exams)
        for state in EXAM_STATES:
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state
        current = GaugeMetricFamily("examforge_exam_state",
                                  "1 for the exam's current state.", labels=["exam", "state"])
        stored = GaugeMetricFamily("examforge_exam_questions_stored",
                                   "Questions stored, up to each chapter's target.",
                                   labels=["exam"])
        target = GaugeMetricFamily("examforge_exam_questions_target",
                                   "Questions the syllabus asks for.", labels=["exam"])
        for e in exams:
            current.add_metric([e.exam, e.state], 1)
            stored.add_metric([e.exam], e.questions.done)
            target.add_metric([e.exam], e.questions.target)
        yield from (current, stored, target)
        calls = CounterMetricFamily("examforge_exam_calls", "Model calls by outcome.",
                                    labels=["exam", "outcome"])
        tokens = CounterMetricFamily("examforge_exam_tokens", "Tokens of the model calls.",
                                     labels=["exam", "kind"])
        cost = CounterMetricFamily("examforge_exam_cost_usd", "What the model calls cost, USD.",
                                   labels=["exam"])
        per_exam: dict[str, list[float]] = {}
        for r in self.store.call_totals():
            calls.add_metric([r.exam, r.outcome], r.calls)
            acc = per_exam.setdefault(r.exam, [0, 0, 0.0])
            acc[0] += r.prompt
            acc[1] += r.completion
            acc[2] += float(r.cost)
        for exam, (prompt, completion, usd) in per_exam.items():
            tokens.add_metric([exam, "prompt"], prompt)
            tokens.add_metric([exam, "completion"], completion)
            cost.add_metric([exam], round(usd, 6))
        yield from (calls, tokens, cost)
