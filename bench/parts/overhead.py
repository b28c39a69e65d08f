"""Worker CPU per one-call chapter against the minimal Celery task: a zero-latency mock,
1 worker × 8 threads, SQLite (issue 8, first row), and the same on PostgreSQL (whose per-call
path is plain SQL, one round trip a step: storage.fastpath). With `--profile`, py-spy records
the examforge worker during its runs (bench/profile-overhead-*.txt, summarised in the
report)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.measure import Result, plan
from bench.profile import summarise
from bench.report import fmt, table
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
        for run_name, app, database in (("minimal", "minimal", "sqlite"),
                                        ("examforge", "examforge", "sqlite"),
                                        ("examforge-pg", "examforge", "postgres")):
            spec = ClusterSpec(1, 8, database, QPC, app=app)
            with Cluster(spec, ctx.mock, ctx.workdir, ctx.redis_url) as cluster:
                profilers: dict[str, tuple[subprocess.Popen, Path]] = {}
                if app == "examforge" and ctx.profile_dir is not None:
                    suffix = "" if database == "sqlite" else "-pg"
                    for kind, extra in (("active", []), ("gil", ["--gil"])):
                        out = ctx.profile_dir / f"profile-overhead{suffix}-{kind}.txt"
                        profilers[kind] = (_start_profile(cluster.pids[0], out, extra), out)
                    time.sleep(1.0)  # py-spy attached before the first message
                results[run_name] = part.add_run(cluster.run(f"over-{run_name}", targets,
                                                             calls))
                for kind, (profiler, out) in profilers.items():
                    profiler.send_signal(signal.SIGINT)  # py-spy writes its file and exits
                    profiler.wait(timeout=60)
                    what = ("every sample py-spy does not see as idle (waits on locks and "
                            "sockets included)" if kind == "active"
                            else "samples of the thread holding the GIL (where the CPU goes)")
                    part.details += [(f"py-spy on the examforge worker ({spec.describe()}), "
                                      f"{what}; raw stacks in "
                                     f"`bench/{out.name}`:"), "", *summarise(out.read_text()), ""]
    finally:
        ctx.mock.set_latency(0.5)
    ef, mini = results["examforge"], results["minimal"]
    part.figures.append(Figure(
        "worker CPU per one-call chapter, examforge vs the minimal Celery task",
        ef.cpu_ms_per_chapter(), mini.cpu_ms_per_chapter(), "minimal Celery task", "ms",
        "≤ 1.5x (moonshot 1.0x)", target_max=1.5,
        note=f"{chapters} chapters of {QPC} questions, one call each; CPU of the worker "
             "process from the first call reaching the mock to the last chapter done"))
    pg = results["examforge-pg"]
    part.figures.append(Figure(
        "worker CPU per one-call chapter on PostgreSQL, examforge vs the minimal Celery task",
        pg.cpu_ms_per_chapter(), mini.cpu_ms_per_chapter(), "minimal Celery task", "ms",
        "–", note="the same run on PostgreSQL: its per-call path is one round trip a step "
                  "(storage.fastpath)"))
    part.figures.append(Figure(
        "chapters per second at zero latency, examforge vs the minimal task",
        _rate(ef), _rate(mini), "minimal Celery task", "chapters/s"))
    part.details += table(
        ("system", "chapters/s", "worker CPU ms/chapter", "cores busy (worker+Redis+mock)",
         "machine cores busy", "paid / needed"),
        [[r.description, fmt(_rate(r), ".0f"), fmt(r.cpu_ms_per_chapter(), ".2f"),
          fmt(r.cores_busy(), ".2f"), fmt(r.machine_cores_busy(), ".2f"),
          f"{r.calls_paid} / {r.calls_needed}"] for r in (mini, ef, pg)])
    return part


def _rate(r: Result) -> float | None:
    return r.chapters / r.window_s if r.window_s else None


def _start_profile(pid: int, out: Path, extra: list[str]) -> subprocess.Popen:
    py_spy = str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--nonblocking",
                             "--format", "raw", "--rate", "100", "-o", str(out), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
