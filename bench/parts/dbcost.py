"""What a paid call costs the database (issue 19): statements, round trips and transactions
per paid call, on SQLite and PostgreSQL, for one-call chapters and for 50-question chapters of
several calls; the heartbeat counted apart.

Each run is `python -m producer run SLUG --concurrency 8` under bench/dbcount.py, which counts
below examforge (SQLAlchemy's engine events, sqlite3's trace callback, psycopg's waits on the
server) and splits the counts by thread: the chapter threads are the per-call path
(`process_chapter`: claim, the ledger row, the call, the commit, the next plan), the
`lease-keeper` thread is the heartbeat, the rest is the runner's loop and start-up (migrations,
the syllabus sync), left out of the per-call figures. Paid calls are what the mock counted.
PostgreSQL's own count of transactions (`pg_stat_database` of a database only the run uses)
is shown beside the client-side count, as a check from outside the process.

The issue's target is at most 2 round trips per paid call on PostgreSQL, heartbeat apart,
for each further call; with group commit off, where each statement is one round trip, the
same count shows what a call runs (`_further`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.measure import PG_ADMIN_URL, ROOT, wait_child, write_syllabus
from bench.report import fmt as _fmt
from bench.report import table
from bench.suite import Context, Figure, PartResult
from bench.systems.embedded import ef_env

NAME = "dbcost"
TITLE = "what a paid call costs the database: statements, round trips, transactions"
CONCURRENCY = 8
TARGET_ROUND_TRIPS = 2.0
HEARTBEAT_S = 0.5


def workloads(small: bool) -> dict[str, tuple[list[int], int]]:
    """name -> (chapter targets, questions per call)."""
    if small:
        return {"one-call": ([5] * 8, 5), "50-question": ([50] * 2, 10)}
    return {"one-call": ([5] * 60, 5), "50-question": ([50] * 8, 10)}


def count_run(ctx: Context, db: str, slug: str, targets: list[int], qpc: int,
              group_commit: bool = True) -> dict[str, Any]:
    """One `producer run` under the counters: its counts, paid calls and the server's view."""
    pg_db = None
    if db == "postgresql":
        import psycopg

        pg_db = f"efbench_cost_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{pg_db}"')
        db_url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{pg_db}"
    else:
        db_url = f"sqlite:///{ctx.workdir / (slug + '.db')}"
    try:
        # The heartbeat beats every HEARTBEAT_S (default LEASE_S / 4 = 7.5 s, longer than
        # these runs): 0.5 s here, so that its cost shows beside the calls' (apart from them).
        env = ef_env(ctx.workdir, db_url, ctx.mock.url, qpc, "unused", ctx.redis_url,
                     HEARTBEAT_S=str(HEARTBEAT_S),
                     GROUP_COMMIT="true" if group_commit else "false")
        write_syllabus(ctx.workdir / "exams", slug, targets)
        out = ctx.workdir / f"{slug}-counts.json"
        ctx.mock.arm(slug)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.dbcount", str(out), "--", "run", slug,
             "--concurrency", str(CONCURRENCY)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        usage = wait_child(proc, 600, started=started)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stderr.close()
        if usage.code != 0:
            raise RuntimeError(f"producer run ({db}) exit {usage.code}: {err[-800:]}")
        counts = json.loads(out.read_text())["counts"]
        for group in counts.values():
            if "round_trips" in group:  # what a call costs; a prepare is once a connection
                group["trips_per_call"] = group["round_trips"] - group.get("prepares", 0)
        paid, _probes = ctx.mock.calls_for(slug)
        server_xacts = None
        if pg_db is not None:
            server_xacts = _server_transactions(pg_db)
        return {"db": db, "slug": slug, "paid": paid, "wall_s": usage.wall_s,
                "counts": counts, "server_transactions": server_xacts}
    finally:
        if pg_db is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')


def _server_transactions(pg_db: str) -> int | None:
    """xact_commit + xact_rollback of the run's database, once the statistics have settled
    (a backend reports them when it goes idle or exits, within about a second)."""
    import psycopg

    last = None
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        for _ in range(20):
            admin.execute("SELECT pg_stat_clear_snapshot()")
            row = admin.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                "WHERE datname = %s", (pg_db,)).fetchone()
            now = None if row is None else int(row[0])
            if now is not None and now == last:
                return now
            last = now
            time.sleep(0.3)
    return last


def fmt(value: float | None) -> str:
    return _fmt(value, ".2f")


def per_call(run: dict[str, Any], group: str, what: str) -> float | None:
    n = run["counts"].get(group, {}).get(what)
    if n is None or not run["paid"]:
        return None
    return float(n) / run["paid"]


def marginal(run: dict[str, Any], twice: dict[str, Any], what: str) -> float | None:
    """What each further paid call costs: the counts of a run with twice the chapters less
    the run's, over the paid calls it had more (what a run pays once cancels out)."""
    a = run["counts"].get("chapter", {}).get(what)
    b = twice["counts"].get("chapter", {}).get(what)
    if a is None or b is None or twice["paid"] <= run["paid"]:
        return None
    return float(b - a) / (twice["paid"] - run["paid"])


def _further(r: dict[str, Any], r2: dict[str, Any], grouped: bool) -> Figure:
    """PostgreSQL's round trips for each further paid call: the run with twice the chapters
    less the run, prepares apart, over the calls it paid for more.

    Off, each statement is one round trip, so the difference counts what each further call
    runs: its claim and its commit, and every REFRESH_CALLS (50) calls a process's read of
    the exam's completion history for sizing max_tokens (examforge.sizing): 2.02. On (the
    default), a group's statements and its COMMIT are one round trip, so a run takes at most
    the round trips it would take off; the difference of two runs, each grouped its own way,
    moves with how their commits happened to group (by 1/8 a round trip in the smoke run's
    eight further calls). The target is held by the default's figure."""
    statements = marginal(r, r2, "sql")
    a = r["counts"].get("chapter", {}).get("trips_per_call", 0)
    b = r2["counts"].get("chapter", {}).get("trips_per_call", 0)
    how = "on" if grouped else "off (each statement its own round trip)"
    return Figure(
        f"PostgreSQL round trips per paid call, {r['workload'].split(',')[0]} chapters: each "
        f"further call, heartbeat apart, group commit {how}",
        marginal(r, r2, "trips_per_call"), 1.0, "none: a count per paid call", "round trips",
        "≤ 2" if grouped else "what a call runs: 2, and a sizing read every 50 calls",
        target_max=TARGET_ROUND_TRIPS if grouped else None,
        note=f"the run with twice the chapters against the run, prepares apart: {b} - {a} "
             f"round trips over {r2['paid']} - {r['paid']} paid calls; statements "
             f"{fmt(statements)} a further call")


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    ctx.mock.set_latency(ctx.latency(0.05))
    results: list[dict[str, Any]] = []
    doubled: dict[str, dict[str, Any]] = {}
    offs: dict[str, dict[str, Any]] = {}
    try:
        for db in ("sqlite", "postgresql"):
            for name, (targets, qpc) in workloads(ctx.small).items():
                slug = f"cost-{db[:2]}-{name[:3]}-{uuid.uuid4().hex[:4]}"
                r = count_run(ctx, db, slug, targets, qpc)
                r.update(workload=name, chapters=len(targets), questions=sum(targets), qpc=qpc)
                results.append(r)
                part.runs.append(r)
                if name == "one-call":
                    # Group commit's A/B: the same workload with it off, right after.
                    slug = f"cost-{db[:2]}-off-{uuid.uuid4().hex[:4]}"
                    off = count_run(ctx, db, slug, targets, qpc, group_commit=False)
                    off.update(workload=f"{name}, group commit off", chapters=len(targets),
                               questions=sum(targets), qpc=qpc)
                    offs[db] = off
                    part.runs.append(off)
                    if db == "postgresql":
                        # Off, each statement is its own round trip: what each further call
                        # costs is then counted without the luck of how commits grouped.
                        slug = f"cost-{db[:2]}-off2-{uuid.uuid4().hex[:4]}"
                        off2 = count_run(ctx, db, slug, targets * 2, qpc, group_commit=False)
                        off2.update(workload=f"{name}, group commit off, doubled",
                                    chapters=2 * len(targets), questions=2 * sum(targets),
                                    qpc=qpc)
                        doubled[f"{name}, group commit off"] = off2
                        part.runs.append(off2)
                if db == "postgresql":
                    # The same workload twice over: the difference is what each further
                    # paid call costs, without what a run pays once (its reads per exam).
                    slug = f"cost-{db[:2]}-{name[:3]}2-{uuid.uuid4().hex[:4]}"
                    r2 = count_run(ctx, db, slug, targets * 2, qpc)
                    r2.update(workload=f"{name}, doubled", chapters=2 * len(targets),
                              questions=2 * sum(targets), qpc=qpc)
                    doubled[name] = r2
                    part.runs.append(r2)
    finally:
        ctx.mock.set_latency(0.5)
    rows = []
    for r in results:
        hb = r["counts"].get("heartbeat", {})
        total_tx = sum(c.get("transactions", 0) for c in r["counts"].values())
        rows.append([
            r["db"], f"{r['workload']} ({r['chapters']} × {r['questions'] // r['chapters']}, "
            f"{r['qpc']} per call)", str(r["paid"]),
            fmt(per_call(r, "chapter", "sql")),
            fmt(per_call(r, "chapter", "driver_statements")) if r["db"] == "sqlite" else "–",
            (f"{fmt(per_call(r, 'chapter', 'round_trips'))} "
             f"({r['counts'].get('chapter', {}).get('prepares', 0)} prepares)")
            if r["db"] == "postgresql" else "–",
            fmt(per_call(r, "chapter", "transactions")),
            fmt(per_call(r, "chapter", "commits")),
            (f"{hb.get('sql', 0)} / {hb.get('round_trips', hb.get('driver_statements', 0))} / "
             f"{hb.get('transactions', 0)} in {r['wall_s']:.1f} s"
             + (f" ({hb['sql'] / hb['transactions']:.1f} / "
                f"{hb.get('round_trips', hb.get('driver_statements', 0)) / hb['transactions']:.1f}"
                " per beat)" if hb.get("transactions") else "")),
            f"{total_tx} / {r['server_transactions']}" if r["server_transactions"] is not None
            else str(total_tx),
        ])
        if r["db"] == "postgresql":
            part.figures.append(Figure(
                f"PostgreSQL round trips per paid call, {r['workload']} chapters, in all "
                "(heartbeat apart)", per_call(r, "chapter", "round_trips"), 1.0,
                "none: a count per paid call", "round trips",
                note=f"{fmt(per_call(r, 'chapter', 'sql'))} statements and "
                     f"{fmt(per_call(r, 'chapter', 'transactions'))} transactions per paid "
                     "call, what the run paid once included: "
                     f"{r['counts'].get('chapter', {}).get('prepares', 0)} prepares (each "
                     "statement once on each connection) and the reads once per exam"))
            r2 = doubled[r["workload"]]
            part.figures.append(_further(r, r2, grouped=True))
        else:
            part.figures.append(Figure(
                f"SQLite statements per paid call, {r['workload']} chapters (heartbeat apart)",
                per_call(r, "chapter", "driver_statements"), 1.0, "none: a count per paid call",
                "statements", note=f"{fmt(per_call(r, 'chapter', 'sql'))} through "
                "SQLAlchemy, "
                f"{fmt(per_call(r, 'chapter', 'transactions'))} transactions per paid call"))
    if "one-call, group commit off" in doubled:
        part.figures.append(_further(offs["postgresql"], doubled["one-call, group commit off"],
                                     grouped=False))
    for r in results:
        if r["workload"] != "one-call" or r["db"] not in offs:
            continue
        off = offs[r["db"]]
        what = "round_trips" if r["db"] == "postgresql" else "driver_statements"
        label = "PostgreSQL round trips" if r["db"] == "postgresql" else "SQLite statements"
        part.figures.append(Figure(
            f"{label} per paid call, one-call chapters, group commit on vs off",
            per_call(r, "chapter", what), per_call(off, "chapter", what), "group commit off",
            "per paid call", "< 1.0x pays",
            note=f"transactions per paid call {fmt(per_call(r, 'chapter', 'transactions'))} "
                 f"on, {fmt(per_call(off, 'chapter', 'transactions'))} off"))
    for r in results + list(offs.values()):
        chapter = r["counts"].get("chapter", {})
        verbs = sorted(((k[4:], v) for k, v in chapter.items() if k.startswith("sql:")),
                       key=lambda kv: -kv[1])
        part.details.append(
            f"- {r['db']}, {r['workload']}: SQL per paid call by kind: " + ", ".join(
                f"{verb} {n / max(r['paid'], 1):.2f}" for verb, n in verbs))
    part.details += [
        "",
        "Counted below examforge by `bench/dbcount.py` around `python -m producer run SLUG "
        f"--concurrency {CONCURRENCY}`, mock latency {ctx.latency(0.05)} s. Per paid call: the "
        "chapter threads' counts (claim, ledger, commit, plan) over the calls the mock was "
        "paid for. *SQL*: statements through SQLAlchemy; *SQLite statements*: every statement "
        "the SQLite library ran (BEGIN and COMMIT included, an executemany once per row); "
        "*round trips*: real exchanges with the server (a query, BEGIN, COMMIT, a prepare, a pipeline sync; psycopg's idle no-op COMMIT or ROLLBACK not counted), with the prepares among them (once per statement on each connection); "
        "*transactions*: SQLAlchemy's begins (read snapshots included), *commits* of them. "
        "The heartbeat (`lease-keeper` thread, every "
        f"{HEARTBEAT_S} s here) is shown as SQL / round trips (SQLite: statements) / "
        "transactions over the run, and per beat (a transaction each); the last column is every transaction of the "
        "run (start-up and migrations included) counted in the process / by PostgreSQL's "
        "`pg_stat_database`.", "",
        *table(("database", "workload", "paid calls", "SQL / call", "SQLite statements / call",
                "round trips / call", "transactions / call", "commits / call",
                "heartbeat (SQL / trips / tx)", "all transactions: client / server"), rows)]
    return part
