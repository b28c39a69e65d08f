"""32 slots, 0.5 s latency: CPU per request and throughput of examforge (SQLite and
PostgreSQL) against the asyncio baseline, the minimal Celery task and curator, on 50-question
chapters (10 calls each) and on one-call chapters (issue 8, rows 2 to 5)."""

from __future__ import annotations

from bench.measure import Result, plan
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.baseline import run_baseline
from bench.systems.curator import run_curator
from bench.systems.distributed import ClusterSpec, run_distributed
from bench.systems.embedded import run_embedded

NAME = "slots32"
TITLE = "32 slots, 0.5 s latency: examforge against the asyncio baseline, a minimal Celery " \
        "task and curator"
SLOTS = 32
QPC = 5


# The one-call workload again with each reply's latency drawn from 0.5 s × [0.5, 1.5]
# (mockllm's latency_spread): a fixed latency keeps the 32 slots in step, so their replies
# come in trains and queue together for the worker's interpreter lock (and SQLite's one
# writer); a real provider's replies vary, and the trains break up.
SPREAD = 0.5


def _systems(ctx: Context, workload: str) -> list[str]:
    if workload == "1call-spread":
        return ["dist-sqlite"] if ctx.small else ["minimal", "dist-sqlite", "dist-pg",
                                                  *(["curator"] if ctx.curator() else [])]
    names = ["baseline"]
    if workload == "50q":
        names.append("embedded")
    else:
        names.append("minimal")
    names += ["dist-sqlite", "dist-pg"]
    if workload == "1call" and not ctx.small:  # group commit's A/B, in the same run
        names += ["dist-sqlite-nogroup", "dist-pg-nogroup"]
    if ctx.curator():
        names.append("curator")
    return names


def _run_one(ctx: Context, system: str, targets: list[int], calls: int, tag: str) -> Result:
    mock, wd = ctx.mock, ctx.workdir
    if system == "baseline":
        r = run_baseline(mock, wd, targets, calls, QPC, SLOTS)
    elif system == "embedded":
        r = run_embedded(mock, wd, targets, calls, QPC, SLOTS)
    elif system == "curator":
        r = run_curator(mock, wd, targets, calls, QPC, SLOTS, ctx.curator_python)
    else:
        spec = ClusterSpec(1, SLOTS, "postgres" if system.startswith("dist-pg") else "sqlite",
                           QPC, app="minimal" if system == "minimal" else "examforge",
                           group_commit=not system.endswith("-nogroup"))
        r = run_distributed(f"{system}-{tag}", mock, wd, targets, calls, spec, ctx.redis_url)
    r.system = system
    return r


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    if ctx.small:
        workloads = {"50q": plan(400, 8, QPC), "1call": plan(160, 32, QPC)}
    else:
        workloads = {"50q": plan(3200, 64, QPC), "1call": plan(3200, 640, QPC)}
    workloads["1call-spread"] = workloads["1call"]
    by: dict[str, dict[str, Result]] = {}
    for workload, (targets, calls) in workloads.items():
        by[workload] = {}
        spread = SPREAD if workload == "1call-spread" else 0.0
        ctx.mock.server.configure(latency_spread=spread)
        try:
            for system in _systems(ctx, workload):
                r = _run_one(ctx, system, targets, calls, workload)
                by[workload][system] = part.add_run(r, workload=workload)
        finally:
            ctx.mock.server.configure(latency_spread=0.0)
        rows = [[r.system, r.description, fmt(r.calls_per_s(), ".1f"),
                 fmt(r.fraction_of_ideal(), ".3f"), fmt(r.cpu_ms_per_call(), ".2f"),
                 fmt(r.server_cpu_s * 1000 / r.calls_paid if r.server_cpu_s is not None
                     and r.calls_paid else None, ".2f"),
                 fmt(r.cores_busy(), ".2f"), fmt(r.machine_cores_busy(), ".2f"),
                 f"{r.calls_paid} / {r.calls_needed}",
                 f"{r.questions_stored} / {r.questions_target}",
                 (r.error or "").splitlines()[-1][:80] if r.error else ""]
                for r in by[workload].values()]
        label = ("50-question chapters (10 calls each)" if workload == "50q"
                 else "one-call chapters (5 questions)")
        spread_note = (f" × a uniform draw from {1 - SPREAD:g} to {1 + SPREAD:g} for each reply"
                       if workload == "1call-spread" else "")
        part.details += [(f"**{label}**, {len(targets)} chapters, {calls} calls, "
                         f"latency {latency} s{spread_note}, ideal {SLOTS / latency:.0f} "
                         "calls/s:"), "",
                         *table(("system", "what", "calls/s", "fraction of slots/latency",
                                 "CPU ms/call (system)", "Redis+PG CPU ms/call",
                                 "cores busy", "machine cores busy", "paid / needed",
                                 "stored / target", "error"),
                                rows), ""]
    fifty, one = by["50q"], by["1call"]
    cur50, cur1 = fifty.get("curator"), one.get("curator")
    for db, label in (("dist-sqlite", "SQLite"), ("dist-pg", "PostgreSQL")):
        ef = fifty[db]
        part.figures.append(Figure(
            f"CPU per request, 50-question chapters, examforge {label} vs the asyncio baseline",
            ef.cpu_ms_per_call(), fifty["baseline"].cpu_ms_per_call(), "asyncio baseline", "ms",
            "moonshot ≤ 1.2x", target_max=None))
        if cur50 is not None:
            part.figures.append(Figure(
                f"CPU per request, 50-question chapters, examforge {label} vs curator",
                ef.cpu_ms_per_call(), cur50.cpu_ms_per_call(), "curator", "ms",
                "≤ 1.0x (≤ curator)", target_max=1.0))
    for system in ("dist-sqlite", "dist-pg", "minimal", "baseline", "curator"):
        run = one.get(system)
        if run is None:
            continue
        part.figures.append(Figure(
            f"throughput, one-call chapters, {system}, as a fraction of {SLOTS} / {latency} s",
            run.calls_per_s(), SLOTS / latency, "slots / latency", "calls/s",
            "≥ curator's (moonshot ≥ 0.98)" if system.startswith("dist") else ""))
    if cur1 is not None:
        for db in ("dist-sqlite", "dist-pg"):
            part.figures.append(Figure(
                f"throughput, one-call chapters, {db} vs curator", one[db].calls_per_s(),
                cur1.calls_per_s(), "curator", "calls/s", "≥ 1.0x", target_min=1.0))
            part.figures.append(Figure(
                f"worker CPU per call, one-call chapters, {db} vs curator",
                one[db].cpu_ms_per_call(), cur1.cpu_ms_per_call(), "curator", "ms",
                "≤ 1.0x (moonshot ≤ 0.5x)", target_max=1.0))
    varied = by["1call-spread"]
    cur_spread = varied.get("curator")
    for db in ("dist-sqlite", "dist-pg"):
        if cur_spread is not None and db in varied:
            part.figures.append(Figure(
                f"throughput, one-call chapters, latency spread {SPREAD:g}, {db} vs curator",
                varied[db].calls_per_s(), cur_spread.calls_per_s(), "curator", "calls/s",
                "informational: replies that vary in time, as a provider's do"))
    if "dist-sqlite" in varied:
        part.figures.append(Figure(
            f"throughput, one-call chapters, dist-sqlite, latency spread {SPREAD:g}, as a "
            f"fraction of {SLOTS} / {latency} s", varied["dist-sqlite"].calls_per_s(),
            SLOTS / latency, "slots / latency", "calls/s", "informational"))
    for db, label in (("dist-sqlite", "SQLite"), ("dist-pg", "PostgreSQL")):
        if db + "-nogroup" not in one:  # the smoke run has the A/B in `overhead` only
            continue
        part.figures.append(Figure(
            f"worker CPU per call, one-call chapters, group commit on vs off, {label}",
            one[db].cpu_ms_per_call(), one[db + "-nogroup"].cpu_ms_per_call(),
            "group commit off", "ms", "< 1.0x pays"))
        part.figures.append(Figure(
            f"throughput, one-call chapters, group commit on vs off, {label}",
            one[db].calls_per_s(), one[db + "-nogroup"].calls_per_s(), "group commit off",
            "calls/s", "> 1.0x pays"))
    part.figures.append(Figure(
        "worker CPU per call, one-call chapters, dist-sqlite vs the minimal Celery task",
        one["dist-sqlite"].cpu_ms_per_call(), one["minimal"].cpu_ms_per_call(),
        "minimal Celery task", "ms"))
    part.figures.append(Figure(
        "dist-pg throughput vs the asyncio baseline, 50-question chapters",
        fifty["dist-pg"].calls_per_s(), fifty["baseline"].calls_per_s(), "asyncio baseline",
        "calls/s", "≥ 0.97 (moonshot 1.0)", target_min=0.97))
    part.figures.append(Figure(
        "dist-sqlite throughput vs the asyncio baseline, 50-question chapters",
        fifty["dist-sqlite"].calls_per_s(), fifty["baseline"].calls_per_s(),
        "asyncio baseline", "calls/s"))
    return part
