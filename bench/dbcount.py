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
- `round_trips` (PostgreSQL): real client->server exchanges, each a flush of messages that
  then waits for the server's answers: psycopg's `execute` generator (a query, BEGIN,
  COMMIT, ROLLBACK, SET, a prepare), counted at its two call sites (the cursor's and the
  connection's), and each pipeline sync (an executemany: many statements, one exchange).
  psycopg skips a COMMIT or ROLLBACK on an idle connection without calling either, so
  those are not counted (`driver_waits`, psycopg's waits on the server, counted them: it
  is kept beside as the old, higher figure). Connecting is not counted (the pool keeps
  connections); `connections` is. `prepares`: the round trips among those that prepared a
  statement on a connection (psycopg's, once per statement in a connection's life).
PostgreSQL's own view (`pg_stat_database` xact_commit + xact_rollback of a database only this
run uses) is read by the bench part (bench/parts/dbcost.py) as a cross-check of the
transactions, from outside the process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter, defaultdict
from typing import Any

COUNTS: defaultdict[str, Counter[str]] = defaultdict(Counter)
_LOCK = threading.Lock()
# DBCOUNT_LOG=PATH: every statement of the chapter threads, one a line (to see which they are).
_LOG = open(os.environ["DBCOUNT_LOG"], "a", encoding="utf-8") if os.environ.get(
    "DBCOUNT_LOG") else None


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
        if _LOG is not None and _group() == "chapter":
            with _LOCK:
                _LOG.write(" ".join(statement.split())[:160] + "\n")

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
    from psycopg import _connection_base, _cursor_base, _pipeline_base, generators

    wait = psycopg.Connection.wait

    def counted_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        count("driver_waits")
        return wait(self, *args, **kwargs)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]

    def exchange(execute: Any) -> Any:
        def counted_execute(pgconn: Any, *args: Any, **kwargs: Any) -> Any:
            count("round_trips")
            return (yield from execute(pgconn, *args, **kwargs))
        return counted_execute

    # The cursor's module bound `execute` at import; the connection's looks it up in
    # `generators` at each call: two call sites, each an exchange.
    _cursor_base.execute = exchange(_cursor_base.execute)  # type: ignore[attr-defined]
    generators.execute = exchange(generators.execute)  # type: ignore[assignment]
    assert _connection_base.generators is generators
    enqueue_sync = _pipeline_base.BasePipeline._enqueue_sync

    def counted_sync(self: Any) -> None:
        count("round_trips")
        enqueue_sync(self)

    _pipeline_base.BasePipeline._enqueue_sync = counted_sync  # type: ignore[method-assign]
    send_prepare = _cursor_base.BaseCursor._send_prepare

    def counted_prepare(self: Any, *args: Any, **kwargs: Any) -> None:
        # A prepare outside a pipeline is a round trip of its own (counted above too): once
        # per statement in a connection's life, not per call.
        if not self._conn._pipeline:
            count("prepares")
        send_prepare(self, *args, **kwargs)

    _cursor_base.BaseCursor._send_prepare = counted_prepare  # type: ignore[method-assign]


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
