"""What every part of the store shares: the tables, the database clock, snapshots for reads."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import os
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from sqlalchemy import and_, bindparam, case, func, literal_column, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import MultipleResultsFound, NoResultFound

from storage.group import GroupCommit
from storage.db import READ_ONLY, SQLITE_BUSY_TIMEOUT_S, db_now
from storage.models import (Call, CallOutcome, ChapterState, Exam, Question, QuestionEdit, Slice,
                            Verdict)
from storage.report_types import last_error_text

E = Exam.__table__  # type: ignore[attr-defined]
S = Slice.__table__  # type: ignore[attr-defined]
Q = Question.__table__  # type: ignore[attr-defined]
K = Call.__table__  # type: ignore[attr-defined]
QE = QuestionEdit.__table__  # type: ignore[attr-defined]

ACTIVE_STATES = (ChapterState.pending.value, ChapterState.running.value)


def _literal(value: str) -> Any:
    return literal_column(f"'{value}'")


# The conditions of the partial indexes (storage.models, migration 0017), written with their
# values inline: SQLite uses a partial index only for a query whose WHERE has the index's
# own terms, literally (a bound parameter never matches), and PostgreSQL proves from them
# too. Every query of a reconcile pass selects through one of these, so it reads the work in
# progress, not all of history. And a value bound where such a condition names the column
# (`call.outcome = ?`) makes SQLite prepare the statement again at every execution, to see
# whether the value lets it use the index: 60-70 µs of a worker's CPU each time, measured on
# a claim's statements, so the hot path writes these inline too.
ACTIVE_SLICE = S.c.state.in_([_literal(s) for s in ACTIVE_STATES])
HELD_CANCELLED = and_(S.c.state == _literal(ChapterState.cancelled.value),
                      S.c.lease_owner.is_not(None))
IN_FLIGHT_CALL = K.c.outcome == _literal(CallOutcome.in_flight.value)
# A slice's row by bind parameters, for the statements built once (StoreBase._stmt).
SLICE_KEY = (S.c.exam == bindparam("k_exam"), S.c.chapter_id == bindparam("k_chapter"),
             S.c.slice_no == bindparam("k_slice"))
# How the human text of a budget's pause starts (exam.pause_reason). What ends the pause is
# decided by exam.pause_code (examforge.errors.PauseCode.budget), never by this text.
BUDGET_PAUSE_PREFIX = "budget:"
# The pause reason of an exam whose settled calls reached its budget.
BUDGET_SPENT_REASON = (f"{BUDGET_PAUSE_PREFIX} the calls settled so far reached the exam's budget; "
                       "raise it (enqueue --budget-usd) to go on")


# The states in which a lease holder may still write its slice: running, and cancelled while
# its call is in flight (Planning.cancel keeps that holder's lease until its reply is committed).
HELD_STATES = (ChapterState.running.value, ChapterState.cancelled.value)


def lease_fence(now: Any, *, owner: Any = None,
                states: Sequence[str] | None = HELD_STATES) -> Any:
    """The lease fence: the one condition under which a slice row is still its holder's. The
    owner is `owner` (a clause; by default the bind parameter `k_owner`), the lease has not
    expired on the database clock (`now`), and the slice is in one of `states` (None: any).
    Every check and write a holder makes goes through it (start_call, may_send, the commit,
    the heartbeat, the takeover's test of a call's holder), so that they cannot disagree on
    what holding a lease means."""
    held = and_(S.c.lease_owner == bindparam("k_owner") if owner is None else owner,
                S.c.lease_expires_at > now)
    return held if states is None else and_(held, S.c.state.in_(states))


def fence_params(exam: str, chapter_id: str, slice_no: int, owner: str) -> dict[str, Any]:
    """The bind parameters of SLICE_KEY and `lease_fence` for one holder's slice."""
    return {"k_exam": exam, "k_chapter": chapter_id, "k_slice": slice_no, "k_owner": owner}


def slice_where(exam: str, chapter_id: str, slice_no: int) -> tuple[Any, ...]:
    """The conditions that select one slice row."""
    return S.c.exam == exam, S.c.chapter_id == chapter_id, S.c.slice_no == slice_no


def capped_detail(attempts: int, code: str | None, detail: str | None) -> str:
    """The detail of a slice failed at its attempt cap (SliceReason.attempt_cap): how many
    attempts, and the error the last one ended with."""
    last = last_error_text(code, detail) or "none recorded (worker crashed?)"
    return f"{attempts} attempts without progress; last error: {last}"
# pg_advisory_xact_lock's first key for StoreBase._questions_in_order (the second is the
# exam's hash); the two-key form never meets the one-key locks (migrations).
_QUESTION_ORDER_LOCK = 0x45465130  # "EFQ0"
_ORDER_LOCK_SQL = text("SELECT pg_advisory_xact_lock(:ns, :k)")


class WriterLock:
    """The process's SQLite writer turn, with a fast lane: a waiter that asks `urgent` (the
    lease heartbeat) goes before every other waiter, right after the current holder. With a
    plain Lock, one renewal among 128 threads that each wait to commit may wait for many of
    their commits, and its leases lapse while it waits.

    threading has no such lock; this one is made of plain Locks, whose hand-over is one wake
    in C. (Two Conditions on one mutex did the same, and their hand-over, a Condition's
    Python and a second wake to take the mutex back, was a fifth of a SQLite worker's GIL
    time: bench/results-hot-path-profile.md.) The turn is `_turn`. The other writers pass
    `_gate` one at a time, so at most one of them waits on `_turn`; an urgent waiter waits on
    `_turn` directly, counted in `_urgent`. When the holder lets go, the turn goes to the
    urgent waiter or to the one writer at the gate; that writer, finding an urgent waiter
    counted, hands the turn back and waits (still at the gate) until every urgent waiter has
    taken it. An urgent waiter that counts itself after a writer took the turn goes right
    after that writer."""

    def __init__(self) -> None:
        self._turn = threading.Lock()
        self._gate = threading.Lock()
        self._urgent = 0  # urgent waiters that have not taken the turn yet
        self._taken = threading.Condition(threading.Lock())  # _urgent fell
        self._normal = _Turn(self, False)
        self._fast = _Turn(self, True)

    def hold(self, urgent: bool = False) -> "_Turn":
        return self._fast if urgent else self._normal

    def _enter(self) -> None:
        with self._gate:
            self._turn.acquire()
            while self._urgent:
                self._turn.release()
                with self._taken:
                    self._taken.wait_for(lambda: not self._urgent)
                self._turn.acquire()

    def _enter_urgent(self) -> None:
        with self._taken:
            self._urgent += 1
        try:
            self._turn.acquire()
        finally:
            with self._taken:
                self._urgent -= 1
                self._taken.notify_all()


class _Turn:
    """`with lock.hold(urgent):` one writer's turn (a plain object: a generator-based context
    manager costs more than the locks)."""

    __slots__ = ("_lock", "_urgent")

    def __init__(self, lock: WriterLock, urgent: bool) -> None:
        self._lock, self._urgent = lock, urgent

    def __enter__(self) -> None:
        if self._urgent:
            self._lock._enter_urgent()
        else:
            self._lock._enter()

    def __exit__(self, *exc: object) -> None:
        self._lock._turn.release()


class FileTurn:
    """The SQLite writer's turn between processes: an exclusive flock(2) on a file beside the
    database (`<database>-writer`), taken after the process's own `WriterLock` and held for
    the write transaction.

    SQLite's own write lock is a POSIX lock that its busy handler waits for by sleeping and
    polling (1, 2, 5, ... up to 100 ms between tries), so two worker processes that each
    commit a few hundred times a second mostly sleep past the moment the other let go. A
    process waiting for this turn tries again every 0.2 ms instead. At most one
    thread of a process waits here (the others wait in `WriterLock`), so this file only
    arbitrates between processes; SQLite's lock still guards the database against every
    other writer (the sqlite3 shell, an older examforge). The file is opened again in a
    forked child (the lock belongs to the open file, which a fork would share), and its
    descriptor is only used under `WriterLock`, so opening it needs no lock of its own."""

    __slots__ = ("path", "_fd", "_pid", "_held")
    GIVE_UP_S = float(SQLITE_BUSY_TIMEOUT_S)

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._pid = 0
        self._held = False

    def __enter__(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:  # a folder it may not write in: SQLite's lock alone, as before
                self._fd = -1
        if self._fd < 0:
            self._held = False
            return
        if self._try():
            return
        # Linux has no flock with a timeout, and a blocking one would wait for ever on a
        # holder that hangs (SIGSTOP, a stuck thread), where SQLite's lock gives up after
        # its busy timeout. So: tried every 0.2 ms (a few µs of CPU each, for the one waiting
        # thread), and past SQLite's busy timeout the transaction goes on without the turn
        # and SQLite's lock decides, as without this file.
        deadline = time.monotonic() + self.GIVE_UP_S
        while time.monotonic() < deadline:
            time.sleep(0.0002)
            if self._try():
                return

    def _try(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._held = True
        except BlockingIOError:
            self._held = False
        return self._held

    def __exit__(self, *exc: object) -> None:
        if self._held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __del__(self) -> None:
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)


def file_turn(engine: Engine) -> FileTurn | None:
    """The turn between processes for a SQLite file database; None for PostgreSQL and for a
    database in memory (one process only)."""
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or \
            "mode=memory" in str(engine.url):
        return None
    return FileTurn(os.path.abspath(database) + "-writer")


class _Raw:
    """A hot statement compiled once for SQLite's driver (StoreBase._run): its SQL text, the
    order of its parameters, the values of the constants it binds, and the row type of what
    it returns."""

    __slots__ = ("sql", "names", "consts", "procs", "row", "result_procs", "_values")

    def __init__(self, stmt: Any, dialect: Any) -> None:
        compiled = stmt.compile(dialect=dialect)
        unbound = {name: None for name, b in compiled.binds.items() if b.required}
        # Expanding IN lists of constants rendered once: `state IN (?, ?)`.
        expanded = compiled.construct_expanded_state(unbound)
        self.sql: str = expanded.statement
        self.names: tuple[str, ...] = tuple(expanded.positiontup or ())
        self.consts: dict[str, Any] = {k: v for k, v in expanded.parameters.items()
                                       if k not in unbound}
        # Columns with a Python-side default that the statement leaves out: SQLAlchemy's
        # execution fills them in at each execution; here, once (scalars only).
        defaults = [(c, c.default) for c in compiled.insert_prefetch]
        defaults += [(c, c.onupdate) for c in compiled.update_prefetch]
        for column, default in defaults:
            if not getattr(default, "is_scalar", False):
                raise NotImplementedError(f"{column}: not a scalar default")
            self.consts[column.key] = default.arg
        processors = compiled._bind_processors
        self.procs = tuple((i, processors[n]) for i, n in enumerate(self.names)
                           if processors.get(n) is not None)
        columns = compiled._result_columns
        self.row: Any = (collections.namedtuple("Row", [c.keyname for c in columns],
                                                rename=True) if columns else None)
        self.result_procs = tuple(
            (i, proc) for i, c in enumerate(columns)
            if (proc := c.type._cached_result_processor(dialect, None)) is not None)
        self._values: dict[int, str] = {}

    def values_sql(self, n: int) -> str | None:
        """This one-row INSERT's SQL for `n` rows: `VALUES (?, ...), (?, ...)`, with its
        RETURNING if it has one (its parameters: `names` once per row); None when it is not
        an INSERT of bound values only (an expression or a constant among them)."""
        sql = self._values.get(n)
        if sql is None:
            head, sep, rest = self.sql.partition(" VALUES (")
            inner, _, tail = rest.partition(")")
            if not self.sql.startswith("INSERT ") or not sep \
                    or inner.split(", ") != ["?"] * len(self.names):
                return None
            sql = f"{head} VALUES " + ", ".join([f"({inner})"] * n) + tail
            # Kept for a paid call's sizes only: an import's pieces come in any number of
            # rows, up to thousands, and each size's text would stay for the process's life.
            if n <= _VALUES_CACHED_ROWS:
                self._values[n] = sql
        return sql

    def args(self, params: dict[str, Any]) -> list[Any]:
        consts = self.consts
        values = [params[n] if n in params else consts[n] for n in self.names]
        for i, proc in self.procs:
            values[i] = proc(values[i])
        return values


class RawResult:
    """The part of SQLAlchemy's Result the hot path uses, over rows already fetched."""

    __slots__ = ("rowcount", "_rows")

    def __init__(self, rowcount: int, rows: list[Any]) -> None:
        self.rowcount, self._rows = rowcount, rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return self._rows

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when one or none was required")
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if not self._rows:
            raise NoResultFound("No row was found when one was required")
        return self.one_or_none()

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.one_or_none()
        return None if row is None else row[0]

    def scalars(self) -> "RawResult":
        return RawResult(self.rowcount, [row[0] for row in self._rows])


_RAW_OF: dict[int, tuple[Any, _Raw]] = {}
# SQLite's limit on the parameters of one statement (SQLITE_MAX_VARIABLE_NUMBER, 32,766 since
# 3.32): a multi-row INSERT (`StoreBase._raw_values`) is cut into pieces under it.
_VALUES_MAX_PARAMS = 32766
_VALUES_CACHED_ROWS = 64  # `_Raw.values_sql` keeps its text for up to this many rows


def execute_hot(conn: Connection, stmt: Any, params: dict[str, Any] | list[dict[str, Any]]
                ) -> Any:
    """`StoreBase._run` for the hot statements that live outside the store's classes
    (storage.neardup's check, index and steering reads, run at every commit): `stmt`, built
    once by its module, straight to SQLite's cursor (compiled once, keyed by the statement
    object, which its module keeps); through SQLAlchemy on PostgreSQL. A list of parameter
    sets is an executemany (no rows returned)."""
    if conn.dialect.name != "sqlite":
        return conn.execute(stmt, params)
    held = _RAW_OF.get(id(stmt))
    if held is None or held[0] is not stmt:
        held = _RAW_OF[id(stmt)] = (stmt, _Raw(stmt, conn.dialect))
    return StoreBase._raw_execute(conn, held[1], params)


def _on_cursor(conn: Connection, cursor: Any, sql: str, args: Any, many: bool,
               run: Callable[[Any, str, Any], Any]) -> Any:
    """`run(cursor, sql, args)` on a driver's cursor with what SQLAlchemy does around an
    execution: the engine's `before_cursor_execute` listeners (the tests' statement counts,
    bench/dbcount.py) and its handling of a driver error (a lost connection invalidates the
    pool's; the error is raised as SQLAlchemy's). `Connection._handle_dbapi_exception` is
    SQLAlchemy's own, not public: the store's tests fail first if an upgrade changes it."""
    try:
        if conn.dispatch.before_cursor_execute:
            for fn in conn.dispatch.before_cursor_execute:
                sql, args = fn(conn, cursor, sql, args, None, many)
        return run(cursor, sql, args)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's handling decides, and raises
        conn._handle_dbapi_exception(exc, sql, args, cursor, None)
        raise  # not reached: the handler raises
    finally:
        cursor.close()


def _executemany(cursor: Any, sql: str, args: Any) -> int:
    cursor.executemany(sql, args)
    return int(cursor.rowcount)


def _fetch_all(cursor: Any, sql: str, args: Any) -> tuple[int, list[Any]]:
    cursor.execute(sql, args)
    rows = cursor.fetchall()
    return cursor.rowcount, rows  # after the rows: sqlite3 counts a RETURNING's as it reads


def _fetch_none(cursor: Any, sql: str, args: Any) -> tuple[int, list[Any]]:
    cursor.execute(sql, args)
    return cursor.rowcount, []


def _fetch_prepared(cursor: Any, sql: str, args: Any) -> tuple[int, list[Any]]:
    cursor.execute(sql, args, prepare=True)
    rows = cursor.fetchall() if cursor.description is not None else []
    return cursor.rowcount, rows


@contextlib.contextmanager
def _no_transaction() -> Iterator[None]:
    """A one-statement commit's 'transaction': the statement runs in autocommit (`_auto`)."""
    yield None


def _group_hook(step: str, kinds: collections.Counter[str]) -> None:
    """EXAMFORGE_TEST_GROUP_CRASH=<step>[:<kind>]: a test's SIGKILL at that step of a group
    commit (storage.group), of a group with two members or more of that kind ("commit": paid
    calls' commits; "claim"; "call"; "finish") if one is named
    (tests/e2e/test_group_commit_kill.py). Unset in production: a no-op."""
    wanted = os.environ.get("EXAMFORGE_TEST_GROUP_CRASH")
    if not wanted:
        return
    at, _, kind = wanted.partition(":")
    if at == step and (not kind or kinds[kind] >= 2):
        os.kill(os.getpid(), 9)


# A group's most members when GROUP_COMMIT_MAX is unset. A SQLite COMMIT (WAL,
# synchronous=NORMAL) writes no more than its pages, so a group saves little beyond its BEGIN
# and COMMIT, while each member waits for the whole group: at 2 x 64 threads, interleaved
# rounds on the 2-core machine, groups of at most 2 / 4 / 8 / 32 gave 0.83 / 0.82 / 0.81 /
# 0.79-0.80 of the ideal (medians; docs/explanations/benchmarks.md). PostgreSQL sends a
# group in one pipeline, but each member's `ef_commit` takes its exam's question-order lock
# to the group's end, and psycopg sends a pipeline's statements one by one, each a wait on
# the socket that gives up the interpreter lock: the lock is held while the leader's thread
# waits its turn for the interpreter, once a member. At 2 x 64 threads on a slow 2-core
# machine (2026-12-05 20:05-20:25 UTC), groups of at most 16 and 32 made other processes'
# groups wait past LOCK_TIMEOUT_MS (15-25 lock timeouts a run, each group then run again
# member by member), at most 8 none in three runs, with the least worker CPU a call (7.7
# against 10.2 ms for 16 and 8.9 with group commit off).
GROUP_MAX = {"postgresql": 8, "sqlite": 4}


def group_max(dialect: str, configured: int | None) -> int:
    """A group's most members: GROUP_COMMIT_MAX when set, else the database's default."""
    return configured if configured is not None else GROUP_MAX.get(dialect, 32)


class StoreBase:
    """The engine and the helpers every part of the store uses."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._beat: Engine | None = None
        self._beat_lock = threading.Lock()
        self._now = db_now(engine.dialect.name)
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        # SQLite allows one writer at a time. Without this lock, a process's threads that
        # want to write at once each enter BEGIN IMMEDIATE and spin in SQLite's busy handler
        # (sleeping and retrying) until the holder commits; with it they take turns in order,
        # and SQLite's own locking only has to arbitrate between processes.
        self._writer = WriterLock() if engine.dialect.name == "sqlite" else None
        self._files: contextlib.AbstractContextManager[None] = (
            file_turn(engine) or contextlib.nullcontext())
        self._stmts: dict[str, Any] = {}
        # SQLite's hot statements as SQL for its driver (`_run`); None on PostgreSQL.
        self._raw: dict[str, _Raw] | None = {} if engine.dialect.name == "sqlite" else None
        self._pg_texts: dict[str, tuple[str, dict[str, Any]]] = {}
        # PostgreSQL runs a paid call's steps in plain SQL, one round trip each
        # (storage.fastpath); the slices' counts its commit numbers on from, by holder
        # (Ledger._expect). SQLite keeps the general path: the same steps as SQL text in its
        # write transaction measured slower (bench/results-hot-path-profile.md); its
        # statements built once go to the sqlite3 cursor as compiled SQL instead (`_run`).
        self._fast_pg = engine.dialect.name == "postgresql"
        self._fast_commit = self._fast_pg
        self._expected: dict[str, tuple[int, int]] = {}
        # The open slices' specs by exam, as read for planning first calls before their
        # claims (PostgreSQL, Leases.fresh_view): (monotonic time read, {(chapter, slice):
        # (view, fingerprint)}).
        self._fresh: dict[str, tuple[float, dict[tuple[str, int], Any]]] = {}
        self._fresh_lock = threading.Lock()
        # The process's group commit of paid calls' commits (storage.group): on by default,
        # set from the worker's settings (`configure_group`).
        self.group = GroupCommit(self._write, engine.dialect.name,
                                 max_members=group_max(engine.dialect.name, None),
                                 on_abort=self._group_aborted, hook=_group_hook)
        # PostgreSQL's one-statement commits (storage.fastpath), grouped the same way: a
        # group's statements go in one transaction, sent in one pipeline.
        self.fast_group = GroupCommit(_no_transaction, engine.dialect.name,
                                      max_members=group_max(engine.dialect.name, None),
                                      on_abort=self._group_aborted, hook=_group_hook,
                                      batch=lambda params: self._auto_group(self._group_sql,
                                                                            params))

    def _group_aborted(self) -> None:
        """A group's transaction was thrown away after members ran in it: forget what was
        cached from it in memory (storage.ledger: the near-duplicate indexes)."""

    def configure_group(self, enabled: bool, wait_s: float, max_members: int | None) -> None:
        """GROUP_COMMIT, GROUP_COMMIT_WAIT_MS and GROUP_COMMIT_MAX of a worker (None: the
        database's default, `group_max`)."""
        for group in (self.group, self.fast_group):
            group.enabled, group.wait_s = enabled, wait_s
            group.max_members = group_max(self.engine.dialect.name, max_members)

    # The statement `fast_group` runs for each member (storage.ledger: fastpath's commit).
    _group_sql = ""

    def _auto_group(self, sql: str, params: list[dict[str, Any]]) -> list[Any]:
        """Several one-statement commits (storage.fastpath's `ef_commit`: `sql`) in one
        transaction: BEGIN, the statements, COMMIT and their results in one pipeline (one
        round trip). Members in key order; a lock waited for past storage.group's
        LOCK_TIMEOUT_MS fails the group (each member then commits alone). Raises when the
        transaction failed, after rolling it back: nothing of it is stored. What SQLAlchemy
        does around an execution is kept as in `_auto`.

        COMMIT goes in the same pipeline, not in a round trip of its own after it: each
        `ef_commit` takes its exam's question-order lock (StoreBase._questions_in_order),
        held to the transaction's end, and a COMMIT sent only once this thread had read the
        pipeline's results held that lock across one more round trip and the interpreter
        lock's waits around it (at 2 x 64 threads on a slow 2-core machine, with groups of
        up to 32: 57 lock timeouts in one `scaling` run before, 30 after; the rest is the
        group's size, GROUP_MAX). The test hook still runs before COMMIT is sent, after the
        statements were sent."""
        from psycopg.pq import TransactionStatus
        from psycopg.rows import namedtuple_row

        from storage.group import LOCK_TIMEOUT_MS

        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            pg: Any = conn.connection.driver_connection
            try:
                cursors = []
                with pg.pipeline():
                    pg.execute("BEGIN")
                    pg.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
                    for args in params:
                        cursor = pg.cursor(row_factory=namedtuple_row)
                        text_, args_ = sql, args
                        for fn in conn.dispatch.before_cursor_execute:
                            text_, args_ = fn(conn, cursor, text_, args_, None, False)
                        cursor.execute(text_, args_, prepare=True)
                        cursors.append(cursor)
                    # psycopg has sent each statement as it was queued; the server may
                    # still be running them.
                    self.fast_group.hook("group_commit_before_commit",
                                         collections.Counter(commit=len(params)))
                    pg.execute("COMMIT")
                return [c.fetchone() for c in cursors]
            except Exception as exc:  # noqa: BLE001 - SQLAlchemy's handling decides, and raises
                try:
                    if pg.info.transaction_status != TransactionStatus.IDLE:
                        pg.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the connection is gone: so is the transaction
                    pass
                conn._handle_dbapi_exception(exc, sql, None, None, None)
                raise  # not reached: the handler raises

    def _stmt(self, name: str, build: Callable[[], Any]) -> Any:
        """The hot path's statements, built once per store with bind parameters. SQLAlchemy
        caches the compiled SQL, but building a statement and its cache key on every call
        took a third of a worker's CPU (py-spy, bench/README.md): 130 us a statement against
        16 us for one built once. Two threads building the same one at once is harmless."""
        stmt = self._stmts.get(name)
        if stmt is None:
            stmt = self._stmts[name] = build()
        return stmt

    def _run(self, conn: Connection, name: str, build: Callable[[], Any],
             params: dict[str, Any] | None = None) -> Any:
        """Execute the hot-path statement `name` (built once by `build`, as `_stmt`) with
        `params`. PostgreSQL: through SQLAlchemy. SQLite: its SQL, compiled once, straight to
        the sqlite3 cursor of `conn`'s connection, inside `conn`'s transaction: SQLAlchemy's
        execution of an already compiled statement (its execution context, parameter and
        result processing, events) cost about ten times what SQLite takes to run these
        statements. What SQLAlchemy would do around it is kept: the engine's
        `before_cursor_execute` listeners are called (counters, tests' fault injection), and
        a driver error goes through SQLAlchemy's own handling (its exception types, the
        `handle_error` hook that names a damaged database: storage.db). The result is a
        RawResult (rows as named tuples)."""
        if self._raw is None:
            return conn.execute(self._stmt(name, build), params)
        raw = self._raw.get(name)
        if raw is None:
            raw = self._raw[name] = _Raw(self._stmt(name, build), conn.dialect)
        return self._raw_execute(conn, raw, params or {})

    @staticmethod
    def _raw_execute(conn: Connection, raw: _Raw, params: dict[str, Any] | list[dict[str, Any]]
                     ) -> RawResult:
        if isinstance(params, list):
            if raw.row is None and raw.values_sql(1) is not None:
                # One statement for all the rows, where sqlite3's executemany runs one each.
                return RawResult(*StoreBase._raw_values(conn, raw, params))
            args = [raw.args(p) for p in params]
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            count = _on_cursor(conn, cursor, raw.sql, args, True, _executemany)
            return RawResult(count, [])
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        count, rows = _on_cursor(conn, cursor, raw.sql, raw.args(params), False,
                                 _fetch_all if raw.row is not None else _fetch_none)
        return RawResult(count, StoreBase._made(raw, rows))

    @staticmethod
    def _raw_values(conn: Connection, raw: _Raw, params: list[dict[str, Any]]
                    ) -> tuple[int, list[Any]]:
        """The one-row INSERT `raw` for every parameter set of `params` as multi-row INSERTs
        (`INSERT ... VALUES (...), (...)`), as few as SQLite's limit on a statement's
        parameters allows (one, for a paid call's questions): the rows inserted and what
        their RETURNING gave, in no promised order (SQLite names none). The rows take their
        ids in the order of `params`, as one INSERT each did."""
        count, out = 0, []
        per = max(1, _VALUES_MAX_PARAMS // max(1, len(raw.names)))
        fetch = _fetch_all if raw.row is not None else _fetch_none
        for start in range(0, len(params), per):
            piece = params[start:start + per]
            args = [a for p in piece for a in raw.args(p)]
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            sql = raw.values_sql(len(piece))
            if sql is None:
                raise NotImplementedError(f"not an INSERT of bound values only: {raw.sql}")
            n, rows = _on_cursor(conn, cursor, sql, args, False, fetch)
            count += n
            out.extend(StoreBase._made(raw, rows))
        return count, out

    @staticmethod
    def _made(raw: _Raw, rows: list[Any]) -> list[Any]:
        """The driver's rows of `raw` as its named tuples, through its result processors."""
        if raw.row is None:
            return rows
        if raw.result_procs:
            rows = [list(r) for r in rows]
            for r in rows:
                for i, proc in raw.result_procs:
                    r[i] = proc(r[i])
        make = raw.row._make
        return [make(r) for r in rows]

    def _pg_text(self, name: str, build: Callable[[], Any], params: dict[str, Any]
                 ) -> tuple[str, dict[str, Any]]:
        """A hot-path statement `name` (built once by `build`, as `_stmt`) as PostgreSQL SQL
        text in psycopg's style, compiled once, with `params` and the constants it binds:
        what `_auto` runs."""
        held = self._pg_texts.get(name)
        if held is None:
            compiled = self._stmt(name, build).compile(dialect=self.engine.dialect)
            consts = {k: v for k, v in compiled.params.items()
                      if not compiled.binds[k].required}
            held = self._pg_texts[name] = (compiled.string, consts)
        return held[0], {**held[1], **params}

    @staticmethod
    def _auto(engine: Engine, sql: str, params: dict[str, Any]) -> RawResult:
        """One statement of the PostgreSQL hot path (storage.fastpath's SQL text, in psycopg's
        `%(name)s` style) in autocommit, on psycopg's own cursor: one round trip.
        SQLAlchemy's execution of it (its context and result objects) cost about a tenth of
        a PostgreSQL worker's CPU per call. Prepared at its first use on a connection (a
        round trip once in the connection's life; psycopg's default waits for the fifth
        use): unprepared, the server parses and plans each call again (measured: more of the
        database server's CPU per call at 128 slots, where the machine's two cores are the
        limit). What SQLAlchemy does around an execution is kept, as in `_raw_execute`:
        autocommit set and reset by the pool, the engine's `before_cursor_execute`
        listeners, its handling of a driver error. Rows are named tuples."""
        from psycopg.rows import namedtuple_row

        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            cursor = conn.connection.driver_connection.cursor(  # type: ignore[union-attr]
                row_factory=namedtuple_row)
            count, rows = _on_cursor(conn, cursor, sql, params, False, _fetch_prepared)
            return RawResult(count, rows)

    def _run_many(self, conn: Connection, name: str, build: Callable[[], Any],
                  rows: list[dict[str, Any]], *, returning: bool = False,
                  key: str | None = None) -> list[Any]:
        """`_run` for many parameter sets (an executemany; on SQLite an INSERT's are one
        multi-row INSERT); with `returning`, the first column each row returned, in the order
        of `rows`. SQLite's RETURNING must then give, second, the column bound as `key`."""
        if self._raw is None:
            result = conn.execute(self._stmt(name, build), rows)
            return list(result.scalars().all()) if returning else []
        raw = self._raw.get(name)
        if raw is None:
            raw = self._raw[name] = _Raw(self._stmt(name, build), conn.dialect)
        if not returning:
            self._raw_execute(conn, raw, rows)
            return []
        if key is None:
            raise TypeError("SQLite's multi-row RETURNING needs `key` to order its rows")
        # One multi-row INSERT, whose RETURNING gives its rows in no promised order: each
        # row's first column found by its second, `key` (a value unique among `rows`).
        _, got = self._raw_values(conn, raw, rows)
        by_key = {r[1]: r[0] for r in got}
        return [by_key[row[key]] for row in rows]

    @staticmethod
    def _questions_in_order(conn: Connection, exam: str) -> None:
        """Taken right before a transaction inserts an exam's questions, held until it ends
        (PostgreSQL; SQLite's one writer at a time does the same already): the exam's
        question ids then become visible in id order, so keyset pages by id
        (`GET /exams/SLUG/questions?after=`) never skip a lower id committed after a higher
        one. Without it two chapters' commits take ids from the sequence in one order and
        commit in the other. The queue is only the insert-to-commit tail of a commit."""
        if conn.dialect.name != "postgresql":
            return
        key = int.from_bytes(hashlib.blake2b(exam.encode(), digest_size=4).digest(), "big",
                             signed=True)
        conn.execute(_ORDER_LOCK_SQL, {"ns": _QUESTION_ORDER_LOCK, "k": key})

    @contextlib.contextmanager
    def _write(self, engine: Engine | None = None, urgent: bool = False
               ) -> Iterator[Connection]:
        """One write transaction (on `engine`, default the store's own); `urgent` goes
        before the other writers waiting their turn (SQLite)."""
        engine = engine or self.engine
        if self._writer is None:
            with engine.begin() as conn:
                yield conn
            return
        with self._writer.hold(urgent), self._files, engine.begin() as conn:
            yield conn

    def _read(self) -> Connection:
        """A connection for reads that sees one snapshot across all its statements (a report
        must never pair a chapter's new state with its old question count) and blocks no
        writer: REPEATABLE READ on PostgreSQL, a deferred WAL transaction on SQLite."""
        conn = self.engine.connect()
        if self.engine.dialect.name == "postgresql":
            return conn.execution_options(isolation_level="REPEATABLE READ")
        return conn.execution_options(**{READ_ONLY: True})

    @staticmethod
    def _stored(conn: Connection, slug: str, chapter_id: str) -> int:
        return conn.execute(select(func.count()).select_from(Q).where(
            Q.c.exam == slug, Q.c.chapter_id == chapter_id)).scalar_one()

    @staticmethod
    def _slice_rows(conn: Connection, slug: str, *columns: Any, pending: bool = False
                    ) -> list[Any]:
        """Every slice of the exam with `columns` and the count of questions in its range
        (`stored`), in syllabus order. With `pending`, also `pending`: the verdicts of its
        range still pending, counted only when the exam's policy verifies (exam.verify is
        not `off`: under `off` nothing solves them, so they are not work)."""
        in_range = and_(Q.c.exam == S.c.exam, Q.c.chapter_id == S.c.chapter_id,
                        Q.c.number >= S.c.first_number,
                        Q.c.number < S.c.first_number + S.c.target)
        cols = (S.c.chapter_id, S.c.slice_no, S.c.position, *columns)
        counts = [func.count(Q.c.id).label("stored")]
        if pending:
            counts.append(func.coalesce(func.sum(case(
                (Q.c.verdict == _literal(Verdict.pending.value), 1), else_=0)), 0)
                .label("pending"))
        return list(conn.execute(
            select(*cols, *counts)
            .select_from(S.outerjoin(Q, in_range)).where(S.c.exam == slug)
            .group_by(*cols).order_by(S.c.position, S.c.chapter_id, S.c.slice_no)))

    @staticmethod
    def _require_exam(conn: Connection, slug: str) -> None:
        from examforge.errors import UnknownExam

        if conn.execute(select(E.c.slug).where(E.c.slug == slug)).first() is None:
            raise UnknownExam(f"unknown exam {slug!r}: not in the database (run enqueue first)")

    def _cancel_slices(self, conn: Connection, where: Sequence[Any]) -> list[str]:
        """Cancel the slices `where` selects, keeping the live lease of a holder in a call
        (see Planning.cancel); returns their chapter ids (one per slice)."""
        live = and_(S.c.state == ChapterState.running.value, S.c.lease_expires_at > self._now)
        return list(conn.execute(update(S).where(*where).values(
            state=ChapterState.cancelled.value,
            lease_owner=case((live, S.c.lease_owner), else_=None),
            lease_expires_at=case((live, S.c.lease_expires_at), else_=None),
            updated_at=self._now).returning(S.c.chapter_id)).scalars())
