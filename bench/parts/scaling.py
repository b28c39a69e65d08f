"""Scaling: 1, 2 and 4 worker processes sharing 128 slots (128, 64 and 32 threads each),
0.5 s latency, 50-question chapters at 5 per call, on PostgreSQL and SQLite. The ideal is
128 / 0.5 s = 256 calls/s; "cores busy" (workers, Redis, PostgreSQL and the mock, over the
window) shows where the machine's 2 cores run out."""

from __future__ import annotations

from bench.measure import Result, plan
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.distributed import ClusterSpec, run_distributed

NAME = "scaling"
TITLE = "1, 2 and 4 worker processes at 128 slots in all"
QPC = 5


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    slots = 32 if ctx.small else 128
    workers_list = (1, 2) if ctx.small else (1, 2, 4)
    databases = ("postgres",) if ctx.small else ("postgres", "sqlite")
    # Two waves of 10-call chapters; one wave of 4-call ones in the smoke run.
    targets, calls = (plan(slots * 20, slots, QPC) if ctx.small
                      else plan(slots * 2 * 50, slots * 2, QPC))
    got: dict[tuple[str, int], Result] = {}
    off: dict[str, Result] = {}  # 2 workers with group commit off, right after it on
    for database in databases:
        for workers in workers_list:
            # The smoke run has the A/B in `overhead` only.
            for grouped in ((True, False) if workers == 2 and not ctx.small else (True,)):
                spec = ClusterSpec(workers, slots // workers, database, QPC,
                                   group_commit=grouped)
                r = run_distributed(f"scale-{database[:2]}-{workers}w" + ("" if grouped
                                                                         else "-off"),
                                    ctx.mock, ctx.workdir, targets, calls, spec,
                                    ctx.redis_url)
                r.system = (f"{workers} × {slots // workers} threads, {database}"
                            + ("" if grouped else ", group commit off"))
                r = part.add_run(r, workers=workers, database=database, group_commit=grouped)
                if grouped:
                    got[(database, workers)] = r
                else:
                    off[database] = r
    # The machine's ceiling for any Celery worker: the minimal task (one completion-row
    # check, one httpx call, one SQLite row, no guarantees) on the best shape, 2 processes,
    # with the same number of calls as one-call chapters (it makes one call a chapter, so it
    # also pays a task's receive and ack a call, which examforge's 10-call chapters do not).
    ceiling = None
    if not ctx.small:
        mtargets, mcalls = plan(calls * QPC, calls, QPC)
        spec = ClusterSpec(2, slots // 2, "sqlite", QPC, app="minimal")
        ceiling = run_distributed("scale-minimal-2w", ctx.mock, ctx.workdir, mtargets, mcalls,
                                  spec, ctx.redis_url)
        ceiling.system = f"minimal Celery task, 2 × {slots // 2} threads, one-call chapters"
        ceiling = part.add_run(ceiling, workers=2, database="sqlite", app="minimal")
    ideal = slots / latency
    rows = [[r.system, fmt(r.calls_per_s(), ".1f"), fmt(r.fraction_of_ideal(), ".3f"),
             fmt(r.cpu_ms_per_call(), ".2f"),
             fmt(r.server_cpu_s * 1000 / r.calls_paid if r.server_cpu_s is not None
                 and r.calls_paid else None, ".2f"),
             fmt(r.bench_cpu_s * 1000 / r.calls_paid if r.bench_cpu_s is not None
                 and r.calls_paid else None, ".2f"),
             fmt(r.cores_busy(), ".2f"), fmt(r.machine_cores_busy(), ".2f"),
             fmt(r.peak_rss_mb, ".0f"),
             f"{r.calls_paid} / {r.calls_needed}"] for r in [*got.values(), *off.values(),
                                               *([ceiling] if ceiling else [])]]
    part.details += [(f"{len(targets)} chapters of 50 questions, {calls} calls, latency "
                     f"{latency} s, ideal {ideal:.0f} calls/s."), "",
                     *table(("workers", "calls/s", "fraction of ideal", "worker CPU ms/call",
                             "Redis+PG CPU ms/call", "mock CPU ms/call", "cores busy",
                             "machine cores busy",
                             "workers' peak RSS MB", "paid / needed"), rows)]
    for (database, workers), r in got.items():
        part.figures.append(Figure(
            f"throughput at {slots} slots, {workers} worker(s) ({database}), as a fraction of "
            f"{slots} / {latency} s", r.calls_per_s(), ideal, "slots / latency", "calls/s"))
    if ceiling is not None:
        part.figures.append(Figure(
            f"throughput at {slots} slots, the minimal Celery task on 2 workers (one-call "
            f"chapters, SQLite), as a fraction of {slots} / {latency} s: the machine's ceiling",
            ceiling.calls_per_s(), ideal, "slots / latency", "calls/s"))
    for database in databases:
        one = got[(database, 1)]
        for workers in workers_list[1:]:
            part.figures.append(Figure(
                f"throughput, {workers} workers vs 1 ({database}, {slots} slots)",
                got[(database, workers)].calls_per_s(), one.calls_per_s(), "1 worker",
                "calls/s"))
    for database, r in off.items():
        on = got[(database, 2)]
        part.figures.append(Figure(
            f"throughput at {slots} slots, 2 workers ({database}), group commit on vs off",
            on.calls_per_s(), r.calls_per_s(), "group commit off", "calls/s", "> 1.0x pays"))
        part.figures.append(Figure(
            f"worker CPU per call at {slots} slots, 2 workers ({database}), group commit on "
            "vs off", on.cpu_ms_per_call(), r.cpu_ms_per_call(), "group commit off", "ms",
            "< 1.0x pays"))
    return part
