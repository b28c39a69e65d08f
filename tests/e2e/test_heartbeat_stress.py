"""One worker, 128 threads, every call outliving the lease TTL more than twice over."""

from __future__ import annotations

import pytest

from harness import assert_stored_exactly_once, dump

pytestmark = pytest.mark.e2e


# SQLite only here (its WriterLock is what 128 committing threads could hold the heartbeat off
# behind): a stalled database and a pool whose every connection is busy are
# tests/integration/test_heartbeat.py's, on both databases and on PostgreSQL.
@pytest.mark.parametrize("database", ["sqlite"])
def test_128_threads_keep_their_leases_through_calls_longer_than_the_ttl(deploy, mock, database):
    mock.configure(latency_s=5.0)
    # With the default settings, near-duplicate checks included: 128 threads committing at
    # once must not hold the heartbeat off (on SQLite it goes before them: WriterLock).
    dep = deploy(database, lease_s=2, llm_timeout_s=20)
    chapters = [(f"ch-{i}", 10) for i in range(128)]
    dep.syllabus("big", chapters)
    assert dep.cli_in_process("enqueue", "big").returncode == 0
    dep.worker(128)
    report = dep.wait_done("big", 120)
    assert report["chapters"]["done"] == 128, dump(report) + dep.worker_logs()
    stats = mock.stats()
    assert stats["calls_total"] == 256 and report["usage"]["calls_wasted"] == 0, dump(stats)
    assert max(stats["max_inflight_by_chapter"].values()) == 1
    assert stats["max_inflight"] >= 100  # the calls really did overlap
    assert_stored_exactly_once(dep, "big", dict(chapters))
