"""For issue 9: throughput against the number of chapters for a fixed number of questions
(600 questions at 10 per call in 1, 3, 6, 12 and 60 chapters; 32 slots, 0.5 s latency; one
worker × 32 threads, SQLite). A chapter's calls run one after another today, so fewer chapters
than slots leave slots idle: the chapter-bound ideal is min(chapters, slots) / latency. Rerun
this part once chapters are split into slices (issue 9) to see the gap close."""

from __future__ import annotations

from bench.measure import Result, plan
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.distributed import Cluster, ClusterSpec

NAME = "chapters"
TITLE = "throughput against the number of chapters, 600 questions at 10 per call (issue 9)"
QPC = 10
SLOTS = 32


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    questions = 120 if ctx.small else 600
    sweep = (1, 6, 12) if ctx.small else (1, 3, 6, 12, 60)
    got: dict[int, Result] = {}
    with Cluster(ClusterSpec(1, SLOTS, "sqlite", QPC), ctx.mock, ctx.workdir,
                 ctx.redis_url) as cluster:
        for chapters in sweep:
            targets, calls = plan(questions, chapters, QPC)
            r = cluster.run(f"sweep-{chapters}", targets, calls)
            r.system = f"{chapters} chapters"
            got[chapters] = part.add_run(r, sweep_chapters=chapters)
    rows = []
    for chapters, r in got.items():
        bound = min(chapters, SLOTS) / latency
        rows.append([chapters, questions // chapters, fmt(r.qps(), ".1f"),
                     fmt(r.calls_per_s(), ".1f"), fmt(r.fraction_of_ideal(), ".3f"),
                     fmt((r.calls_per_s() or 0) / bound, ".3f"), fmt(r.window_s, ".1f"),
                     f"{r.calls_paid} / {r.calls_needed}"])
        part.figures.append(Figure(
            f"{questions} questions in {chapters} chapter(s): throughput as a fraction of "
            f"{SLOTS} / {latency} s", r.calls_per_s(), SLOTS / latency, "slots / latency",
            "calls/s"))
    part.details += table(("chapters", "questions each", "questions/s", "calls/s",
                           "fraction of slots/latency", "fraction of min(chapters, slots)/latency",
                           "first call → all stored, s", "paid / needed"), rows)
    return part
