"""The benchmark's database counter (bench/dbcount.py, bench/parts/dbcost.py) on a tiny exam:
the counts are there and agree with each other on both databases, and a paid call costs
PostgreSQL two round trips (issue 19's target)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from bench.measure import MockProbe
from bench.parts import dbcost

pytestmark = pytest.mark.slow


@dataclass
class _Ctx:  # the part of bench.suite.Context that count_run reads
    mock: MockProbe
    workdir: Path
    redis_url: str


@pytest.fixture(scope="module")
def mock() -> Any:
    probe = MockProbe(0.0, None)
    yield probe
    probe.stop()


def _count(mock: MockProbe, tmp_path: Path, redis_url: str, db: str) -> dict[str, Any]:
    # Two one-call chapters and one chapter of three calls.
    return dbcost.count_run(cast(Any, _Ctx(mock, tmp_path, redis_url)), db, f"dbc-{db[:2]}",
                            [5, 5, 15], 5)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_the_counter_reports_consistent_counts_per_paid_call(mock, tmp_path, redis_url,
                                                             pg_url, db):
    # pg_url: PostgreSQL must be there (the part makes its own database on the same server).
    r = _count(mock, tmp_path, redis_url, db)
    assert r["paid"] == 5, r
    chapter = r["counts"]["chapter"]
    # (PostgreSQL's per-call steps run in autocommit: one statement, no COMMIT of its own.)
    assert chapter["sql"] >= chapter["transactions"] >= chapter.get("commits", 0), chapter
    assert db == "postgresql" or chapter["commits"] > 0, chapter
    assert chapter["sql_rows"] >= chapter["sql"]
    assert sum(v for k, v in chapter.items() if k.startswith("sql:")) == chapter["sql"]
    if db == "sqlite":
        # The library runs every statement SQLAlchemy sends, plus BEGIN and COMMIT.
        assert chapter["driver_statements"] >= chapter["sql"] + chapter["commits"], chapter
        assert "round_trips" not in chapter
    else:
        # Every statement is at least one exchange with the server; so is every COMMIT.
        assert chapter["round_trips"] >= chapter["sql"] + chapter.get("commits", 0), chapter
        # PostgreSQL saw at least the transactions the process committed.
        assert r["server_transactions"] >= sum(
            g.get("commits", 0) for g in r["counts"].values()), r
    assert dbcost.per_call(r, "chapter", "sql") == chapter["sql"] / 5


# What a process reads once per exam on the chapter threads, not per call: the open slices'
# specs (Leases.fresh_view) and the history that sizes max_tokens (examforge.sizing, read
# again every 50 calls).
ONCE_PER_PROCESS = 2


def test_a_paid_call_costs_two_round_trips_on_postgresql(mock, tmp_path, redis_url, pg_url):
    """Issue 19's target, at most 2 round trips per paid call on PostgreSQL, heartbeat apart:
    a chapter of N calls takes 2N (the claim with its first call, N commits, the N - 1 reads
    before a send of the calls the commits recorded), plus the process's reads once per exam,
    which a run of many chapters spreads thin (bench/results-overhead-dbcost.md)."""
    r = _count(mock, tmp_path, redis_url, "postgresql")
    chapter = r["counts"]["chapter"]
    trips = chapter["round_trips"] - chapter.get("prepares", 0)
    assert trips == chapter["trips_per_call"]
    assert r["paid"] == 5 and trips <= 2 * r["paid"] + ONCE_PER_PROCESS, r["counts"]
    # A prepare is once per statement on each connection (the fresh view, the claim, the
    # start of a call, the commit, the read before a send): bounded by the connections, not
    # by the calls.
    connections = sum(g.get("connections", 0) for g in r["counts"].values())
    assert 0 < chapter["prepares"] <= 5 * connections, r["counts"]
