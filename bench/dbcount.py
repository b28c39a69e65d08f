"""What a command costs the database, counted from below the code under test.

    python -m bench.dbcount OUT.json -- run SLUG --concurrency 8

Runs `python -m producer ARGS...` in this process with counters installed underneath
examforge, then writes the counts to OUT.json, split by the thread that caused them:
`chapter` (the per-call path: `producer run`'s chapter threads, i.e. `process_chapter`),
`heartbeat` (the `lease-keeper` thread) and `other` (the runner's loop, start-up, sync).

The counters (none is a hook of examforge's own):
- `sql`: statements SQLAlchemy hands the driver (its `before_cursor_execute` event on every
  Engine; an executemany counts once, and `sql_rows` counts its parameter sets).
- `transactions`: transactions SQLAlchemy begins (its `begin` event; a read-only snapshot
  counts too), and `commits` of them.
- `driver_statements` (SQLite): every statement the SQLite library runs, from sqlite3's trace
  callback set on each new connection: BEGIN, COMMIT and PRAGMAs included, an executemany
  once per row.
- `round_trips` (PostgreSQL): message exchanges with the server, counted where psycopg waits
  for the server (`psycopg.Connection.wait`: one per execute, BEGIN, COMMIT, SET, ping, or per
  pipeline sync). Connecting is not counted (the pool keeps connections); `connections` is.
PostgreSQL's own view (`pg_stat_database` xact_commit + xact_rollback of a database only this
run uses) is read by the bench part (bench/parts/dbcost.py) as a cross-check of the
transactions, from outside the process.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter, defaultdict
from typing import Any

COUNTS: defaultdict[str, Counter[str]] = defaultdict(Counter)
_LOCK = threading.Lock()


def _group() -> str:
    name = threading.current_thread().name
    if name.startswith("chapter"):
        return "chapter"
    if name == "lease-keeper":
        return "heartbeat"
    return "other"


def count(what: str, n: int = 1) -> None:
    with _LOCK:
        COUNTS[_group()][what] += n


def install() -> None:
    """The counters, on every engine and connection made after this call."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    @event.listens_for(Engine, "before_cursor_execute")
    def _sql(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
             executemany: bool) -> None:
        count("sql")
        count("sql:" + (statement.lstrip().split(None, 1) or ["?"])[0].upper())
        count("sql_rows", len(parameters) if executemany else 1)

    @event.listens_for(Engine, "begin")
    def _begin(conn: Any) -> None:
        count("transactions")

    @event.listens_for(Engine, "commit")
    def _commit(conn: Any) -> None:
        count("commits")

    @event.listens_for(Pool, "connect")
    def _connect(dbapi_conn: Any, record: Any) -> None:
        count("connections")
        if hasattr(dbapi_conn, "set_trace_callback"):  # sqlite3
            dbapi_conn.set_trace_callback(lambda _sql: count("driver_statements"))

    try:
        import psycopg
    except ImportError:
        return
    wait = psycopg.Connection.wait

    def counted_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        count("round_trips")
        return wait(self, *args, **kwargs)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    out, sep, *args = argv
    if sep != "--":
        raise SystemExit("usage: python -m bench.dbcount OUT.json -- PRODUCER-ARGS...")
    install()
    from producer.cli import main as producer_main

    code = 0
    try:
        code = producer_main(args) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"exit": code, "counts": {g: dict(c) for g, c in COUNTS.items()}}, f,
                  indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
