"""Worker CPU per one-call chapter against the minimal Celery task: a zero-latency mock,
1 worker × 8 threads, SQLite (issue 8, first row). With `--profile`, py-spy records the
examforge worker during its run (bench/profile-overhead.txt, summarised in the report)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.measure import Result, plan
from bench.profile import summarise
from bench.suite import Context, Figure, PartResult
from bench.systems.distributed import Cluster, ClusterSpec

NAME = "overhead"
TITLE = "worker CPU per one-call chapter, zero-latency mock, 1 worker × 8 threads, SQLite"
QPC = 5


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    chapters = 60 if ctx.small else 2000
    targets, calls = plan(chapters * QPC, chapters, QPC)
    ctx.mock.set_latency(0.0)
    try:
        results: dict[str, Result] = {}
        for app in ("minimal", "examforge"):
            spec = ClusterSpec(1, 8, "sqlite", QPC, app=app)
            with Cluster(spec, ctx.mock, ctx.workdir, ctx.redis_url) as cluster:
                profiler = None
                if app == "examforge" and ctx.profile_dir is not None:
                    profiler = _start_profile(cluster.pids[0],
                                              ctx.profile_dir / "profile-overhead.txt")
                    time.sleep(1.0)  # py-spy attached before the first message
                results[app] = part.add_run(cluster.run(f"over-{app}", targets, calls))
                if profiler is not None:
                    profiler.send_signal(2)  # SIGINT: py-spy writes its file and exits
                    profiler.wait(timeout=60)
                    summary = summarise((ctx.profile_dir / "profile-overhead.txt").read_text())
                    part.details += ["py-spy on the examforge worker (share of active samples):",
                                     "", *summary, ""]
    finally:
        ctx.mock.set_latency(0.5)
    ef, mini = results["examforge"], results["minimal"]
    part.figures.append(Figure(
        "worker CPU per one-call chapter, examforge vs the minimal Celery task",
        ef.cpu_ms_per_chapter(), mini.cpu_ms_per_chapter(), "minimal Celery task", "ms",
        "≤ 1.5x (moonshot 1.0x)", target_max=1.5,
        note=f"{chapters} chapters of {QPC} questions, one call each; CPU of the worker "
             "process from the first call reaching the mock to the last chapter done"))
    part.figures.append(Figure(
        "chapters per second at zero latency, examforge vs the minimal task",
        _rate(ef), _rate(mini), "minimal Celery task", "chapters/s"))
    part.details += [
        "| system | chapters/s | worker CPU ms/chapter | cores busy (worker+Redis+mock) | "
        "paid / needed |", "|---|---|---|---|---|",
        *(f"| {r.description} | {_rate(r) or 0:.0f} | {r.cpu_ms_per_chapter() or 0:.2f} | "
          f"{r.cores_busy() or 0:.2f} | {r.calls_paid} / {r.calls_needed} |"
          for r in (mini, ef))]
    return part


def _rate(r: Result) -> float | None:
    return r.chapters / r.window_s if r.window_s else None


def _start_profile(pid: int, out: Path) -> subprocess.Popen:
    py_spy = str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--nonblocking",
                             "--format", "raw", "--rate", "200", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
