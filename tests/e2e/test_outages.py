"""Recovery without a human: the reconciler, a wiped or restarted broker, a database outage
(connections cut, and a real PostgreSQL crash and restart), and the original message of a
killed worker redelivered after the visibility timeout."""

from __future__ import annotations

import re

import threading
import time

import pytest
import redis

from harness import assert_stored_exactly_once, dump, used_batches
from helpers import wait_for
from services import PrivatePostgres, PrivateRedis, TcpProxy

pytestmark = pytest.mark.e2e


def test_a_killed_workers_chapters_are_retaken_within_lease_plus_reconcile_interval(
        deploy, mock):
    mock.configure(latency_s=0.3)
    dep = deploy("sqlite", lease_s=4, reconcile_interval_s=2)
    chapters = [(f"ch-{i}", 40) for i in range(2)]
    dep.syllabus("demo", chapters)
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    victim = dep.worker(2)
    wait_for(lambda: dep.status("demo")["questions"]["done"] >= 10, 30, "progress")
    dep.worker(2)  # an idle worker that has nothing queued: only the reconciler can help
    dep.beat()
    time.sleep(1)
    dep.kill(victim)
    killed_at = time.monotonic()
    attempts = {c["id"]: c["attempts"] for c in dep.status("demo")["chapter_list"]}
    retaken = wait_for(lambda: all(
        c["attempts"] > attempts[c["id"]] or c["state"] == "done"
        for c in dep.status("demo")["chapter_list"]), 30, "both chapters retaken")
    took = time.monotonic() - killed_at
    # LEASE_S + RECONCILE_INTERVAL_S + one heartbeat of grace, plus process scheduling slack.
    assert retaken and took <= 4 + 2 + 1 + 3, f"took {took:.1f}s"
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 2
    assert_stored_exactly_once(dep, "demo", dict(chapters))


@pytest.mark.parametrize("how", ["flushall", "restart"])
def test_a_broker_that_loses_everything_mid_run_still_completes_every_chapter(
        deploy, mock, tmp_path, how):
    broker = PrivateRedis(tmp_path).start()
    try:
        mock.configure(latency_s=0.3)
        dep = deploy("sqlite", broker_url=broker.url, lease_s=4, reconcile_interval_s=2)
        chapters = [(f"ch-{i}", 20) for i in range(10)]
        dep.syllabus("demo", chapters)
        assert dep.cli_in_process("enqueue", "demo").returncode == 0
        dep.worker(3)
        dep.worker(3)
        dep.beat()
        wait_for(lambda: dep.status("demo")["questions"]["done"] >= 20, 30, "progress")
        if how == "flushall":
            redis.Redis.from_url(broker.url).flushall()
        else:
            broker.restart(down_s=2)
        report = dep.wait_done("demo", 120)
        assert report["chapters"]["done"] == 10, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "demo", dict(chapters))
        calls = dep.calls("demo")
        assert len(used_batches(calls)) == len(set(used_batches(calls)))
        assert mock.stats()["calls_total"] == len(calls)
        wasted = [c for c in calls if c["outcome"] == "wasted"]
        assert all(c["reason"] for c in wasted)
    finally:
        broker.stop()


def test_workers_reconnect_after_a_broker_restart(deploy, mock, tmp_path):
    """Redis goes away for 3 s (keeping its data this time): workers reconnect and finish."""
    from tasks import app

    assert app.conf.worker_cancel_long_running_tasks_on_connection_loss is True
    broker = PrivateRedis(tmp_path).start()
    proxy = TcpProxy("127.0.0.1", broker.port).start()
    try:
        mock.configure(latency_s=0.3)
        url = f"redis://127.0.0.1:{proxy.port}/0"
        dep = deploy("sqlite", broker_url=url, lease_s=4, reconcile_interval_s=2)
        chapters = [(f"ch-{i}", 20) for i in range(6)]
        dep.syllabus("demo", chapters)
        assert dep.cli_in_process("enqueue", "demo").returncode == 0
        dep.worker(3)
        wait_for(lambda: dep.status("demo")["questions"]["done"] >= 10, 30, "progress")
        proxy.cut()
        time.sleep(3)
        proxy.restore()
        report = dep.wait_done("demo", 120)
        assert report["chapters"]["done"] == 6, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "demo", dict(chapters))
        assert "Connection to broker lost" in dep.worker_logs(tail_chars=None)
    finally:
        proxy.stop()
        broker.stop()


class PartialDoneWatcher:
    """Reads status every 0.1 s in a thread while it is open, and keeps every chapter it ever
    sees marked done with fewer questions than its target. Reads that fail (the database is
    down) are skipped."""

    def __init__(self, dep, slug: str) -> None:  # type: ignore[no-untyped-def]
        self.dep, self.slug = dep, slug
        self.partial: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                chapters = self.dep.status(self.slug)["chapter_list"]
            except Exception:  # the server is down: nothing to read
                chapters = []
            self.partial += [c for c in chapters if c["state"] == "done"
                             and c["questions"]["done"] < c["questions"]["target"]]
            time.sleep(0.1)

    def __enter__(self) -> "PartialDoneWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_database_outage_mid_run_retries_and_never_marks_a_partial_chapter_done(
        deploy, mock, pg_url):
    host_port = pg_url.split("@", 1)[1].split("/", 1)[0]
    proxy = TcpProxy("127.0.0.1", int(host_port.rsplit(":", 1)[1])).start()
    try:
        mock.configure(latency_s=0.3)
        via_proxy = pg_url.replace(host_port, f"127.0.0.1:{proxy.port}")
        dep = deploy("sqlite", database_url=via_proxy, lease_s=6, reconcile_interval_s=2)
        direct = deploy("sqlite", database_url=pg_url)  # the test's own view, not cut
        chapters = [(f"ch-{i}", 30) for i in range(6)]
        dep.syllabus("demo", chapters)
        assert dep.cli_in_process("enqueue", "demo").returncode == 0
        dep.worker(3)
        dep.beat()
        wait_for(lambda: direct.status("demo")["questions"]["done"] >= 20, 30, "progress")
        with PartialDoneWatcher(direct, "demo") as watcher:
            proxy.cut()
            time.sleep(3)
            proxy.restore()
            report = direct.wait_done("demo", 120)
        assert watcher.partial == []
        assert report["chapters"]["done"] == 6, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(direct, "demo", dict(chapters))
    finally:
        proxy.stop()


def test_a_real_postgresql_crash_and_restart_mid_run_loses_nothing(deploy, mock):
    # The server itself goes down hard (pg_ctl -m immediate: backends killed, open transactions
    # lost, WAL replayed on start), not just the connections to it.
    server = PrivatePostgres().start()
    try:
        mock.configure(latency_s=0.3)
        dep = deploy("sqlite", database_url=server.url, lease_s=6, reconcile_interval_s=2)
        chapters = [(f"ch-{i}", 30) for i in range(6)]
        dep.syllabus("demo", chapters)
        assert dep.cli_in_process("enqueue", "demo").returncode == 0
        dep.worker(3)
        dep.beat()
        wait_for(lambda: dep.status("demo")["questions"]["done"] >= 20, 30, "progress")
        with PartialDoneWatcher(dep, "demo") as watcher:
            in_flight = dep.status("demo")["usage"]["calls_in_flight"]
            server.restart(down_s=3)
            report = dep.wait_done("demo", 120)
        assert in_flight > 0  # the crash really hit running calls
        assert watcher.partial == []
        assert report["chapters"]["done"] == 6, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "demo", dict(chapters))
        # Workers went on by themselves, and every paid call that stored nothing says why.
        wasted = [c for c in dep.calls("demo") if c["outcome"] != "used"]
        assert all(c["reason"] for c in wasted), wasted
        # At most the calls in flight when the server died: one per worker thread.
        assert len(wasted) <= 3, wasted
        assert report["usage"]["calls_in_flight"] == 0
    finally:
        server.stop()


def test_the_original_message_redelivered_after_the_visibility_timeout_is_a_no_op(
        deploy, mock, redis_url):
    mock.configure(latency_s=0.3)
    # The order this test is about: the reconciler re-publishes the slice once the dead
    # worker's lease (3 s) lapses, that copy finishes it, and only then does the original
    # message come back. Waiting for a real visibility timeout made that order a race with
    # a loaded machine's start-up times, so the timeout is long (60 s) and the test moves
    # the original's delivery time back past it once the copy is done: kombu's next restore
    # pass (every 10 s at this timeout) finds it overdue, as it would after 60 s.
    dep = deploy("sqlite", lease_s=3, reconcile_interval_s=1, visibility_timeout_s=60,
                 retry_max_s=1, retry_after_max_s=1)
    dep.syllabus("demo", [("only", 30)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    victim = dep.worker(1)
    wait_for(lambda: dep.status("demo")["questions"]["done"] >= 10, 30, "progress")
    client = redis.Redis.from_url(redis_url)
    task_id = b"examforge:demo:only:0"

    def deliveries() -> list[bytes]:  # the task's messages out with a worker
        return [tag for tag, raw in client.hgetall("unacked").items() if task_id in raw]

    (original,) = deliveries()  # the victim's (beat's own are in and out)
    dep.kill(victim)
    dep.worker(2)
    dep.beat()
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 1
    calls = mock.stats()["calls_total"]
    assert original in deliveries(), dep.worker_logs()  # still out there
    client.zadd("unacked_index", {original: 0})  # delivered long ago: past the timeout
    # kombu restores it; the worker runs it, and any copy a "busy" claim retried: no-ops.
    wait_for(lambda: not deliveries() and client.llen(dep.env["TASK_QUEUE"]) == 0, 40,
             "the original message to be restored and consumed")

    def outcomes() -> list[str]:
        return re.findall(r"generate_chapter\[examforge:demo:only:0\] succeeded in \S+ "
                          r"\{'outcome': '(\w+)'", dep.worker_logs(tail_chars=None))

    # A deadline for a loaded machine: the log line comes after the task's claim.
    wait_for(lambda: outcomes()[-1:] == ["skipped"], 60,
             "the redelivered task to run as a no-op")
    assert outcomes()[outcomes().index("done") + 1:] == ["skipped"] * (
        len(outcomes()) - outcomes().index("done") - 1), outcomes()
    assert mock.stats()["calls_total"] == calls
    assert_stored_exactly_once(dep, "demo", {"only": 30})
