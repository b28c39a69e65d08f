"""Prefetch: throughput at 32 and 128 slots with `WORKER_PREFETCH_MULTIPLIER` 1 against 4
(one worker, SQLite, one-call chapters at 0.5 s: the workload where the gap between one task
and the next matters most), and what a SIGKILL leaves behind with each: the messages a worker
reserved but never started are in Redis's unacked hash, so neither the broker nor the
reconciler's audit hands them to another worker until VISIBILITY_TIMEOUT_S (2 hours) has
passed. Chapters the killed worker had started are orphans the reconciler re-publishes as
soon as their lease expires (30 s), whatever the prefetch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

from bench.measure import ROOT, DbProbe, Result, plan, write_syllabus
from bench.report import fmt, table
from bench.suite import Context, Figure, PartResult
from bench.systems.distributed import Cluster, ClusterSpec, run_distributed

NAME = "prefetch"
TITLE = "worker_prefetch_multiplier 1 vs 4 at 32 and 128 slots, and after a SIGKILL"
QPC = 5


def stranded_after_kill(ctx: Context, prefetch: int, threads: int = 8) -> dict[str, int]:
    """SIGKILL a worker in the middle of an exam; count what it held."""
    import redis
    from kombu.transport.redis import Channel

    chapters = threads * 8
    spec = ClusterSpec(1, threads, "sqlite", QPC, prefetch=prefetch)
    ctx.mock.set_latency(5.0)  # every thread is in a call when the kill comes
    try:
        with Cluster(spec, ctx.mock, ctx.workdir, ctx.redis_url) as cluster:
            slug = f"kill-p{prefetch}-{uuid.uuid4().hex[:6]}"
            write_syllabus(ctx.workdir / "exams", slug, [QPC] * chapters)
            ctx.mock.arm(slug)
            subprocess.run([sys.executable, "-m", "producer", "enqueue", slug], cwd=ROOT,
                           env=cluster.env(), check=True, capture_output=True, timeout=120)
            deadline = time.monotonic() + 60
            while ctx.mock.server.stats()["inflight"] < threads:
                if time.monotonic() > deadline:
                    raise TimeoutError("the worker never filled its threads")
                time.sleep(0.05)
            time.sleep(0.5)  # let the worker top up its reservations
            os.kill(cluster.procs[0].pid, signal.SIGKILL)
            cluster.procs[0].wait(timeout=30)
            client = redis.Redis.from_url(ctx.redis_url)
            try:
                held = sum(1 for v in client.hvals(Channel.unacked_key)
                           if f"examforge:{slug}:".encode() in v)
                queued = int(client.llen(cluster.queue))
            finally:
                client.close()
            db = DbProbe(cluster.db_url, done_sql="SELECT count(*) FROM slice WHERE exam = %s"
                                                  " AND picked_at IS NOT NULL")
            started = db.chapters_finished(slug)
            db.close()
    finally:
        ctx.mock.set_latency(ctx.latency(0.5))
    return {"prefetch": prefetch, "threads": threads, "chapters": chapters,
            "held_unacked": held, "started": started, "stranded": held - started,
            "still_queued": queued}


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    latency = ctx.latency(0.5)
    ctx.mock.set_latency(latency)
    slot_counts = (32,) if ctx.small else (32, 128)
    got: dict[tuple[int, int], Result] = {}
    for slots in slot_counts:
        chapters = slots * (4 if ctx.small else 12)
        targets, calls = plan(chapters * QPC, chapters, QPC)
        for prefetch in (1, 4):
            r = run_distributed(f"pref-{slots}-{prefetch}", ctx.mock, ctx.workdir, targets,
                                calls, ClusterSpec(1, slots, "sqlite", QPC, prefetch=prefetch),
                                ctx.redis_url)
            r.system = f"{slots} slots, prefetch {prefetch}"
            got[(slots, prefetch)] = part.add_run(r, prefetch=prefetch)
    part.details += table(
        ("run", "calls/s", "fraction of slots/latency", "worker CPU ms/call", "cores busy",
         "machine cores busy", "paid / needed"),
        [[r.system, fmt(r.calls_per_s(), ".1f"), fmt(r.fraction_of_ideal(), ".3f"),
          fmt(r.cpu_ms_per_call(), ".2f"), fmt(r.cores_busy(), ".2f"),
          fmt(r.machine_cores_busy(), ".2f"), f"{r.calls_paid} / {r.calls_needed}"]
         for r in got.values()])
    for slots in slot_counts:
        part.figures.append(Figure(
            f"throughput at {slots} slots, prefetch 4 vs 1", got[(slots, 4)].calls_per_s(),
            got[(slots, 1)].calls_per_s(), "prefetch 1", "calls/s",
            "more than noise, to justify 4"))
    kills = [stranded_after_kill(ctx, p) for p in (1, 4)]
    part.runs += [{"kind": "sigkill", **k} for k in kills]
    part.details += ["", ("SIGKILL of a worker (8 threads, 5 s calls, 64 one-call chapters) "
                     "once all its threads are in a call:"), "",
                     *table(("prefetch", "messages it held (unacked)", "chapters it had started",
                             "reserved, never started: wait VISIBILITY_TIMEOUT_S",
                             "still in the queue"),
                            [[k["prefetch"], k["held_unacked"], k["started"], k["stranded"],
                              k["still_queued"]] for k in kills])]
    part.figures.append(Figure(
        "chapters stranded for VISIBILITY_TIMEOUT_S after a SIGKILL (8 threads), prefetch 4 "
        "vs 1", kills[1]["stranded"], kills[0]["stranded"] or None, "prefetch 1", "chapters",
        note=f"prefetch 1: {kills[0]['stranded']}, prefetch 4: {kills[1]['stranded']} (the "
             "ratio is n/a when prefetch 1 strands none)"))
    return part
