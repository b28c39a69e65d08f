"""What a paid call's commit sends SQLite, pinned: each statement there is some 30-40 µs of a
worker's CPU (docs/explanations/benchmarks.md), so a change that adds one must say so here.
And what cutting them relies on: a commit's questions and their signatures go in one
multi-row INSERT each, the signatures under the right question ids however the INSERT is cut
in pieces; the exam row is read once, and an exam's failed logins are still reset by a
commit (on both databases)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from helpers import write_syllabus
from sqlalchemy import event, text

import storage.base
from examforge.errors import SliceReason
from examforge.neardup import Checker
from examforge.output import Question
from examforge.syllabus import load_syllabus
from storage import Store, neardup
from storage.store import Claimed, Steer, Usage
from storage.types import CallPlan

pytestmark = pytest.mark.integration


def _sync(store: Store, tmp_path: Any, chapters: list[tuple[str, int]]) -> None:
    path = write_syllabus(tmp_path / "exams", "ex", chapters)
    store.sync_exam("ex", load_syllabus(path, max_questions=100))


def _questions(chapter: str, n: int = 5) -> list[Question]:
    # Distinct enough that none is a near-duplicate of another.
    topics = ["replication lag", "write-ahead logging", "vacuum freezing", "index bloat",
              "lock escalation", "query planning", "connection pooling", "checkpoint tuning"]
    return [Question(f"{chapter}: what causes {topics[i]} in a database cluster?",
                     ("a", "b", "c", "d"), 0, "") for i in range(n)]


class _Counted:
    """The statements SQLAlchemy hands the driver (its `before_cursor_execute`, which the
    store's raw SQLite path calls too) and those the SQLite library runs (sqlite3's trace
    callback: COMMIT included, an executemany once per row), while `on`."""

    def __init__(self, store: Store) -> None:
        self.on = False
        self.sql: list[str] = []
        self.full: list[str] = []  # every statement seen while on, whole
        self.driver = 0
        store.engine.dispose()  # every connection from now on is traced
        event.listen(store.engine, "before_cursor_execute", self._sql)
        event.listen(store.engine.pool, "connect", self._connect)

    def _sql(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if self.on:
            self.sql.append(" ".join(statement.split())[:90])
            self.full.append(" ".join(statement.split()))

    def _connect(self, dbapi: Any, _record: Any) -> None:
        dbapi.set_trace_callback(self._trace)

    def _trace(self, _statement: str) -> None:
        if self.on:
            self.driver += 1

    def start(self) -> None:
        self.on, self.sql, self.driver = True, [], 0

    def stop(self) -> tuple[list[str], int]:
        self.on = False
        return self.sql, self.driver


def test_a_one_call_chapter_on_sqlite_sends_the_statements_pinned_here(sqlite_url, tmp_path):
    from storage import connect, migrate

    engine = connect(sqlite_url)
    migrate(engine)
    store = Store(engine)
    try:
        _sync(store, tmp_path, [("a", 5), ("b", 5), ("c", 5)])
        counted = _Counted(store)
        for chapter in ("a", "b"):  # the second: what every chapter after the first sends
            counted.start()
            # A long lease: the claim skips its second stamp however slow the machine.
            claim = store.claim("ex", chapter, f"w-{chapter}", 300.0, 8, steer=Steer(),
                                plan_first=lambda view: CallPlan(1, 5, 100, 500))
            assert isinstance(claim, Claimed) and claim.first_call is not None
            store.may_send(claim, claim.first_call)
            claim_sql, claim_driver = counted.stop()
            counted.start()
            done = store.commit_batch(claim, 30.0, claim.first_call, _questions(chapter),
                                      model="m", usage=Usage(10, 20, 0.001),
                                      near_dup=Checker(), steer=Steer())
            commit_sql, commit_driver = counted.stop()
            assert done.stored == 5 and done.done, done
        # The claim: BEGIN, the lease (returning the slice with its exam's budget and its
        # count of calls in flight: none, so no dead holders' calls to book), its questions,
        # the first call's row (planned at once: no second stamp of the lease);
        # may_send's read.
        assert len(claim_sql) == 5, claim_sql
        # The commit: BEGIN, the fence, the exam row (budget, failed logins, index epoch),
        # the scope's new signatures, the free numbers, the questions (one INSERT), their
        # signatures (one INSERT), the slice's progress and end, the call's booking.
        assert len(commit_sql) == 9, commit_sql
        assert [s.split(" (")[0] for s in commit_sql if s.startswith("INSERT")] == [
            "INSERT INTO question", "INSERT INTO question_sig"]
        # What the SQLite library ran: the same, and the two COMMITs (may_send's read and a
        # deferred transaction's end add none: a read runs in autocommit).
        assert claim_driver + commit_driver == len(claim_sql) + len(commit_sql) + 2, (
            claim_driver, commit_driver)
        # No statement compares a call's outcome with a bound parameter: a value bound where
        # a partial index's condition names the column (ix_call_in_flight: outcome =
        # 'in_flight') makes SQLite prepare the statement again at every execution, 60-70 µs
        # (storage.base.IN_FLIGHT_CALL writes it inline).
        # A takeover: the dead holder's call in flight is booked (its reservation settled
        # only where the exam has a budget, as read by the claim), one statement more.
        dead = store.claim("ex", "c", "w-dead", 0.05, 8,
                           plan_first=lambda view: CallPlan(1, 5, 100, 500))
        assert isinstance(dead, Claimed) and dead.first_call is not None
        time.sleep(0.1)  # its lease lapses on the database's clock
        counted.start()
        heir = store.claim("ex", "c", "w-heir", 300.0, 8, steer=Steer(),
                           plan_first=lambda view: CallPlan(1, 5, 100, 500))
        takeover_sql, _ = counted.stop()
        assert isinstance(heir, Claimed) and heir.took_over_calls == 1
        assert len(takeover_sql) == 5 and takeover_sql[2].startswith("UPDATE call"), \
            "\n".join(takeover_sql)
        bound = [s for s in counted.full if re.search(r"\boutcome = \?", s.split(" WHERE ", 1)[-1])
                 and " WHERE " in s]
        assert not bound, bound
    finally:
        engine.dispose()


def test_signatures_go_under_their_own_question_ids_however_the_insert_is_cut(
        db_url, tmp_path, monkeypatch):
    from storage import connect, migrate

    # Two questions a piece (20 columns each), five signatures: three pieces and one.
    monkeypatch.setattr(storage.base, "_VALUES_MAX_PARAMS", 40)
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    try:
        _sync(store, tmp_path, [("a", 10)])
        claim = store.claim("ex", "a", "w", 30.0, 8)
        assert isinstance(claim, Claimed)
        call = store.start_call(claim, 1, 5, lease_s=30.0)
        texts = [q.question for q in _questions("a", 8)]
        store.commit_batch(claim, 30.0, call, [Question(t, ("a", "b", "c", "d"), 0, "")
                                               for t in texts[:5]],
                           model="m", usage=Usage(1, 1, 0.0), near_dup=Checker(), steer=Steer())
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT q.id, q.number, q.question, s.tokens, s.key_terms FROM question q "
                "JOIN question_sig s ON s.question_id = q.id ORDER BY q.number")).all()
        assert [r.number for r in rows] == [1, 2, 3, 4, 5]
        assert [r.question for r in rows] == texts[:5]
        assert [r.id for r in rows] == sorted(r.id for r in rows)  # ids in number order
        for r in rows:
            sig = neardup.Signed.of(r.question, claim.title, claim.language).sig
            assert sig.encode() == (r.tokens, r.key_terms), r.question
    finally:
        engine.dispose()


def test_a_commit_resets_the_exams_failed_logins(store, tmp_path):
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    failed = store.claim("ex", "b", "w-b", 30.0, 8)
    assert isinstance(failed, Claimed)
    store.fail(failed, SliceReason.auth, "HTTP 401", pause_exam_after=3)

    def failures() -> int:
        with store.engine.connect() as conn:
            return conn.execute(text("SELECT auth_failures FROM exam WHERE slug = 'ex'")
                                ).scalar_one()

    assert failures() == 1
    claim = store.claim("ex", "a", "w-a", 30.0, 8)
    assert isinstance(claim, Claimed)
    call = store.start_call(claim, 1, 5, lease_s=30.0)
    done = store.commit_batch(claim, 30.0, call, _questions("a"), model="m",
                              usage=Usage(1, 1, 0.0), near_dup=Checker(), steer=Steer())
    assert done.done
    assert failures() == 0
