"""One worker at 8, 32 and 128 threads (SQLite), against the asyncio baseline at the same
number of slots: the worker's RSS, and throughput against slots (plotted with the ideal line).
0.5 s latency, 50-question chapters at 5 per call, two waves of chapters per slot count."""

from __future__ import annotations

from bench.measure import Result, plan
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.baseline import run_baseline
from bench.systems.distributed import ClusterSpec, run_distributed

NAME = "threads"
TITLE = "worker RSS and throughput at 8, 32 and 128 threads"
QPC = 5


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    counts = (8, 32) if ctx.small else (8, 32, 128)
    got: dict[tuple[str, int], Result] = {}
    for slots in counts:
        targets, calls = (plan(slots * 20, slots, QPC) if ctx.small
                          else plan(slots * 2 * 50, slots * 2, QPC))
        base = run_baseline(ctx.mock, ctx.workdir, targets, calls, QPC, slots)
        got[("baseline", slots)] = part.add_run(base, slots_=slots)
        r = run_distributed(f"threads-{slots}", ctx.mock, ctx.workdir, targets, calls,
                            ClusterSpec(1, slots, "sqlite", QPC), ctx.redis_url)
        r.system = f"examforge, 1 × {slots} threads"
        got[("examforge", slots)] = part.add_run(r, slots_=slots)
    rows = [[r.system, r.slots, fmt(r.calls_per_s(), ".1f"), fmt(r.fraction_of_ideal(), ".3f"),
             fmt(r.cpu_ms_per_call(), ".2f"), fmt(r.cores_busy(), ".2f"),
             fmt(r.machine_cores_busy(), ".2f"),
             fmt(r.rss_mb, ".0f"), fmt(r.peak_rss_mb, ".0f"),
             f"{r.calls_paid} / {r.calls_needed}"] for r in got.values()]
    part.details += table(("system", "slots", "calls/s", "fraction of slots/latency",
                           "CPU ms/call", "cores busy", "machine cores busy", "RSS MB after",
                           "peak RSS MB",
                           "paid / needed"), rows)
    low = got[("examforge", counts[0])]
    for slots in counts[1:]:
        r = got[("examforge", slots)]
        part.figures.append(Figure(f"worker peak RSS at {slots} vs {counts[0]} threads",
                                   r.peak_rss_mb, low.peak_rss_mb, f"{counts[0]} threads", "MB"))
    for slots in counts:
        r, b = got[("examforge", slots)], got[("baseline", slots)]
        part.figures.append(Figure(f"throughput at {slots} slots, examforge (1 worker) vs the "
                                   "asyncio baseline", r.calls_per_s(), b.calls_per_s(),
                                   "asyncio baseline", "calls/s"))
    return part
