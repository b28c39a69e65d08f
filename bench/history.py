"""History must not slow the present (issue 19): a database that a year of use has filled,
built with SQL in seconds, and what the work that runs all the time costs on it.

    python -m bench.history                       # 10,000 exams x 100 slices on PostgreSQL
    python -m bench.history --exams 200           # 20,000 slices: the size the test uses
    python -m bench.history --sqlite /tmp/h.db    # the same on SQLite
    python -m bench --only history                # as a part of the suite (bench/results.md)

The data set: `exams` finished exams of 10 chapters x 10 slices (100 slices, 1,000 questions
each), every slice `done` with one `used` call in the ledger; and `ACTIVE` exams with work in
progress (slices pending, running under a live lease with a call in flight, done). It has no
question rows: no read measured here touches a done slice's questions (a done slice's range
is full by construction, so `exams` and /metrics count it from its target; see
storage.reports), while the ledger is read by every one of them, so it has its rows.

Figures: one reconcile pass's store work (the six reads and writes of tasks.reconcile, no
broker), `exams` first page in process and launch to exit, the API's GET /exams and GET
/metrics through an in-process client. Each is the median of `REPEATS` after one warm-up,
printed beside the same figure on a database holding the active exams alone (what the
present costs) and beside the issue's target.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/history.py` puts bench/ first, not the root
    sys.path.insert(0, str(ROOT))
from bench.measure import child_pythonpath  # noqa: E402
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432"
CHAPTERS, SLICES, TARGET = 10, 10, 10  # per exam: 100 slices of 10 questions
ACTIVE = 5
REPEATS = 5
EPOCH = "bench-epoch"
# The targets, seconds.
TARGETS: dict[str, float | None] = {
    "reconcile_db": 0.05, "reconcile": None, "exams": 0.5, "exams_cli": 0.5, "api_exams": 0.5,
    "metrics": 0.5, "metrics_first": None, "exams_all": None}


def _numbers(dialect: str, n: int, name: str) -> str:
    """A FROM item of the integers 0..n-1 as column `i`, named `name`."""
    if dialect == "postgresql":
        return f"generate_series(0, {n - 1}) AS {name}(i)"
    return (f"(WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r "
            f"WHERE i < {n - 1}) SELECT i FROM r) AS {name}")


def build(engine: Any, exams: int, active: int = ACTIVE, *, prefix: str = "hist") -> None:
    """Insert `exams` finished exams and `active` exams in progress with INSERT ... SELECT
    (a million slices in about half a minute on PostgreSQL). Exams are numbered from 0; a
    finished exam's rows are all older than an active one's."""
    from sqlalchemy import text

    d = engine.dialect.name
    now = time.time()
    t0 = now - 365 * 86400
    cat = (lambda *parts: " || ".join(parts))
    pad = ((lambda col: f"lpad(CAST({col} AS TEXT), 6, '0')") if d == "postgresql"
           else (lambda col: f"printf('%06d', {col})"))

    def exam_rows(kind: str, n: int, first_at: float, step: float) -> None:
        if n <= 0:
            return
        slug = cat(f"'{prefix}-{kind}-'", pad("e.i"))
        title = cat(f"'{kind.title()} exam '", "CAST(e.i AS TEXT)")
        chapter, chapter_title = (cat(f"'{w}'", "CAST(c.i AS TEXT)") for w in ("ch", "Chapter "))
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO exam (slug, title, state, auth_failures, spent_usd, reserved_usd,"
                " created_at, updated_at, index_epoch) "
                f"SELECT {slug}, {title},"
                f" 'active', 0, 0, 0, {first_at} + e.i * {step}, {first_at} + e.i * {step}"
                f" + 60, e.i FROM {_numbers(d, n, 'e')}"))
            # Finished: every slice done, picked and enqueued long ago. Active: per chapter,
            # slices 0-3 done, 4 running under a live lease, 5-9 pending (enqueued an hour
            # ago, their messages in the queue).
            state = ("'done'" if kind == "done" else
                     "CASE WHEN s.i < 4 THEN 'done' WHEN s.i = 4 THEN 'running' "
                     "ELSE 'pending' END")
            running = "s.i = 4" if kind != "done" else "1 = 0"
            conn.execute(text(
                "INSERT INTO slice (exam, chapter_id, slice_no, first_number, position, title,"
                " spec_hash, target, state, attempts, attempts_since_progress, lease_owner,"
                " lease_expires_at, enqueued_at, enqueue_epoch, picked_at, requeues,"
                " updated_at) "
                f"SELECT {slug}, {chapter}, s.i,"
                f" s.i * {TARGET} + 1, c.i, {chapter_title},"
                f" 'bench', {TARGET}, {state}, 1, 0,"
                f" CASE WHEN {running} THEN 'bench-worker' END,"
                f" CASE WHEN {running} THEN {now + 86400} END,"
                f" {first_at} + e.i * {step}, '{EPOCH}',"
                f" CASE WHEN {state} = 'pending' THEN NULL ELSE {first_at} + e.i * {step} + 1"
                f" END, 0, {first_at} + e.i * {step} + 60"
                f" FROM {_numbers(d, n, 'e')} CROSS JOIN {_numbers(d, CHAPTERS, 'c')}"
                f" CROSS JOIN {_numbers(d, SLICES, 's')}"))
            # The ledger: one used call per done slice, one in flight per running slice.
            conn.execute(text(
                "INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number,"
                " requested, worker, outcome, prompt_tokens, completion_tokens, cached_tokens,"
                " cost_usd, questions_stored, endpoint, model, max_tokens, reserved_usd,"
                " usage_estimated, price_known, started_at, finished_at) "
                f"SELECT s.exam, s.chapter_id, s.slice_no, 1, s.first_number, {TARGET},"
                " 'bench-worker', CASE WHEN s.state = 'done' THEN 'used' ELSE 'in_flight' END,"
                " 900, 2400, 0, 0.0021, CASE WHEN s.state = 'done' THEN 10 ELSE 0 END,"
                " CASE WHEN s.state = 'done' THEN 'primary' END, 'bench-model', 4000, 0.003,"
                f" {'false' if d == 'postgresql' else '0'},"
                f" {'true' if d == 'postgresql' else '1'}, s.updated_at - 30,"
                " CASE WHEN s.state = 'done' THEN s.updated_at END"
                f" FROM slice s WHERE s.exam LIKE '{prefix}-{kind}-%'"
                " AND s.state IN ('done', 'running')"))

    exam_rows("done", exams, t0, 3000.0)
    exam_rows("active", active, now - 3600, 1.0)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("VACUUM ANALYZE" if d == "postgresql" else "ANALYZE"))


@contextlib.contextmanager
def pg_database(prefix: str = "efbench_history") -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(f"{PG_ADMIN}/postgres", isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_ADMIN}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def reconcile_store_work(store: Any) -> dict[str, int]:
    """The database work of one tasks.reconcile pass, in its order, with the broker's part
    taken as read (every waiting slice's message in the queue, none held by a worker)."""
    failed = store.fail_capped(5)
    settled = store.settle_cancelled()
    orphaned = store.settle_orphans()
    paused = store.pause_spent()
    orphans = store.orphans(grace_s=10.0, epoch=EPOCH)
    audit = store.lost_messages(min_age_s=60.0, queued=10**9, unacked=[])
    return {"failed": failed, "settled": settled, "orphaned": orphaned, "paused": len(paused),
            "orphans": len(orphans), "lost": len(audit.lost), "waiting": audit.waiting}


def explain_reconcile(store: Any) -> tuple[list[str], float]:
    """EXPLAIN ANALYZE of every statement of one reconcile pass (PostgreSQL), as markdown
    rows (the tables and indexes each reads, and its execution time), and the sum of their
    execution times in seconds: the pass's database time."""
    from sqlalchemy import event

    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        reconcile_store_work(store)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    rows = ["| statement | reads | execution |", "|---|---|---|"]
    total_ms = 0.0
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        for sql, params in seen:
            if not sql.lstrip().upper().startswith(("SELECT", "UPDATE")):
                continue
            with raw.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                doc = cur.fetchone()[0][0]
            raw.rollback()
            reads: list[str] = []

            def walk(node: dict[str, Any]) -> None:
                if "Relation Name" in node or "Index Name" in node:
                    reads.append(f"{node['Node Type']} {node.get('Relation Name', '')} "
                                 f"{node.get('Index Name', '')}".replace("  ", " ").strip())
                for child in node.get("Plans", []):
                    walk(child)

            walk(doc["Plan"])
            total_ms += doc["Execution Time"] + doc.get("Planning Time", 0.0)
            head = " ".join(sql.split())[:90].replace("|", "\\|")
            rows.append(f"| `{head}...` | {'; '.join(reads)} | "
                        f"{doc['Execution Time']:.2f} ms |")
    return rows, total_ms / 1000


def _median_s(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    fn()  # warm-up: connections, compiled statements, the database's cache
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(url: str, workdir: Path, repeats: int = REPEATS) -> dict[str, Any]:
    """Every figure on the database at `url`, seconds."""
    from fastapi.testclient import TestClient

    from examforge.settings import Settings
    from producer.api import create_app
    from storage import open_store

    store = open_store(url)
    got: dict[str, Any] = {}
    try:
        work = reconcile_store_work(store)
        assert work["failed"] == work["orphaned"] == work["orphans"] == work["lost"] == 0, work
        got["reconcile"] = _median_s(lambda: reconcile_store_work(store), repeats)
        if store.engine.dialect.name == "postgresql":  # warm, as beat's passes are
            got["explain"], got["reconcile_db"] = explain_reconcile(store)
        got["exams"] = _median_s(lambda: store.exam_page(), repeats)
        got["exams_all"] = _median_s(lambda: store.exam_page(limit=None), 1)
    finally:
        store.engine.dispose()
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": child_pythonpath(),
           "EXAMS_DIR": str(workdir / "exams")}
    got["exams_cli"] = _median_s(lambda: subprocess.run(
        [sys.executable, "-m", "producer", "exams", "--json"], env=env, cwd=workdir,
        check=True, capture_output=True), max(1, repeats // 2))
    settings = Settings(database_url=url, exams_dir=workdir / "exams",
                        broker_url="redis://127.0.0.1:6379/15", llm_api_key="unused",
                        llm_base_url="http://mock.invalid/v1")
    with TestClient(create_app(settings, local=True, no_auth=True)) as client:
        def get(path: str) -> None:
            r = client.get(path)
            assert r.status_code == 200, r.text[:300]
        t = time.perf_counter()
        get("/metrics")  # the first scrape of a process reads every exam
        got["metrics_first"] = time.perf_counter() - t
        got["api_exams"] = _median_s(lambda: get("/exams"), repeats)
        got["metrics"] = _median_s(lambda: get("/metrics"), repeats)
    return got


LABELS = {
    "reconcile_db": "one reconcile pass, database time (EXPLAIN ANALYZE, planning included)",
    "reconcile": "one reconcile pass, store work, wall time in process",
    "exams": "`exams` first page (100), in process",
    "exams_cli": "`python -m producer exams --json`, launch to exit",
    "api_exams": "GET /exams (first page, 100)",
    "metrics": "GET /metrics (a scrape)",
    "metrics_first": "GET /metrics right after the server starts (its first full read)",
    "exams_all": "`exams --all`, in process",
}


def run_both(url_for: Callable[[str], contextlib.AbstractContextManager[str]], exams: int,
             workdir: Path, repeats: int = REPEATS) -> dict[str, Any]:
    """Build and measure the history database and the present-only one; returns both."""
    out: dict[str, Any] = {"exams": exams, "slices": exams * CHAPTERS * SLICES}
    from storage import open_store

    for name, n in (("present", 0), ("history", exams)):
        with url_for(name) as url:
            store = open_store(url)
            t = time.perf_counter()
            build(store.engine, n)
            out[f"{name}_build_s"] = time.perf_counter() - t
            store.engine.dispose()
            out[name] = measure(url, workdir, repeats)
    return out


def render(out: dict[str, Any]) -> list[str]:
    lines = [f"{out['exams']:,} finished exams, {out['slices']:,} done slices and "
             f"{ACTIVE} active exams (built in {out['history_build_s']:.1f} s)", "",
             "| figure | history | active exams alone | ratio | target |",
             "|---|---|---|---|---|"]
    for key, label in LABELS.items():
        if key not in out["history"]:
            continue  # the database time is PostgreSQL's
        h, p = out["history"][key], out["present"][key]
        target = TARGETS[key]
        lines.append(f"| {label} | {h * 1000:.1f} ms | {p * 1000:.1f} ms | {h / p:.2f}x | "
                     f"{'-' if target is None else f'≤ {target * 1000:.0f} ms'} |")
    if out["history"].get("explain"):
        lines += ["", "Every statement of a reconcile pass on the history database "
                  "(EXPLAIN ANALYZE):", "", *out["history"]["explain"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exams", type=int, default=10_000, help="finished exams (100 slices each)")
    p.add_argument("--sqlite", metavar="DIR", help="SQLite files in DIR instead of PostgreSQL")
    p.add_argument("--repeats", type=int, default=REPEATS)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="efbench-history-"))
    (workdir / "exams").mkdir()

    @contextlib.contextmanager
    def sqlite_db(name: str) -> Iterator[str]:
        path = Path(args.sqlite) / f"history-{name}-{uuid.uuid4().hex[:6]}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

    url_for = sqlite_db if args.sqlite else (lambda name: pg_database())
    out = run_both(url_for, args.exams, workdir, args.repeats)
    print("\n".join(render(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
