"""The general-path commit's work done outside its write transaction (storage.ledger `_Ahead`,
`_After`), on SQLite and the real PostgreSQL: what it computed before the transaction is used
only when the transaction finds the chapter where it assumed, and what it leaves for after
only once committed. (PostgreSQL's commits take the one-round-trip path by default: these
tests take the general one, as VERIFY's commits and every SQLite commit do.)"""

from __future__ import annotations

import pytest
from helpers import write_syllabus
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from examforge.balance import balanced
from examforge.neardup import Checker
from examforge.output import Question
from examforge.syllabus import load_syllabus
from storage import Store, neardup
from storage.models import Withdrawn
from storage.store import Claimed, K, Q, Steer, Usage

ORIGINAL = "Which AWS service provides durable object storage for static website assets?"
PARAPHRASE = "Which of the following AWS services offers durable object storage for static " \
             "website assets?"


@pytest.fixture
def general(store: Store) -> Store:
    store._fast_commit = False  # PostgreSQL: the general path, as SQLite's
    return store


def _q(text: str) -> Question:
    return Question(text, ("first choice", "second one", "a third", "the fourth"), 0, "")


def _setup(store: Store, tmp_path, target: int = 10) -> Claimed:  # type: ignore[no-untyped-def]
    path = write_syllabus(tmp_path / "exams", "ex", [("a", target)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed), claim
    return claim


def _commit(store: Store, claim: Claimed, texts: list[str], first: int):  # type: ignore[no-untyped-def]
    call = store.start_call(claim, first, len(texts), lease_s=30.0)
    return call, store.commit_batch(claim, 30.0, call, [_q(t) for t in texts], model="m",
                                    usage=Usage(1, 1, 0.0), near_dup=Checker(), steer=Steer())


def test_a_near_duplicate_another_process_stored_after_the_check_ahead_is_rejected(
        general, tmp_path, monkeypatch):
    """The check made before the transaction, against this process's index, found nothing;
    another process stored a paraphrase before the transaction began: the transaction reads
    it, sees the index moved, and checks again."""
    store = general
    claim = _setup(store, tmp_path)
    _commit(store, claim, ["What is the default port used by HTTPS?"], 1)
    ahead = store._ahead
    made = []

    def racing(claim_, questions, near_dup, signed):  # type: ignore[no-untyped-def]
        got = ahead(claim_, questions, near_dup, signed)
        assert got.local is not None and got.local[0].keep == [True]  # nothing found ahead
        made.append(got)
        mine = neardup.INDEXES
        monkeypatch.setattr(neardup, "INDEXES", neardup._Indexes())  # "another process"
        monkeypatch.setattr(store, "_ahead", ahead)
        _commit(store, claim, [ORIGINAL], 2)
        monkeypatch.setattr(neardup, "INDEXES", mine)
        return got

    monkeypatch.setattr(store, "_ahead", racing)
    call, committed = _commit(store, claim, [PARAPHRASE], 3)
    assert made, "the commit computed nothing ahead"
    assert committed.kept == () and committed.near_duplicates == 1
    with store.engine.connect() as conn:
        texts = conn.execute(select(Q.c.question).order_by(Q.c.number)).scalars().all()
        outcome = conn.execute(select(K.c.outcome).where(K.c.id == call)).scalar_one()
    assert texts == ["What is the default port used by HTTPS?", ORIGINAL]
    assert outcome == "wasted"


def test_the_check_ahead_is_the_verdict_when_nothing_was_stored_meanwhile(
        general, tmp_path, monkeypatch):
    """No question of the scope above the one the check ahead saw: the transaction reads
    the rows stored since (none) and takes that verdict, looking up no band key."""
    store = general
    claim = _setup(store, tmp_path)
    _commit(store, claim, [ORIGINAL], 1)
    lookups = []
    monkeypatch.setattr(neardup, "_candidates", lambda *a, **k: lookups.append(a) or
                        pytest.fail("checked again inside the transaction"))
    _, committed = _commit(store, claim, [PARAPHRASE], 2)
    assert committed.kept == () and committed.near_duplicates == 1
    _, committed = _commit(store, claim, ["What is the default port used by HTTPS?"], 2)
    assert committed.kept == ("What is the default port used by HTTPS?",)
    assert lookups == []


def test_a_commit_indexes_its_own_questions_without_reading_them_back(general, tmp_path):
    store = general
    claim = _setup(store, tmp_path)
    _commit(store, claim, [ORIGINAL, "What is the default port used by HTTPS?"], 1)
    with store.engine.connect() as conn:
        ids = conn.execute(select(Q.c.id).order_by(Q.c.id)).scalars().all()
        epoch = conn.execute(select(neardup.E.c.index_epoch)).scalar_one()
    idx = neardup.INDEXES.get(neardup.where_of(str(store.engine.url), "ex", "a",
                                               Checker().scope), epoch)
    assert idx.max_id == ids[-1] and set(ids) <= set(idx.sigs)
    assert idx.lookup(neardup.Signed.of(PARAPHRASE, "a").keys) & set(ids)


def test_questions_take_their_numbers_balanced_when_a_gap_breaks_the_guess_ahead(
        general, tmp_path):
    """Rows are made ahead at the numbers that follow the slice's count; a withdrawn
    question's number is the one a replacement takes instead, balanced for it."""
    store = general
    claim = _setup(store, tmp_path)
    _commit(store, claim, ["Question one about storage?", "Question two about queues?",
                           "Question three about caches?"], 1)
    with store.engine.connect() as conn:
        second = conn.execute(select(Q.c.id).where(Q.c.number == 2)).scalar_one()
    store.withdraw("ex", [second], Withdrawn.rejected)
    _, committed = _commit(store, claim, ["Question four about indexes?",
                                          "Question five about locks?"], 2)
    assert len(committed.kept) == 2
    with store.engine.connect() as conn:
        rows = conn.execute(select(Q.c.number, Q.c.question, Q.c.choices)
                            .where(Q.c.number.is_not(None)).order_by(Q.c.number)).all()
    assert [r.number for r in rows] == [1, 2, 3, 4]
    for number, text, choices in rows:
        import json

        assert json.loads(choices) == list(balanced(_q(text), "ex", "a", number).choices)
    assert {r.question: r.number for r in rows}["Question four about indexes?"] == 2


def test_a_failed_read_of_the_next_prompts_list_leaves_the_commit_as_it_is(
        general, tmp_path, monkeypatch):
    """The list is read after the commit: the database failing then loses the list, not
    the questions, and the call stays booked as used."""
    store = general
    claim = _setup(store, tmp_path)

    def down(*a, **k):  # type: ignore[no-untyped-def]
        raise OperationalError("SELECT", {}, Exception("database is gone"))

    monkeypatch.setattr(store, "_recent", down)
    call, committed = _commit(store, claim, [ORIGINAL], 1)
    assert committed.kept == (ORIGINAL,) and committed.recent == ()
    with store.engine.connect() as conn:
        outcome = conn.execute(select(K.c.outcome).where(K.c.id == call)).scalar_one()
    assert outcome == "used"


def test_the_next_prompts_list_read_after_the_commit_holds_the_batch(general, tmp_path):
    store = general
    claim = _setup(store, tmp_path)
    _, first = _commit(store, claim, [ORIGINAL], 1)
    assert ORIGINAL in first.recent
    _, second = _commit(store, claim, ["What is the default port used by HTTPS?"], 2)
    assert {ORIGINAL, "What is the default port used by HTTPS?"} <= set(second.recent)
