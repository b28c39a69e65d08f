"""Group commit: the commits a worker process's threads ask for while another commit is in
progress are made together, in one write transaction, by one of them.

Why by hand: neither SQLAlchemy nor the drivers group transactions of several threads (SQLite
has one writer at a time, and each transaction pays its BEGIN IMMEDIATE, its lock hand-over
between threads and processes, and its COMMIT; PostgreSQL pays a round trip and a WAL flush per
commit). The shape is the classic leader and followers (as in database engines' own group
commit): no thread of its own, so a commit that finds nobody committing runs at once in the
asking thread, exactly as without grouping.

- `run(key, work)` queues a member. When no commit is in progress its thread leads: it takes
  every member queued (at most `max_members`), runs them in one transaction, commits it, and
  hands the lead to the first member queued meanwhile, if any. The others wait for their
  group's commit, so each caller returns (and a task acks) only after its own commit.
- A member runs under its own SAVEPOINT: one that raises (its fence failed, a duplicate raced
  in) is rolled back alone and gets its exception; the others are committed. A group of one
  takes no savepoint.
- Members run in key order (exam, chapter, slice): two groups of different processes take the
  rows they share in one order.
- PostgreSQL: a group waits at most `LOCK_TIMEOUT_MS` for any lock. A group holds its members'
  rows together, so it could close a cycle with a statement that locks several of them in
  another order (a cancel's UPDATE of an exam's slices); the deadlock detector would then pick
  a victim after deadlock_timeout (1 s), possibly the cancel. Giving up first, the group is
  always the one that yields: a member that timed out, and every member of a group whose
  transaction failed as a whole, is run again alone, as without grouping.
- The wait for more members: a leader waits at most `wait_s` and only while other threads of
  the process have announced a commit (`coming`) they are still preparing (signing a reply's
  questions takes a few hundred microseconds); alone it waits for nothing.

A member's `work(conn)` must be safe to run again after a rollback (it writes only through
`conn`; what it caches in memory on the way must not outlive a rolled-back transaction:
`on_abort` is called whenever committed-looking work of a group is thrown away).
"""

from __future__ import annotations

import contextlib
from collections import Counter
import threading
import time
from typing import Any, Callable, ContextManager, Generic, Iterator, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

T = TypeVar("T")

# The longest a PostgreSQL group waits for a lock before it gives up and its members commit
# alone: well under deadlock_timeout's default 1 s, so the group, not the other transaction,
# is the one to yield; well over a commit's usual wait behind another (a few ms).
LOCK_TIMEOUT_MS = 250
# PostgreSQL's SQLSTATEs for a lock not granted in time and a deadlock: the member (or group)
# is run again alone.
_YIELD_CODES = {"55P03", "40P01"}


class _Signal:
    """One wake-up, waited for once: a lock taken at birth and released by the waker. (A
    `threading.Event` is a Condition with its own lock and a waiter's lock made at each
    wait: at 64 threads a process, an Event per commit and its notify were a visible share
    of the interpreter lock's time.)"""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        if self._lock.locked():
            self._lock.release()

    def wait(self) -> None:
        self._lock.acquire()
        self._lock.release()


class _Member(Generic[T]):
    __slots__ = ("key", "work", "payload", "kind", "event", "lead", "value", "error", "again")

    def __init__(self, key: tuple[Any, ...], work: Callable[[Connection], T],
                 payload: Any = None, kind: str = "") -> None:
        self.key = key
        self.kind = kind
        self.work = work
        self.payload = payload
        self.event = _Signal()
        self.lead = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.again = False  # yielded a lock: run alone after the group

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[no-any-return]


def kinds(group: list[_Member[Any]]) -> Counter[str]:
    """How many members of each kind a group holds."""
    return Counter(member.kind for member in group)


def yielded(exc: BaseException) -> bool:
    """Whether `exc` is PostgreSQL giving up a lock (lock_timeout) or a deadlock."""
    orig = getattr(exc, "orig", None)
    return isinstance(exc, DBAPIError) and getattr(orig, "sqlstate", None) in _YIELD_CODES


class GroupCommit:
    """One process's group commit on one store (see the module's docstring)."""

    def __init__(self, begin: Callable[[], ContextManager[Any]], dialect: str, *,
                 enabled: bool = True, wait_s: float = 0.002, max_members: int = 32,
                 on_abort: Callable[[], None] = lambda: None,
                 hook: Callable[[str, Counter[str]], None] = lambda step, kinds: None,
                 batch: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self._begin = begin
        # A group's statements as one call (PostgreSQL's one-statement commits, sent in one
        # pipeline): the members' payloads in, their results out, in order; it raises when
        # the group's transaction failed. Without it, each member's `work` in a SAVEPOINT.
        self._batch = batch
        self._pg = dialect == "postgresql"
        self.enabled = enabled
        self.wait_s = wait_s
        self.max_members = max_members
        self._on_abort = on_abort
        self.hook = hook
        self._mutex = threading.Lock()
        self._more = threading.Condition(self._mutex)  # a member queued or a preparer gave up
        self._queue: list[_Member[Any]] = []
        self._busy = False
        self._coming = 0
        self._leader_waits = False  # a leader waits in `_more` for members being prepared
        self._mine = threading.local()  # .coming: this thread's announcement is counted
        # What the groups did, for tests and the benchmark: groups, members, largest group,
        # members run again alone.
        self.stats = {"groups": 0, "members": 0, "largest": 0, "alone_again": 0}

    def queued(self) -> int:
        """The members waiting for a group (tests wait on it)."""
        with self._mutex:
            return len(self._queue)

    @contextlib.contextmanager
    def coming(self) -> Iterator[None]:
        """Announce a commit this thread is preparing: a leader may wait (at most `wait_s`)
        for it to join its group. The announcement ends when the thread's `run` queues it,
        or at the end of the block if it never does."""
        mine = self._mine
        with self._mutex:
            self._coming += 1
            mine.coming = True
        try:
            yield
        finally:
            if mine.coming:
                with self._mutex:
                    self._coming -= 1
                    mine.coming = False
                    if self._leader_waits:
                        self._more.notify_all()

    def run(self, key: tuple[Any, ...], work: Callable[[Connection], T],
            payload: Any = None, kind: str = "") -> T:
        """Run `work(conn)` in a write transaction, committed before this returns, grouped
        with other threads' work when they ask at once. `key` orders the group's members;
        `payload` is what `batch` takes for this member; `kind` names what it is (the test
        hooks count the kinds of a group's members)."""
        if not self.enabled:
            with self._begin() as conn:
                return work(conn)
        m: _Member[T] = _Member(key, work, payload, kind)
        mine = self._mine
        with self._mutex:
            if getattr(mine, "coming", False):
                self._coming -= 1
                mine.coming = False
            self._queue.append(m)
            lead = not self._busy
            self._busy = True
            if not lead and self._leader_waits:
                self._more.notify_all()
        if not lead:
            m.event.wait()
            if not m.lead:
                return m.outcome()
        self._lead()
        return m.outcome()

    def _lead(self) -> None:
        group: list[_Member[Any]] = []
        try:
            with self._mutex:
                if self.wait_s > 0 and self._coming > 0 and len(self._queue) < self.max_members:
                    deadline = time.monotonic() + self.wait_s
                    self._leader_waits = True
                    try:
                        while self._coming > 0 and len(self._queue) < self.max_members:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            self._more.wait(left)
                    finally:
                        self._leader_waits = False
                group, self._queue = (self._queue[:self.max_members],
                                      self._queue[self.max_members:])
            self._commit(group)
        finally:
            # Also after a KeyboardInterrupt or SystemExit (`_commit` gives every other
            # exception to its member): the group's members are woken with what they have,
            # and the lead goes to the first member queued, so that no thread waits for a
            # leader gone. (Leading the next group too, sparing its first member's wake-up,
            # measured slower: the leader's own task waited instead.)
            with self._mutex:
                nxt = self._queue[0] if self._queue else None
                if nxt is None:
                    self._busy = False
                else:
                    nxt.lead = True
            for member in group:
                member.event.set()
            if nxt is not None:
                nxt.event.set()

    def _commit(self, group: list[_Member[Any]]) -> None:
        stats = self.stats
        stats["groups"] += 1
        stats["members"] += len(group)
        stats["largest"] = max(stats["largest"], len(group))
        if len(group) == 1:
            self._alone(group[0])
            return
        group.sort(key=lambda member: member.key)
        if self._batch is not None:
            try:
                values = self._batch([member.payload for member in group])
            except BaseException as exc:  # noqa: B036
                self._abort(group, exc)
            else:
                for member, value in zip(group, values):
                    member.value = value
            self._again(group)
            return
        try:
            with self._begin() as conn:
                if self._pg:
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
                for i, member in enumerate(group):
                    conn.exec_driver_sql("SAVEPOINT ef_member")
                    try:
                        member.value = member.work(conn)
                    except BaseException as exc:  # noqa: B036 - the member gets it, whatever it is
                        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT ef_member")
                        member.value = None
                        if yielded(exc):
                            member.again = True
                        else:
                            member.error = exc
                    else:
                        conn.exec_driver_sql("RELEASE SAVEPOINT ef_member")
                    if i == 0:
                        self.hook("group_commit_member", kinds(group))
                self.hook("group_commit_before_commit", kinds(group))
        except BaseException as exc:  # noqa: B036
            self._abort(group, exc)
        self._again(group)

    def _abort(self, group: list[_Member[Any]], exc: BaseException) -> None:
        """The transaction as a whole failed (its COMMIT, a lost connection, a lock given up
        outside a member): nothing of it is stored. Each member runs again alone, and meets
        the failure (or not) on its own."""
        self._on_abort()
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            for member in group:
                member.error = exc
            raise exc
        for member in group:
            member.value, member.error, member.again = None, None, True

    def _again(self, group: list[_Member[Any]]) -> None:
        stats = self.stats
        for member in group:
            if member.again:
                stats["alone_again"] += 1
                member.again = False
                self._alone(member)

    def _alone(self, member: _Member[Any]) -> None:
        try:
            with self._begin() as conn:
                member.value = member.work(conn)
        except BaseException as exc:  # noqa: B036
            member.value, member.error = None, exc
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
