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


# The three systems run in turn, this many rounds (one in the smoke run): a single run's ratio
# moved between 2.3x and 3.4x on this machine from one minute to the next, so the figure is
# the round with the median SQLite ratio, each ratio still from runs a minute apart, and the
# report lists every round's.
ROUNDS = 3
# With group commit off (GROUP_COMMIT=false) in the same rounds: its A/B.
SYSTEMS = (("minimal", "minimal", "sqlite"), ("examforge", "examforge", "sqlite"),
           ("examforge-pg", "examforge", "postgres"),
           ("examforge-nogroup", "examforge", "sqlite"),
           ("examforge-pg-nogroup", "examforge", "postgres"))


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    chapters = 60 if ctx.small else 2000
    targets, calls = plan(chapters * QPC, chapters, QPC)
    rounds = 1 if ctx.small else ROUNDS
    ctx.mock.set_latency(0.0)
    try:
        by_round: list[dict[str, Result]] = []
        # With --profile, py-spy records a round of its own after the measured ones: it costs
        # the worker CPU, so that round counts for no figure.
        for round_no in range(rounds + (ctx.profile_dir is not None)):
            by_round.append({})
            for run_name, app, database in SYSTEMS:
                by_round[-1][run_name] = _run_one(ctx, part, run_name, app, database,
                                                  targets, calls, round_no == rounds,
                                                  round_no)
    finally:
        ctx.mock.set_latency(0.5)
    by_round = by_round[:rounds]
    ratios = [_ratio(r["examforge"], r["minimal"]) for r in by_round]
    pg_ratios = [_ratio(r["examforge-pg"], r["minimal"]) for r in by_round]
    results = by_round[sorted(range(rounds), key=lambda i: ratios[i] or 0.0)[rounds // 2]]
    spread = ""
    if rounds > 1:
        spread = (f"; the median of {rounds} rounds run in turn, their ratios "
                  + ", ".join(fmt(x, ".2f") + "x" for x in ratios)
                  + " (PostgreSQL " + ", ".join(fmt(x, ".2f") + "x" for x in pg_ratios) + ")")
    ef, mini = results["examforge"], results["minimal"]
    part.figures.append(Figure(
        "worker CPU per one-call chapter, examforge vs the minimal Celery task",
        ef.cpu_ms_per_chapter(), mini.cpu_ms_per_chapter(), "minimal Celery task", "ms",
        "≤ 1.5x (moonshot 1.0x)", target_max=1.5,
        note=f"{chapters} chapters of {QPC} questions, one call each; CPU of the worker "
             "process from the first call reaching the mock to the last chapter done"
             + spread))
    pg = results["examforge-pg"]
    part.figures.append(Figure(
        "worker CPU per one-call chapter on PostgreSQL, examforge vs the minimal Celery task",
        pg.cpu_ms_per_chapter(), mini.cpu_ms_per_chapter(), "minimal Celery task", "ms",
        "–", note="the same round on PostgreSQL: its per-call path is one round trip a "
                  "step (storage.fastpath)"))
    for on, off, label in (("examforge", "examforge-nogroup", "SQLite"),
                           ("examforge-pg", "examforge-pg-nogroup", "PostgreSQL")):
        part.figures.append(Figure(
            f"worker CPU per one-call chapter, group commit on vs off, {label}",
            results[on].cpu_ms_per_chapter(), results[off].cpu_ms_per_chapter(),
            "group commit off", "ms", "< 1.0x pays",
            note="the same round, interleaved; every round's in the table below"))
        part.figures.append(Figure(
            f"chapters per second at zero latency, group commit on vs off, {label}",
            _rate(results[on]), _rate(results[off]), "group commit off", "chapters/s",
            "> 1.0x pays"))
    part.figures.append(Figure(
        "chapters per second at zero latency, examforge vs the minimal task",
        _rate(ef), _rate(mini), "minimal Celery task", "chapters/s"))
    part.details += table(
        ("round", "system", "chapters/s", "worker CPU ms/chapter",
         "cores busy (worker+Redis+mock)", "machine cores busy", "paid / needed"),
        [[str(i + 1) + (" (the figure)" if rnd is results else ""), r.description,
          fmt(_rate(r), ".0f"), fmt(r.cpu_ms_per_chapter(), ".2f"), fmt(r.cores_busy(), ".2f"),
          fmt(r.machine_cores_busy(), ".2f"), f"{r.calls_paid} / {r.calls_needed}"]
         for i, rnd in enumerate(by_round) for r in rnd.values()])
    return part


def _run_one(ctx: Context, part: PartResult, run_name: str, app: str, database: str,
             targets: list[int], calls: int, profile: bool, round_no: int) -> Result:
    spec = ClusterSpec(1, 8, database, QPC, app=app,
                       group_commit=not run_name.endswith("-nogroup"))
    with Cluster(spec, ctx.mock, ctx.workdir, ctx.redis_url) as cluster:
        profilers: dict[str, tuple[subprocess.Popen, Path]] = {}
        if app == "examforge" and profile:
            assert ctx.profile_dir is not None
            suffix = "" if database == "sqlite" else "-pg"
            for kind, extra in (("active", []), ("gil", ["--gil"])):
                out = ctx.profile_dir / f"profile-overhead{suffix}-{kind}.txt"
                profilers[kind] = (_start_profile(cluster.pids[0], out, extra), out)
            time.sleep(1.0)  # py-spy attached before the first message
        result = part.add_run(cluster.run(f"over-{run_name}", targets, calls),
                              round=round_no + 1, variant=run_name,
                              profiled=profile and app == "examforge")
        for kind, (profiler, out) in profilers.items():
            profiler.send_signal(signal.SIGINT)  # py-spy writes its file and exits
            profiler.wait(timeout=60)
            what = ("every sample py-spy does not see as idle (waits on locks and "
                    "sockets included)" if kind == "active"
                    else "samples of the thread holding the GIL (where the CPU goes)")
            part.details += [(f"py-spy on the examforge worker ({spec.describe()}), "
                              f"{what}; raw stacks in "
                              f"`bench/{out.name}`:"), "", *summarise(out.read_text()), ""]
    return result


def _ratio(value: Result, baseline: Result) -> float | None:
    v, b = value.cpu_ms_per_chapter(), baseline.cpu_ms_per_chapter()
    return v / b if v is not None and b else None


def _rate(r: Result) -> float | None:
    return r.chapters / r.window_s if r.window_s else None


def _start_profile(pid: int, out: Path, extra: list[str]) -> subprocess.Popen:
    py_spy = str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--nonblocking",
                             "--format", "raw", "--rate", "100", "-o", str(out), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
