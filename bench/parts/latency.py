"""Where a slot's time goes at 32 slots: one worker of 32 threads, one-call chapters at 0.5 s,
examforge on SQLite and on PostgreSQL against the minimal Celery task, each worker traced
(bench/tracer: every step's wall time and the CPU time its thread spent in it).

A slot's cycle is one task (Celery's task_prerun to task_postrun) and the gap before the
thread's next task (Celery's ack, the next message's delivery). The ideal cycle is the model's
latency alone; what a cycle takes beyond it is what throughput at 32 slots loses
(`slots32`). For examforge the task is split into the claim, the model call and the commit,
and the claim's and the commit's wall time into the time their thread spent running (CPU),
waiting for its group commit while another thread leads it, and the rest (waiting for the
interpreter lock, the database, Redis). Spans of the middle 80 % of the run only: the first
and last waves have no queue to wait in."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from bench.measure import Result, plan
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.distributed import ClusterSpec, run_distributed

NAME = "latency"
TITLE = "where a slot's time goes at 32 slots: each step's wall and CPU time, traced"
SLOTS = 32
QPC = 5
TRACER = Path(__file__).resolve().parent.parent / "tracer"
SYSTEMS = (("minimal", "sqlite"), ("examforge", "sqlite"), ("examforge", "postgres"))

Span = tuple[int, str, float, float, float]  # thread, step, start, end, CPU seconds


def read_spans(folder: Path) -> list[tuple[str, Span]]:
    """Every span the tracer wrote, with the process it came from."""
    spans = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                tid, step, t0, t1, cpu = json.loads(line)
            except ValueError:  # a line cut short by a worker killed as it wrote
                continue
            spans.append((path.stem, (tid, step, t0, t1, cpu)))
    return spans


def summarise(spans: Iterable[tuple[str, Span]], middle: float = 0.8) -> dict[str, Any]:
    """Per step: how many spans, their mean wall and CPU time in ms, and their wall time in
    all per task; per thread, the gaps between one task's end and the next one's start. Only
    spans inside the middle `middle` of the tasks' time, or of all of it when no task lies
    inside that middle (a short run under load)."""
    spans = list(spans)
    tasks = [s for _, s in spans if s[1] == "task"]
    if not tasks:
        return {"tasks": 0, "steps": {}, "gap_ms": None, "gap_median_ms": None}
    first, last = min(s[2] for s in tasks), max(s[3] for s in tasks)
    cut = (last - first) * (1 - middle) / 2
    lo, hi = first + cut, last - cut
    if not any(lo <= s[2] and s[3] <= hi for s in tasks):
        # A run of two or three waves (--small) under load: no task lies inside the middle,
        # and the whole run is measured.
        lo, hi = first, last
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    by_thread: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for proc, (tid, step, t0, t1, c) in spans:
        if step == "task":
            by_thread[(proc, tid)].append((t0, t1))
        if lo <= t0 and t1 <= hi:
            wall[step].append(t1 - t0)
            cpu[step].append(c)
    n_tasks = len(wall.get("task", []))
    gaps: list[float] = []
    every: list[float] = []
    for runs in by_thread.values():
        runs.sort()
        pairs = [(a1, b0) for (_, a1), (b0, _) in zip(runs, runs[1:])]
        gaps += [b0 - a1 for a1, b0 in pairs if lo <= a1 and b0 <= hi]
        every += [b0 - a1 for a1, b0 in pairs]
    if not gaps:  # a run of two or three waves (--small): no pair inside the middle
        gaps = every
    steps = {step: {"n": len(w), "wall_ms": 1000 * statistics.fmean(w),
                    "cpu_ms": 1000 * statistics.fmean(cpu[step]),
                    "per_task_ms": 1000 * sum(w) / n_tasks if n_tasks else None}
             for step, w in wall.items()}
    return {"tasks": n_tasks, "steps": steps,
            "gap_ms": 1000 * statistics.fmean(gaps) if gaps else None,
            "gap_median_ms": 1000 * statistics.median(gaps) if gaps else None}


def cycle_ms(summary: dict[str, Any]) -> float | None:
    """A slot's mean cycle: its task and the gap before its next."""
    task = summary["steps"].get("task")
    if task is None or summary["gap_ms"] is None:
        return None
    return float(task["wall_ms"] + summary["gap_ms"])


def _traced(ctx: Context, app: str, database: str, targets: list[int], calls: int
            ) -> tuple[Result, dict[str, Any]]:
    folder = ctx.workdir / f"trace-{app}-{database}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    before = {name: os.environ.get(name) for name in ("PYTHONPATH", "BENCH_TRACE_DIR")}
    # The workers inherit the bench's environment: the tracer folder first on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(TRACER),
                                                             before["PYTHONPATH"])))
    os.environ["BENCH_TRACE_DIR"] = str(folder)
    try:
        r = run_distributed(f"latency-{app}-{database}", ctx.mock, ctx.workdir, targets, calls,
                            ClusterSpec(1, SLOTS, database, QPC, app=app), ctx.redis_url)
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    r.system = f"{app}, {'SQLite' if database == 'sqlite' else 'PostgreSQL'}"
    return r, summarise(read_spans(folder))


def _ms(summary: dict[str, Any], step: str, what: str = "wall_ms") -> float | None:
    found = summary["steps"].get(step)
    return None if found is None else found[what]


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    chapters = 64 if ctx.small else 640
    targets, calls = plan(chapters * QPC, chapters, QPC)
    got: dict[tuple[str, str], tuple[Result, dict[str, Any]]] = {}
    for app, database in SYSTEMS:
        r, summary = _traced(ctx, app, database, targets, calls)
        part.add_run(r, trace=summary)
        got[(app, database)] = (r, summary)
    rows = []
    for (app, _), (r, s) in got.items():
        call = _ms(s, "model call") if app == "examforge" else _ms(s, "http")
        cycle = cycle_ms(s)
        rows.append([
            r.system, fmt(r.fraction_of_ideal(), ".3f"),
            fmt(None if cycle is None else cycle - 1000 * latency, ".1f"), fmt(call, ".1f"),
            *(f"{fmt(_ms(s, step), '.1f')} ({fmt(_ms(s, step, 'cpu_ms'), '.2f')})"
              if step in s["steps"] else "–" for step in ("claim", "commit")),
            fmt(_ms(s, "group wait", "per_task_ms"), ".1f") if "group wait" in s["steps"]
            else "–",
            f"{fmt(_ms(s, 'group transaction', 'per_task_ms'), '.1f')} "
            f"({fmt(_ms(s, 'group transaction'), '.2f')} / "
            f"{fmt(_ms(s, 'group transaction', 'cpu_ms'), '.2f')})"
            if "group transaction" in s["steps"] else "–",
            f"{fmt(s['gap_ms'], '.1f')} ({fmt(s['gap_median_ms'], '.1f')})",
            fmt(r.cpu_ms_per_call(), ".2f")])
    part.details += [
        f"{chapters} one-call chapters, 1 × {SLOTS} threads, {latency} s calls; means over "
        "the middle 80 % of each run's tasks, in ms. Claim and commit: wall (CPU of their "
        "thread). Group wait: a thread's waits for a group another thread leads, a task. "
        "Writer's hold: group transactions' wall time a task (one transaction's wall / CPU).",
        ""]
    part.details += table((
        "system", "fraction of the ideal", "cycle beyond the call", "model call", "claim",
        "commit", "group wait", "writer's hold", "gap between tasks (median)",
        "worker CPU ms a call"), rows)
    base_r, base = got[("minimal", "sqlite")]
    base_extra = None if cycle_ms(base) is None else cycle_ms(base) - 1000 * latency  # type: ignore[operator]
    for database in ("sqlite", "postgres"):
        _, s = got[("examforge", database)]
        cycle = cycle_ms(s)
        part.figures.append(Figure(
            f"a slot's cycle beyond the call, examforge on "
            f"{'SQLite' if database == 'sqlite' else 'PostgreSQL'} vs the minimal task",
            None if cycle is None else cycle - 1000 * latency, base_extra, "minimal task",
            "ms"))
    return part
