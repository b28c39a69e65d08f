"""A Redis failover through Sentinel (issue 34), on loopback: a master, a replica that lags
behind it, and a Sentinel that promotes the replica when the master is SIGKILLed mid-run.

One run shows both cases of the issue. An exam runs under a shared rate limit (LLM_RPM, the
mock's own RPM the same) with workers, beat and the limiter all reaching Redis through the
Sentinel. Its messages were replicated; then the replication link is cut (the replica lags)
and a second exam is enqueued: `enqueue` returns 0, its messages acknowledged by the master
alone. The master is killed, the Sentinel promotes the replica, which never had the second
exam's messages. What must hold:

- every question of both exams stored once;
- no paid call beyond those in flight at the kill (the mock counts every call);
- the provider's limit still respected afterwards (nothing refused, no burst past it);
- the second exam's chapters re-published by the reconciler (reason `message_lost`).

The times are printed (FAILOVER {...}) and quoted in docs/how-to/high-availability.md.
"""

from __future__ import annotations

import json
import math
import signal
import time

import pytest

from harness import assert_stored_exactly_once, dump, used_batches
from helpers import wait_for
from services import PrivateRedis, PrivateSentinel

pytestmark = pytest.mark.e2e

RPM = 300  # 5 calls a second, shared by every worker thread
# One call each (5 questions a call): 6 s of calls at the limit, so that the queue still holds
# most of them when the second exam is enqueued behind them, and the kill comes before any
# worker takes one of its messages.
MAIN = {f"ch-{i:02d}": 5 for i in range(30)}
LATE = {f"late-{i}": 5 for i in range(4)}  # one call each, enqueued while the replica lags


def _in_sync(master: PrivateRedis, replica: PrivateRedis) -> bool:
    offset = master.client().info("replication")["master_repl_offset"]
    info = replica.client().info("replication")
    return info.get("master_link_status") == "up" and info.get(
        "slave_repl_offset", -1) >= offset


def _cut_replication(master: PrivateRedis) -> None:
    """The replica lags from now on: its user is switched off and its link closed, so it
    cannot reconnect. (A proxy on the link would not do: Sentinel sees a replica of another
    address than the master's and points it back at the master.)"""
    client = master.client()
    client.acl_setuser("repl", enabled=False)
    client.client_kill_filter(_type="replica")


def test_a_sentinel_failover_to_a_lagging_replica_loses_no_question_and_pays_nothing_twice(
        deploy, mock, tmp_path):
    # The replica replicates as a user of its own, so that the test can cut it off alone.
    master = PrivateRedis(tmp_path, extra_args=(
        "--repl-diskless-sync-delay", "0", "--user", "repl", "on", ">repl-pw", "~*", "&*",
        "+@all")).start()
    replica = PrivateRedis(tmp_path, extra_args=(
        "--replicaof", "127.0.0.1", str(master.port), "--masteruser", "repl",
        "--masterauth", "repl-pw")).start()
    # The Sentinel asks a password of its own: BROKER_SENTINEL_PASSWORD, for kombu and redis-py.
    # Down after 2 s without a reply: 1 s would fail a master over that a loaded CI machine
    # merely kept waiting.
    sentinel = PrivateSentinel(tmp_path, master.port, down_after_ms=2000,
                               password="sentinel-pw").start()
    try:
        wait_for(lambda: _in_sync(master, replica), 15, "the replica in sync")
        wait_for(lambda: sentinel.replicas_known() >= 1, 15, "the Sentinel to see the replica")
        mock.configure(latency_s=0.3, rpm=RPM)
        dep = deploy("postgres", broker_url=sentinel.url, broker_sentinel_master=sentinel.name,
                     broker_sentinel_password="sentinel-pw", llm_rpm=RPM,
                     reconcile_interval_s=1, lease_s=4)
        dep.syllabus("exam", list(MAIN.items()))
        dep.syllabus("late", list(LATE.items()))
        enq = dep.cli_in_process("enqueue", "exam")
        assert enq.returncode == 0, enq.stderr
        doctor = dep.cli("doctor")
        assert f"ok   broker sentinel 127.0.0.1:{sentinel.port}: master 'ef' at " \
               f"127.0.0.1:{master.port}, 1 replicas" in doctor.stdout, doctor.stdout
        assert "ok   rate limiter: reaches the broker's master through Sentinel" in doctor.stdout
        workers = [dep.worker(3), dep.worker(3)]
        dep.beat()
        wait_for(lambda: dep.status("exam")["questions"]["done"] >= 20, 60, "progress")
        wait_for(lambda: _in_sync(master, replica), 15, "the replica in sync")

        _cut_replication(master)  # from here the replica lags: nothing more reaches it
        # The workers take nothing from here to the kill (SIGSTOP, for a second or two: their
        # leases are 4 s), so that the late exam's messages are on the old master alone, as a
        # failover finds them; running, a worker on a loaded machine took all four first.
        for w in workers:
            w.send_signal(signal.SIGSTOP)
        late = dep.cli_in_process("enqueue", "late")
        assert late.returncode == 0, late.stderr  # acknowledged by the old master alone
        queue = dep.env["TASK_QUEUE"]
        assert not [m for m in replica.client().lrange(queue, 0, -1) if b"examforge:late:" in m]
        stats = mock.stats()
        # The calls in flight: at the provider, or back and not yet committed (the ledger's).
        in_flight = max(stats["inflight"], len([
            c for c in dep.calls("exam") + dep.calls("late") if c["outcome"] == "in_flight"]))
        refused_before = stats["outcomes"].get("rate_limited", 0)
        master.stop()  # SIGKILL
        killed_at = time.monotonic()
        for w in workers:
            w.send_signal(signal.SIGCONT)
        # No worker had started a chapter of the late exam at the kill. (One it had taken off
        # the queue just before its SIGSTOP, while it waited on the queue, it starts now: that
        # chapter is not lost, and goes on from the database.)
        assert all(c["state"] == "pending" and not c["attempts"]
                   for c in dep.status("late")["chapter_list"]), dump(dep.status("late"))
        # A call admitted between the two reads is in flight now (a reply takes 0.3 s).
        in_flight = max(in_flight, mock.stats()["inflight"])
        # The mock's own clock: the last call it admitted before the kill.
        last_s = stats["admitted_at"][-1]

        try:
            wait_for(lambda: sentinel.master() == ("127.0.0.1", replica.port), 30,
                     "the Sentinel to promote the replica")
        except BaseException:  # pytest.fail's Failed is not an Exception
            print(sentinel.log.read_text()[-3000:])
            raise
        promoted_s = time.monotonic() - killed_at
        wait_for(lambda: any(t > last_s for t in mock.stats()["admitted_at"]), 60,
                 "a paid call after the failover")
        calls_resumed_s = time.monotonic() - killed_at
        wait_for(lambda: all(c["requeues"] or c["attempts"]
                             for c in dep.status("late")["chapter_list"]), 60,
                 "the reconciler to re-publish the lost exam's chapters")
        republished_s = time.monotonic() - killed_at
        report = dep.wait_done("exam", 60)
        late_report = dep.wait_done("late", 60)
        late_done_s = time.monotonic() - killed_at

        print("\nFAILOVER " + json.dumps({
            "promoted_s": round(promoted_s, 1), "calls_resumed_s": round(calls_resumed_s, 1),
            "lost_republished_s": round(republished_s, 1),
            "lost_exam_done_s": round(late_done_s, 1), "in_flight_at_kill": in_flight}))
        assert report["chapters"]["done"] == len(MAIN), dump(report) + dep.worker_logs()
        assert late_report["chapters"]["done"] == len(LATE), dump(late_report) + \
            dep.worker_logs()
        assert_stored_exactly_once(dep, "exam", MAIN)
        assert_stored_exactly_once(dep, "late", LATE)
        # The replica never had the late exam's messages: the reconciler published them again.
        requeued = [c for c in late_report["chapter_list"] if c["requeues"]]
        assert requeued, dump(late_report)
        assert all(c["requeue_code"] == "message_lost" for c in requeued), dump(requeued)

        # Paid calls: what the questions need, plus at most those in flight at the kill, and
        # every one of them in the ledger.
        needed = sum(math.ceil(n / 5) for n in (*MAIN.values(), *LATE.values()))
        calls = dep.calls("exam") + dep.calls("late")
        assert mock.stats()["calls_total"] == len(calls)
        assert len(used_batches(calls)) == len(set(used_batches(calls))) == needed
        assert len(calls) - needed <= in_flight, dump(calls)
        assert all(c["reason"] for c in calls if c["outcome"] != "used"), dump(calls)

        # The limit after the failover: nothing refused, and no window busier than the rate
        # plus the limiter's burst (one second's worth) allows.
        after = mock.stats()
        assert after["outcomes"].get("rate_limited", 0) - refused_before <= 1, after["outcomes"]
        later = [t for t in after["admitted_at"] if t > last_s]
        per_s = RPM / 60
        for i, t in enumerate(later):
            in_window = sum(1 for u in later[i:] if u - t < 2.0)
            assert in_window <= per_s * 2 + per_s + 1, later
        # A command run now finds the new master, and re-enqueueing a finished exam pays
        # for nothing.
        paid = mock.stats()["calls_total"]
        again = dep.cli_in_process("enqueue", "exam")
        assert again.returncode == 0 and "0 enqueued" in again.stdout, again.stdout + \
            again.stderr
        assert mock.stats()["calls_total"] == paid
        # Workers and beat followed the Sentinel by themselves: none restarted, none died.
        # (The limiter followed it too: it admitted the calls after the failover within the
        # rate, above. Whether it was asked during the 2 to 4 s without a master, and so
        # logged "rate limiter unreachable", depends on the timing: test_spend's Redis restart
        # asserts that warning.)
        logs = dep.worker_logs(None)
        assert "Connection to broker lost" in logs
        assert all(p.poll() is None for p in dep.procs)
    finally:
        sentinel.stop()
        replica.stop()
        master.stop()
