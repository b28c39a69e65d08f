"""A PostgreSQL failover (issue 34): a primary and a streaming replica on loopback, made with
PostgreSQL's own tools (initdb, pg_basebackup -R, pg_ctl promote). Workers, beat and every
command reach them through one multi-host DATABASE_URL with target_session_attrs=read-write.
Mid-run, with leases held and commits in flight, the primary is stopped with `-m immediate`
and the replica promoted; nothing is restarted.

Two cases:

- `synchronous` (synchronous_standby_names = '*', the configuration the docs advise): a commit
  is acknowledged once the replica has it. The replica's clock runs 3 s ahead (libfaketime):
  the database clock changes machines at the switch, and every lease looks 3 s shorter.
  Every question is stored once, every paid call is in the ledger, and the calls thrown away
  are at most those in flight at the stop.
- `lagging` (asynchronous replication, the replica cut off from the primary's WAL for the
  last commits before the stop): what the primary acknowledged and never sent is gone after
  the promotion: questions, and the ledger rows of the calls that paid for them. The questions
  are made again (the reconciler re-publishes the slices whose message was acked), each
  stored once; the ledger is short by exactly the rows that were lost, no more. That is what
  asynchronous replication costs, and docs/how-to/high-availability.md says so.

The times are printed (PG_FAILOVER {...}) and quoted in the docs.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time

import psycopg
import pytest

from harness import assert_stored_exactly_once, dump, used_batches
from helpers import wait_for
from services import PrivatePostgres

pytestmark = pytest.mark.e2e

CHAPTERS = {f"ch-{i}": 30 for i in range(8)}  # six calls each (5 questions a call)


def _count(port: int, sql: str) -> int:
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                         connect_timeout=3) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _clock_ahead(seconds: int) -> dict[str, str]:
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not found:
        message = "libfaketime is not installed (apt-get install faketime)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return {"LD_PRELOAD": found[0], "FAKETIME": f"+{seconds}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


QUESTIONS = "SELECT count(*) FROM question WHERE exam = 'exam'"
LEDGER = "SELECT count(*) FROM call WHERE exam = 'exam'"
IN_FLIGHT = "SELECT count(*) FROM call WHERE exam = 'exam' AND outcome = 'in_flight'"


@pytest.mark.parametrize("replication", ["synchronous", "lagging"])
def test_a_promoted_replica_takes_over_mid_run_with_nothing_stored_twice(
        deploy, mock, replication):
    primary = PrivatePostgres().start()
    # The database clock changes machines at the switch: the replica's runs 3 s ahead (in
    # the synchronous case), so every lease looks 3 s shorter the moment it is promoted.
    replica = primary.replica(env=_clock_ahead(3) if replication == "synchronous" else None)
    try:
        if replication == "synchronous":
            primary.configure(synchronous_standby_names="*").reload()
        url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}"
               "/postgres?target_session_attrs=read-write")
        mock.configure(latency_s=0.3)
        dep = deploy("sqlite", database_url=url, lease_s=6, reconcile_interval_s=1)
        dep.syllabus("exam", list(CHAPTERS.items()))
        assert dep.cli("enqueue", "exam").returncode == 0
        dep.worker(3)
        dep.worker(3)
        dep.beat()
        wait_for(lambda: dep.status("exam")["questions"]["done"] >= 40
                 and dep.status("exam")["usage"]["calls_in_flight"] > 0, 60,
                 "progress, with calls in flight")
        if replication == "lagging":
            replica.stop_streaming()
            stopped_at = _count(primary.port, QUESTIONS)
            # Commits the primary acknowledges from here are never replicated.
            wait_for(lambda: _count(primary.port, QUESTIONS) >= stopped_at + 15, 30,
                     "commits the replica never receives")
        questions_acked = _count(primary.port, QUESTIONS)  # acknowledged before the stop
        # The calls in flight at the stop, as the ledger has them (a call whose reply came
        # and whose commit had not is one: the provider no longer counts it)...
        in_flight = _count(primary.port, IN_FLIGHT)
        primary.crash()  # pg_ctl stop -m immediate
        stopped = time.monotonic()
        # ... and any started since (a reply takes 0.3 s: still at the provider now).
        in_flight = max(in_flight, mock.stats()["inflight"])
        # What the replica holds, read before the promotion lets anyone write to it: once it
        # has replayed all the WAL it received.
        wait_for(lambda: _count(replica.port, "SELECT (pg_last_wal_receive_lsn() IS NULL OR "
                                "pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn())::int"),
                 10, "the replica to replay what it received")
        base, ledger_base = _count(replica.port, QUESTIONS), _count(replica.port, LEDGER)
        replica.promote()
        promoted_s = time.monotonic() - stopped
        wait_for(lambda: _count(replica.port, QUESTIONS) > base, 60,
                 "a question committed on the promoted replica")
        commits_resumed_s = time.monotonic() - stopped
        # A command started now finds the new primary by itself.
        status = dep.cli("status", "exam")
        assert status.returncode == 0, status.stderr
        report = dep.wait_done("exam", 90)
        done_s = time.monotonic() - stopped
        assert report["chapters"]["done"] == len(CHAPTERS), dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "exam", CHAPTERS)
        calls = dep.calls("exam")
        # The workers and beat went on by themselves.
        assert all(p.poll() is None for p in dep.procs)

        # What the old primary held when it stopped, read once nothing else can reach it:
        # back up, and listed first in DATABASE_URL, it takes writes again (a split brain;
        # the docs say to rewind it into a replica before it returns).
        dep.stop_all()
        primary.start()
        lost_questions = _count(primary.port, QUESTIONS) - base
        lost_ledger = _count(primary.port, LEDGER) - ledger_base
        print("\nPG_FAILOVER " + json.dumps({
            "replication": replication, "promoted_s": round(promoted_s, 1),
            "commits_resumed_s": round(commits_resumed_s, 1), "done_s": round(done_s, 1),
            "in_flight_at_stop": in_flight, "lost_questions": lost_questions,
            "lost_ledger_rows": lost_ledger}))
        needed = sum(math.ceil(n / 5) for n in CHAPTERS.values())
        assert len(used_batches(calls)) == len(set(used_batches(calls))) == needed
        assert all(c["reason"] for c in calls if c["outcome"] != "used"), dump(calls)
        assert report["usage"]["calls_in_flight"] == 0
        # Fencing across the switch: never more than the holder and one whose lease lapsed.
        assert max(mock.stats()["max_inflight_by_chapter"].values()) <= 2
        if replication == "synchronous":
            with psycopg.connect(host="127.0.0.1", port=replica.port, user="postgres",
                                 dbname="postgres") as conn:
                skew = conn.execute("SELECT extract(epoch FROM now())").fetchone()
            assert skew and float(skew[0]) - time.time() > 2  # the new clock really is ahead
            # Nothing acknowledged was lost, and every paid call is in the ledger (a commit
            # the old primary made and never acknowledged may be missing: its ledger row is
            # written before the call, so that call was never made). The calls that stored
            # nothing are at most those in flight at the stop. A call is booked before it is
            # sent: one booked when the primary stopped may never have reached the provider
            # (51 at the mock against 52 in the ledger, once, under load), so the provider
            # has every booked call but at most those in flight.
            assert base >= questions_acked
            assert len(calls) - in_flight <= mock.stats()["calls_total"] <= len(calls)
            assert len(calls) - needed <= in_flight, dump(calls)
        else:
            # The lost commits were real; their questions were made again, each stored once
            # (above), and the ledger misses exactly the rows that were lost with them.
            # A lost row may be a call booked as the primary stopped and never sent (as in
            # the synchronous case: 59 at the mock against 54 + 6, once, under load).
            assert lost_questions >= 15 and lost_ledger >= 1, (lost_questions, lost_ledger)
            assert len(calls) + lost_ledger - in_flight <= mock.stats()["calls_total"] \
                <= len(calls) + lost_ledger
    finally:
        primary.stop()
        replica.stop()
