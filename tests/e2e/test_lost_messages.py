"""Messages the broker lost while its epoch survived: the queue trimmed (a failover to a replica
that lagged behind), its key deleted, `celery purge`, and eviction under an evicting
`maxmemory-policy`. Real Redis (a private redis-server), real workers and beat, the mock
provider: every chapter completes, each question is stored once, and the provider is paid for
exactly the calls the questions need. A deep backlog shows no re-publication storm."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from harness import Deployment, assert_stored_exactly_once, dump
from services import PrivateRedis

pytestmark = pytest.mark.e2e

CHAPTERS = 20
QUESTIONS = 5  # one call each


def _start(deploy, tmp_path, *redis_args: str) -> tuple[Deployment, PrivateRedis]:
    broker = PrivateRedis(tmp_path, extra_args=redis_args).start()
    dep = deploy("sqlite", broker_url=broker.url, reconcile_interval_s=1)
    dep.syllabus("exam", [(f"ch-{i:02d}", QUESTIONS) for i in range(CHAPTERS)])
    enq = dep.cli_in_process("enqueue", "exam")
    assert enq.returncode == 0, enq.stderr
    assert broker.client().llen(dep.env["TASK_QUEUE"]) == CHAPTERS
    return dep, broker


def _finish(dep: Deployment, mock, lost: int) -> None:
    started = time.monotonic()
    dep.worker(4)
    dep.worker(4)
    dep.beat()
    report = dep.wait_done("exam", 90)
    # The recovery table (docs/explanations/guarantees.md) quotes this (RECONCILE_INTERVAL_S=1 here).
    print("\nLOST " + json.dumps({"lost": lost, "workers_start_to_done_s":
                                  round(time.monotonic() - started, 1)}))
    assert report["chapters"]["done"] == CHAPTERS, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "exam", {f"ch-{i:02d}": QUESTIONS for i in range(CHAPTERS)})
    assert mock.stats()["calls_total"] == CHAPTERS * math.ceil(QUESTIONS / 5)
    requeued = [c for c in report["chapter_list"] if c["requeues"]]
    assert len(requeued) >= lost, dump(report)
    assert all(c["requeue_code"] == "message_lost" for c in requeued), dump(requeued)
    status = dep.cli_in_process("status", "exam")
    assert "reconciler: re-published" in status.stdout and "message_lost" in status.stdout


@pytest.mark.parametrize("kept", ["oldest", "newest"])
def test_half_the_queue_lost_in_a_failover_completes(deploy, mock, tmp_path, kept):
    dep, broker = _start(deploy, tmp_path)
    try:
        queue = dep.env["TASK_QUEUE"]
        # LPUSH puts the newest message at index 0. A lagging replica lacks the newest writes
        # (keep the oldest ten); the other half is tried too.
        start, end = (CHAPTERS // 2, -1) if kept == "oldest" else (0, CHAPTERS // 2 - 1)
        broker.client().ltrim(queue, start, end)
        assert broker.client().llen(queue) == CHAPTERS // 2
        _finish(dep, mock, lost=CHAPTERS // 2)
    finally:
        broker.stop()


def test_celery_purge_while_chapters_wait_completes_as_a_deleted_queue_key_does(
        deploy, mock, tmp_path):
    # Formerly two tests, `celery purge` and the queue's key deleted, with the same broker
    # state after (Redis drops an empty list's key) and the same recovery: one run shows both.
    dep, broker = _start(deploy, tmp_path)
    try:
        purge = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tasks", "purge", "-f",
             "-Q", dep.env["TASK_QUEUE"]],
            cwd=dep.workdir, env=dep.env, capture_output=True, text=True, timeout=60)
        assert purge.returncode == 0, purge.stderr
        assert broker.client().llen(dep.env["TASK_QUEUE"]) == 0
        assert not broker.client().exists(dep.env["TASK_QUEUE"])  # the key is gone
        _finish(dep, mock, lost=CHAPTERS)
    finally:
        broker.stop()


def test_the_queue_evicted_under_maxmemory_allkeys_lru_completes(deploy, mock, tmp_path):
    dep, broker = _start(deploy, tmp_path, "--maxmemory", "4mb",
                         "--maxmemory-policy", "allkeys-lru")
    try:
        client = broker.client()
        queue = dep.env["TASK_QUEUE"]
        blob = b"x" * 20_000
        n = 0
        # Memory pressure: Redis evicts keys until the chapter queue itself is gone.
        while client.exists(queue):
            client.set(f"cache:{n}", blob)
            n += 1
            assert n < 5_000, "the queue was never evicted"
        _finish_evicted(dep, mock)
        doctor = dep.cli("doctor")
        assert doctor.returncode == 1 and "allkeys-lru" in doctor.stdout, doctor.stdout
    finally:
        broker.stop()


def _finish_evicted(dep: Deployment, mock) -> None:
    # The epoch key may have been evicted too, in which case the epoch rule re-enqueues
    # everything instead: either way every chapter must complete exactly once.
    dep.worker(4)
    dep.worker(4)
    dep.beat()
    report = dep.wait_done("exam", 90)
    assert report["chapters"]["done"] == CHAPTERS, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "exam", {f"ch-{i:02d}": QUESTIONS for i in range(CHAPTERS)})
    assert mock.stats()["calls_total"] == CHAPTERS
    assert all(c["requeues"] for c in report["chapter_list"]), dump(report)


def test_a_deep_backlog_is_never_re_published(deploy, mock, tmp_path):
    """Thousands of chapters waiting their turn behind slow workers, with the reconciler
    running every second: not one extra publish, and each chapter paid for once."""
    chapters = 1500
    broker = PrivateRedis(tmp_path).start()
    try:
        mock.configure(latency_s=0.02)
        # Leases of 15 s: the test is about waiting messages, and a lease lost to a starved
        # heartbeat on an overloaded machine (4 s, load 11) is a re-publish it rightly makes.
        dep = deploy("sqlite", broker_url=broker.url, reconcile_interval_s=1, lease_s=15)
        dep.syllabus("exam", [(f"ch-{i:04d}", 1) for i in range(chapters)])
        assert dep.cli_in_process("enqueue", "exam", timeout=120).returncode == 0
        dep.worker(4)
        dep.beat()
        report = dep.wait_done("exam", 240)
        assert report["chapters"]["done"] == chapters, dump(report)
        assert sum(c["requeues"] for c in report["chapter_list"]) == 0, dump(
            [c for c in report["chapter_list"] if c["requeues"]])
        assert mock.stats()["calls_total"] == chapters
        beat_log = "\n".join(p.read_text() for p in dep.workdir.glob("worker-beat-*.log"))
        passes = beat_log.count("examforge.reconcile")
        assert passes >= 5, beat_log[-2000:]  # the reconciler ran many times meanwhile
    finally:
        broker.stop()


def test_doctor_passes_on_a_safe_broker(deploy, tmp_path):
    broker = PrivateRedis(tmp_path, extra_args=("--maxmemory-policy", "noeviction",
                                                "--appendonly", "yes")).start()
    try:
        dep = deploy("sqlite", broker_url=broker.url)
        assert dep.cli_in_process("migrate").returncode == 0  # doctor only reads the database
        doctor = dep.cli("doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "noeviction" in doctor.stdout
    finally:
        broker.stop()
