"""The chaos suite: real workers, a seeded fault mix at the provider, SIGKILLs, a frozen
worker, a broker restart that wipes the queue, and duplicate deliveries, all in one run.

CI runs a small version on SQLite and PostgreSQL. The large one:

    CHAOS_CHAPTERS=300 CHAOS_SEED=7 python -m pytest tests/e2e/test_chaos.py -k postgres -s

prints its figures (docs/explanations/tests.md quotes them).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import sqlite3
import time
from dataclasses import dataclass, field

import pytest
from sqlalchemy.engine import make_url

from storage.models import CallReason
from harness import Deployment, assert_stored_exactly_once, dump
from helpers import wait_for
from services import PrivateRedis

pytestmark = pytest.mark.e2e

CHAPTERS = int(os.environ.get("CHAOS_CHAPTERS", "20"))
SEED = int(os.environ.get("CHAOS_SEED", "2026"))
QUESTIONS = 40
# Each chapter in slices that run at once (two of 20 by default): the chaos applies to slices.
SLICE_QUESTIONS = int(os.environ.get("CHAOS_SLICE_QUESTIONS", "20"))
SLICES = -(-QUESTIONS // SLICE_QUESTIONS)
# Short, so that the freeze outlasts it: the frozen worker's leases lapse and are taken over,
# and a worker frozen mid-commit makes the others' commits wait past their leases' timestamps
# (a waiting holder keeps its locked row: storage.ledger.Ledger._holder_busy).
LEASE_S = 3
WORKERS = 3
THREADS = 4
# The run takes about 30 s; a hang fails at this, with stacks, before pytest's 300 s timeout.
WAIT_DONE_S = float(os.environ.get("CHAOS_WAIT_DONE_S", "180"))


@dataclass
class Chaos:
    """What was done to the system, and how many paid calls each act could have thrown away."""

    dep: Deployment
    rng: random.Random
    workers: list = field(default_factory=list)
    kills: int = 0
    # Calls in flight in killed or frozen workers (on SQLite, every worker's while a frozen one
    # held the write lock).
    at_risk: set[int] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def in_flight_ids(self, pid: int) -> set[int]:
        return {c["id"] for c in self.dep.calls("exam") if c["outcome"] == "in_flight"
                and f"/{pid}/" in c["worker"]}

    def in_flight_of(self, pid: int) -> int:
        return len(self.in_flight_ids(pid))

    def pick(self):  # type: ignore[no-untyped-def]
        """A random worker among those with calls in flight (an idle one proves nothing)."""
        alive = [w for w in self.workers if w.poll() is None]
        busy = [w for w in alive if self.in_flight_of(w.pid)]
        return self.rng.choice(busy or alive)

    def kill_one(self) -> None:
        time.sleep(self.rng.uniform(0, 0.5))  # a random moment, not a progress boundary
        victim = self.pick()
        victim.kill()
        victim.wait(10)
        lost = len(ids := self.in_flight_ids(victim.pid))
        self.at_risk |= ids
        self.kills += 1
        self.workers.remove(victim)
        self.workers.append(self.dep.worker(THREADS))
        self.log.append(f"SIGKILL pid {victim.pid} with {lost} calls in flight")

    def freeze_one(self, seconds: float) -> None:
        victim = self.pick()
        victim.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        frozen = len(ids := self.in_flight_ids(victim.pid))
        self.at_risk |= ids
        # SQLite has one writer: a worker frozen inside a write transaction stalls every
        # other process's writes, their heartbeats included, so their leases lapse on the
        # database clock and their calls in flight are thrown away at their commits
        # (storage.base.lease_fence; PostgreSQL's holders keep their locked rows instead).
        # Those calls are put at risk by the freeze too, but only when it froze the writer.
        stalled = self.writer_stalled()
        if stalled:
            self.at_risk |= {c["id"] for c in self.dep.calls("exam")
                             if c["outcome"] == "in_flight"}
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        victim.send_signal(signal.SIGCONT)
        self.log.append(f"SIGSTOP pid {victim.pid} for {seconds}s with {frozen} calls in flight"
                        + (", holding SQLite's write lock" if stalled else ""))

    def writer_stalled(self) -> bool:
        """Whether the database is SQLite and its writers' turn cannot be had for a second
        (every other writer holds it for milliseconds: the frozen worker holds it). The turn
        is two locks: examforge's flock on `<database>-writer` (storage.base.FileTurn), held a
        little before BEGIN IMMEDIATE and after COMMIT, and SQLite's own write lock."""
        url = make_url(self.dep.env["DATABASE_URL"])
        if url.get_backend_name() != "sqlite":
            return False
        database = os.path.abspath(str(url.database))
        with open(database + "-writer", "a+b") as turn:
            deadline = time.monotonic() + 1.0
            while True:
                try:
                    fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return True
                    time.sleep(0.005)
            try:
                conn = sqlite3.connect(database, timeout=1.0, isolation_level=None)
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("ROLLBACK")
                    return False
                except sqlite3.OperationalError as exc:
                    assert "locked" in str(exc), exc
                    return True
                finally:
                    conn.close()
            finally:
                fcntl.flock(turn, fcntl.LOCK_UN)


def _overlapping_batches(calls: list[dict]) -> set[tuple[int, int]]:
    """Pairs of calls for the same batch whose [started, finished] intervals overlap."""
    pairs = set()
    by_batch: dict[tuple[str, int], list[dict]] = {}
    for c in calls:
        by_batch.setdefault((c["chapter_id"], c["first_number"]), []).append(c)
    for same in by_batch.values():
        for i, a in enumerate(same):
            for b in same[i + 1:]:
                if a["started_at"] < (b["finished_at"] or float("inf")) and \
                        b["started_at"] < (a["finished_at"] or float("inf")):
                    pairs.add((a["id"], b["id"]))
    return pairs


def _progress(dep: Deployment) -> float:
    q = dep.status("exam")["questions"]
    return q["done"] / q["target"]


def _wait_progress(dep: Deployment, fraction: float) -> None:
    wait_for(lambda: _progress(dep) >= fraction, 120, f"{fraction:.0%} of the questions")


def _wait_done_or_dump(dep: Deployment, chaos: Chaos) -> dict:
    """The exam's report once every chapter is finished. Well before pytest's own timeout
    (which kills the test with nothing to read), fail with what a hang needs: the unfinished
    slices, every live process's stacks (py-spy) and the workers' logs."""
    from bench.measure import dump_stacks

    try:
        return dep.wait_done("exam", WAIT_DONE_S)
    except pytest.fail.Exception as exc:
        report = dep.status("exam")
        unfinished = [c for c in report["chapter_list"] if c["state"] != "done"]
        pytest.fail(f"{exc}\nevents: {chaos.log}\nunfinished: {dump(unfinished)}\n"
                    + dump_stacks([p for p in dep.procs if p.poll() is None])
                    + "\n" + dep.worker_logs(20000))


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_chaos(deploy, mock, tmp_path, database):
    rng = random.Random(SEED)
    broker = PrivateRedis(tmp_path).start()
    started = time.monotonic()
    try:
        mock.configure(latency_s=0.3, fault_rate=0.25, seed=SEED, retry_after_s=1.0,
                       stall_s=6.0)
        dep = deploy(database, broker_url=broker.url, lease_s=LEASE_S, reconcile_interval_s=1,
                     llm_timeout_s=2, retry_base_s=0.2, retry_max_s=2, max_reasks=6,
                     max_attempts=10, slice_questions=SLICE_QUESTIONS,
                     # A server without structured outputs: under json_schema the mock's
                     # constrained decoding would turn the invalid-output faults into good
                     # replies, and the chaos would not exercise the re-ask path.
                     llm_response_format="json_object")
        chapters = [(f"ch-{i:03d}", QUESTIONS) for i in range(CHAPTERS)]
        dep.syllabus("exam", chapters)
        assert dep.cli_in_process("enqueue", "exam").returncode == 0
        chaos = Chaos(dep, rng)
        chaos.workers = [dep.worker(THREADS) for _ in range(WORKERS)]
        dep.beat()

        _wait_progress(dep, 0.10)
        chaos.kill_one()
        _wait_progress(dep, 0.25)
        chaos.freeze_one(seconds=LEASE_S * 2.5)
        _wait_progress(dep, 0.35)
        broker.restart(down_s=1)  # no persistence: every queued and unacked message is gone
        chaos.log.append("redis restarted without persistence")
        _wait_progress(dep, 0.50)
        chaos.kill_one()
        _wait_progress(dep, 0.60)
        assert dep.cli_in_process("enqueue", "exam").returncode == 0  # duplicate deliveries
        chaos.log.append("enqueue run again: duplicate messages for every unfinished slice")
        _wait_progress(dep, 0.70)
        chaos.kill_one()

        report = _wait_done_or_dump(dep, chaos)
        elapsed = time.monotonic() - started
        stats = mock.stats()
        calls = dep.calls("exam")
        wasted = [c for c in calls if c["outcome"] == "wasted"]
        crash_wasted = [c for c in wasted if c["reason"] in (
            CallReason.crash_before_commit, CallReason.lease_lost)]
        summary = {
            "database": database, "chapters": CHAPTERS, "questions": CHAPTERS * QUESTIONS,
            "slices_per_chapter": SLICES, "seed": SEED, "elapsed_s": round(elapsed, 1), "paid_calls": stats["calls_total"],
            "calls_used": report["usage"]["calls_used"], "calls_failed": report["usage"][
                "calls_failed"], "calls_wasted": len(wasted),
            "wasted_by_crash_or_freeze": len(crash_wasted),
            "in_flight_at_kills_and_freeze": len(chaos.at_risk), "kills": chaos.kills,
            "faults": {k: v for k, v in stats["outcomes"].items() if k != "ok"},
            "events": chaos.log,
        }
        print("\nCHAOS " + json.dumps(summary))

        # Workers survived the broker restart (only the killed ones are gone).
        assert [w.pid for w in chaos.workers if w.poll() is not None] == [], dep.worker_logs()
        # Every chapter done exactly once, no duplicate rows.
        assert report["chapters"]["done"] == CHAPTERS, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "exam", dict(chapters))
        # No two paid calls for the same batch in flight at once, except a frozen or killed
        # worker's call (already sent, so the provider finishes it) and its successor's.
        assert _overlapping_batches(calls) <= {
            pair for pair in _overlapping_batches(calls) if set(pair) & chaos.at_risk}
        # Per slice: its own call and, after a kill or freeze, its successor's.
        assert max(stats["max_inflight_by_chapter"].values()) <= 2 * SLICES, dump(stats)
        assert all(len(c["slices"]) == SLICES for c in report["chapter_list"])
        # Thrown-away calls: at most those in flight at the kills and the freeze, all explained.
        unexplained = [c for c in crash_wasted if c["id"] not in chaos.at_risk]
        assert not unexplained, dump(unexplained) + dump(summary) + dep.worker_logs()
        assert all(c["reason"] for c in wasted + [c for c in calls if c["outcome"] == "failed"])
        assert not [c for c in calls if c["outcome"] == "in_flight"]
        assert stats["calls_total"] <= len(calls)  # every call that reached the provider is recorded
        # Retry-After was honoured, and no chapter went past its attempt cap.
        assert stats["retry_after_violations"] == [], dump(stats["retry_after_violations"])
        assert max(c["attempts_since_progress"] for c in report["chapter_list"]) <= 10
        assert sum(stats["outcomes"].values()) - stats["outcomes"].get("ok", 0) > 0.1 * len(calls)
    finally:
        broker.stop()


def test_the_chaos_tells_a_frozen_sqlite_writer(tmp_path):
    """`Chaos.writer_stalled`: True while another connection holds SQLite's write lock or
    another process examforge's writer turn (as a worker frozen inside or around a write
    transaction does), False when both are free, and never on PostgreSQL, whose holders keep
    their own rows."""
    path = tmp_path / "db.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x)")

    class Dep:
        env = {"DATABASE_URL": f"sqlite:///{path}"}

    chaos = Chaos(Dep(), random.Random(0))  # type: ignore[arg-type]
    assert chaos.writer_stalled() is False
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    assert chaos.writer_stalled() is True
    holder.execute("COMMIT")
    assert chaos.writer_stalled() is False
    holder.close()
    # Frozen between examforge's turn and BEGIN (or after COMMIT): the turn's flock is held.
    with open(f"{path}-writer", "a+b") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        assert chaos.writer_stalled() is True
        fcntl.flock(turn, fcntl.LOCK_UN)
    assert chaos.writer_stalled() is False
    Dep.env = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/postgres"}
    assert chaos.writer_stalled() is False
