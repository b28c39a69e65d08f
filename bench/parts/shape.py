"""The worker's shape at 128 slots (issue 33): the same 128 threads as 1 process × 128, 2 × 64
and 4 × 32, on SQLite and PostgreSQL, each as a fraction of the ideal 128 / latency; then, at
the shape that did best in this run, whether any of Celery's own per-task settings pays:
`worker_prefetch_multiplier` 4 against 1, the result backend on against off, msgpack against
JSON. `task_acks_late` is required (a killed worker's message must go back) and is not varied.

Every configuration runs `ROUNDS` times, interleaved (round r runs every configuration once,
in an order rotated by r), on fresh workers and a fresh database each time, and the figure is
the median round: the machine is shared, and a minute's load moves one run by more than the
differences measured here.

Celery has no "prefork × threads" pool: a prefork child runs one task at a time, so 128 slots
in prefork are 128 processes (about 140 MB and 1 s of CPU each to start). Several processes of
threads are several `celery worker -P threads` processes, which is what 2 × 64 and 4 × 32 are
(on one machine or many: the slots only meet in Redis and the database)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections.abc import Callable

from bench.measure import Result, plan
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.distributed import Cluster, ClusterSpec

NAME = "shape"
TITLE = "128 slots as 1 × 128, 2 × 64 and 4 × 32 threads, and Celery's per-task settings"
QPC = 5


def _median_run(runs: list[Result], key: Callable[[Result], float | None]) -> Result:
    """The run whose `key` is the median of the rounds (the lower middle of an even count)."""
    ranked = sorted(runs, key=lambda r: key(r) or 0.0)
    return ranked[(len(ranked) - 1) // 2]


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def results_stored(redis_url: str) -> int:
    """Celery results in the run's Redis db: none unless the result backend is on (the proof
    that the variant ran with it, read before the cluster flushes the db)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for _ in client.scan_iter(match="celery-task-meta-*", count=1000))
    finally:
        client.close()


def _interleaved(ctx: Context, configs: list[tuple[str, ClusterSpec]], rounds: int,
                 targets: list[int], calls: int, part: PartResult, **extra: object
                 ) -> dict[str, list[Result]]:
    """Every config once per round, the order rotated by one each round."""
    got: dict[str, list[Result]] = {label: [] for label, _ in configs}
    for rnd in range(rounds):
        shift = rnd % len(configs)
        for label, spec in configs[shift:] + configs[:shift]:
            with Cluster(spec, ctx.mock, ctx.workdir, ctx.redis_url) as cluster:
                r = cluster.run(f"{NAME}-{rnd}", targets, calls)
                stored = results_stored(ctx.redis_url)
            r.system = label
            got[label].append(part.add_run(r, round=rnd, config=label, results_stored=stored,
                                           workers=spec.workers,
                                           threads=spec.threads, database=spec.database,
                                           prefetch=spec.prefetch,
                                           celery_conf=spec.celery_conf, **extra))
    return got


def _rows(got: dict[str, list[Result]]) -> list[list[str]]:
    rows = []
    for label, runs in got.items():
        m = _median_run(runs, Result.fraction_of_ideal)
        rows.append([
            label, " / ".join(fmt(r.fraction_of_ideal(), ".2f") for r in runs),
            fmt(m.calls_per_s(), ".1f"), fmt(m.fraction_of_ideal(), ".3f"),
            fmt(_median([r.cpu_ms_per_call() for r in runs]), ".2f"),
            fmt(m.cores_busy(), ".2f"), fmt(m.machine_cores_busy(), ".2f"),
            fmt(max((r.peak_rss_mb or 0) for r in runs), ".0f"),
            " / ".join(f"{r.calls_paid}/{r.calls_needed}" for r in runs)])
    return rows


HEADER = ("configuration", "fraction of ideal, each round", "calls/s (median round)",
          "fraction of ideal (median)", "worker CPU ms/call (median)", "cores busy",
          "machine cores busy", "workers' peak RSS MB", "paid/needed, each round")


def celery_variants(ctx: Context) -> list[tuple[str, int, str]]:
    """(label, prefetch, Celery settings as JSON) against examforge's defaults (first)."""
    variants = [("defaults (prefetch 1, no result backend, JSON)", 1, "{}"),
                ("result backend on (Redis)", 1,
                 json.dumps({"task_ignore_result": False, "result_backend": ctx.redis_url}))]
    if ctx.small:
        return variants
    variants.insert(1, ("prefetch 4", 4, "{}"))
    # kombu's msgpack serializer needs the msgpack package in the workers and the producer
    # (not a dependency of examforge: it is measured here before it is kept).
    if importlib.util.find_spec("msgpack") is not None:
        variants.append(("msgpack instead of JSON", 1, json.dumps(
            {"task_serializer": "msgpack", "result_serializer": "msgpack",
             "accept_content": ["json", "msgpack"]})))
    return variants


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    slots = 8 if ctx.small else 128
    shapes = ((1, 8), (2, 4)) if ctx.small else ((1, 128), (2, 64), (4, 32))
    databases = ("sqlite",) if ctx.small else ("sqlite", "postgres")
    rounds = 1 if ctx.small else 3
    ideal = slots / latency

    # 1. The shapes: 50-question chapters at 5 per call (10 calls each), two waves of chapters
    # (the `scaling` part's workload); one wave of 2-call chapters in the smoke run.
    targets, calls = (plan(slots * 10, slots, QPC) if ctx.small
                      else plan(slots * 2 * 50, slots * 2, QPC))
    configs = [(f"{w} × {t} threads, {db}", ClusterSpec(w, t, db, QPC))
               for db in databases for w, t in shapes]
    by_shape = _interleaved(ctx, configs, rounds, targets, calls, part, kind="shape")
    part.details += [
        (f"{len(targets)} chapters of {targets[0]} questions at {QPC} per call, {calls} calls "
         f"a run, latency {latency} s, ideal {slots} / {latency} s = {ideal:.0f} calls/s; "
         f"{rounds} interleaved round(s), fresh workers and database each run."), "",
        *table(HEADER, _rows(by_shape))]
    fractions: dict[tuple[int, int], list[float]] = {}
    for (label, spec), runs in zip(configs, by_shape.values()):
        m = _median_run(runs, Result.fraction_of_ideal)
        part.figures.append(Figure(
            f"{label}: throughput at {slots} slots as a fraction of {slots} / {latency} s "
            f"(median of {rounds})", m.calls_per_s(), ideal, "slots / latency", "calls/s",
            note=f"{spec.describe()}; each round: "
                 + ", ".join(fmt(r.fraction_of_ideal(), ".2f") for r in runs)))
        fractions.setdefault((spec.workers, spec.threads), []).append(
            m.fraction_of_ideal() or 0.0)
    # The best shape over both databases (the mean of their median fractions).
    best = max(fractions, key=lambda s: statistics.fmean(fractions[s]))
    for db in databases:
        one = _median_run(by_shape[f"{shapes[0][0]} × {shapes[0][1]} threads, {db}"],
                          Result.fraction_of_ideal)
        for w, t in shapes[1:]:
            other = _median_run(by_shape[f"{w} × {t} threads, {db}"], Result.fraction_of_ideal)
            part.figures.append(Figure(
                f"throughput, {w} × {t} vs {shapes[0][0]} × {shapes[0][1]} threads ({db})",
                other.calls_per_s(), one.calls_per_s(), f"{shapes[0][0]} process", "calls/s"))
    part.details += ["", f"Best shape in this run (mean of the databases' median fractions): "
                         f"**{best[0]} × {best[1]} threads**.", ""]

    # 2. Celery's per-task path at the best shape: one-call chapters (5 questions each), where
    # the receive, decode and ack of a task are paid once per call; eight per slot.
    chapters = slots * (2 if ctx.small else 8)
    targets, calls = plan(chapters * QPC, chapters, QPC)
    variants = celery_variants(ctx)
    configs = [(f"{label}, {db}", ClusterSpec(best[0], best[1], db, QPC, prefetch=prefetch,
                                              celery_conf=conf))
               for db in databases for label, prefetch, conf in variants]
    by_variant = _interleaved(ctx, configs, rounds, targets, calls, part, kind="celery")
    part.details += [
        (f"Celery's per-task settings at {best[0]} × {best[1]} threads: {chapters} one-call "
         f"chapters a run, latency {latency} s, {rounds} interleaved round(s). Workers run "
         "`celery -A bench.systems.tuned worker ...` and the producer `python -m "
         "bench.systems.tuned enqueue`, which apply `BENCH_CELERY_CONF` over examforge's own "
         "settings; `task_acks_late` stays on in every run."), "",
        *table(HEADER, _rows(by_variant))]
    for db in databases:
        base_runs = by_variant[f"{variants[0][0]}, {db}"]
        base_cpu = _median([r.cpu_ms_per_call() for r in base_runs])
        base_rate = _median([r.calls_per_s() for r in base_runs])
        for label, _, _ in variants[1:]:
            runs = by_variant[f"{label}, {db}"]
            part.figures.append(Figure(
                f"worker CPU per call, {label} vs defaults ({db}, median of {rounds})",
                _median([r.cpu_ms_per_call() for r in runs]), base_cpu, "defaults", "ms",
                "below 1 by more than the rounds' spread, to pay"))
            part.figures.append(Figure(
                f"throughput, {label} vs defaults ({db}, median of {rounds})",
                _median([r.calls_per_s() for r in runs]), base_rate, "defaults", "calls/s",
                "above 1 by more than the rounds' spread, to pay"))
    return part
