"""examforge embedded: `python -m producer run SLUG --concurrency C` on SQLite (no broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.measure import (
    child_pythonpath,
    REDIS_URL,
    ROOT,
    DbProbe,
    MockProbe,
    Result,
    proc_cpu_s,
    proc_rss_mb,
    stop_child,
    wait_child,
    wait_done,
    write_syllabus,
)


def ef_env(workdir: Path, db_url: str, mock_url: str, qpc: int, queue: str,
           redis_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of an examforge process under test: ours, minus any examforge setting
    of the caller's, plus the run's database, mock, broker and queue."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLM_", "DATABASE_", "BROKER_", "EXAMS_", "TASK_", "QUESTIONS_",
                                "WORKER_"))}
    env.update({
        "PYTHONPATH": child_pythonpath(), "DATABASE_URL": db_url, "EXAMS_DIR": str(workdir / "exams"),
        "LLM_BASE_URL": mock_url, "QUESTIONS_PER_CALL": str(qpc),
        "BROKER_URL": redis_url or REDIS_URL, "TASK_QUEUE": queue, "WORKER_SOFT_SHUTDOWN_S": "5",
        **extra,
    })
    return env


def run_embedded(mock: MockProbe, workdir: Path, targets: list[int], calls_needed: int,
                 qpc: int, slots: int) -> Result:
    slug = f"emb-{uuid.uuid4().hex[:6]}"
    db_url = f"sqlite:///{workdir / (slug + '.db')}"
    env = ef_env(workdir, db_url, mock.url, qpc, "unused")
    write_syllabus(workdir / "exams", slug, targets)
    cmd = [sys.executable, "-m", "producer", "run", slug, "--concurrency", str(slots)]
    res = Result("embedded", f"`producer run --concurrency {slots}`, SQLite",
                 sum(targets), calls_needed, chapters=len(targets), slots=slots,
                 latency_s=mock.latency_s,
                 command=f"python -m producer run {slug} --concurrency {slots}")
    db = DbProbe(db_url)
    mock.arm(slug)
    launched = time.monotonic()
    with open(workdir / f"{slug}.log", "wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    mock.watch = [proc.pid]
    try:
        done = wait_done(db, slug, len(targets), 900, [proc])
        cpu_done = proc_cpu_s(proc.pid)
        res.machine_cpu_s = mock.machine_cpu_since_first()
        res.rss_mb, res.peak_rss_mb = proc_rss_mb(proc.pid)
        usage = wait_child(proc, 120, started=done)
    finally:
        stop_child(proc)
    if usage.code != 0:
        res.error = f"exit {usage.code}: " + (workdir / f"{slug}.log").read_text()[-800:]
    res.window_s = done - mock.first_call_t if mock.first_call_t else None
    res.e2e_s = done - launched
    res.cpu_window_s = cpu_done - mock.cpu_at_first.get(proc.pid, 0.0)
    res.cpu_e2e_s = usage.cpu_s
    res.questions_stored = db.questions(slug)
    res.calls_paid, res.calls_other = mock.calls_for(slug)
    res.max_inflight = mock.max_inflight()
    res.notes.append(f"process exit {usage.wall_s:.2f} s after the last commit")
    if db.chapters_failed(slug):
        res.notes.append(f"{db.chapters_failed(slug)} chapters failed")
    db.close()
    return res
