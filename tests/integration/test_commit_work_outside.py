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
from storage import Store, connect, migrate, neardup
from storage.ledger import _insert_questions, question_row
from storage.models import Withdrawn
from storage.store import Claimed, K, Q, Steer, Usage

ORIGINAL = "Which AWS service provides durable object storage for static website assets?"
PARAPHRASE = "Which of the following AWS services offers durable object storage for static " \
             "website assets?"
OTHER = "What is the default port used by HTTPS?"
UNRELATED = "Which isolation level of a relational database prevents phantom reads entirely?"
NEW = "Which messaging service decouples producers from consumers with durable queues?"


@pytest.fixture
def general(store: Store) -> Store:
    store._fast_commit = False  # PostgreSQL: the general path, as SQLite's
    return store


def _q(text: str) -> Question:
    return Question(text, ("first choice", "second one", "a third", "the fourth"), 0, "Because it is.")


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


def test_an_edit_of_the_highest_question_after_the_claim_is_not_missed(general, tmp_path):
    """The edit keeps the question's id (the scope's highest): only the epoch says the check
    made ahead (against the old text) is stale. Guards `epoch == verdict.epoch`."""
    store = general
    claim = _setup(store, tmp_path)
    _commit(store, claim, [OTHER], 1)
    with store.engine.connect() as conn:
        qid = conn.execute(select(Q.c.id)).scalar_one()
    store.edit("ex", qid, 1, "alice", {"question": ORIGINAL}, near_dup=Checker())
    _, committed = _commit(store, claim, [PARAPHRASE], 2)
    assert committed.kept == () and committed.near_duplicates == 1


def test_a_check_ahead_that_saw_a_rolled_back_row_is_not_reused_for_its_id_reused(
        tmp_path, monkeypatch):
    """A group's member read another member's uncommitted row into the process's index; the
    check ahead of a third commit saw it (its id the index's highest); the group aborted
    (INDEXES cleared) and the id was taken by another question. Same epoch, same highest
    id: the verdict made against the rolled-back text is reused. (SQLite gives a rolled-back
    rowid again; PostgreSQL's sequence does not.)"""
    engine = connect(f"sqlite:///{tmp_path / 'examforge.db'}")
    migrate(engine)
    store = Store(engine)
    claim = _setup(store, tmp_path)
    _commit(store, claim, [OTHER], 1)
    ahead = store._ahead
    made = []

    def racing(claim_, questions, near_dup, signed):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(store, "_ahead", ahead)
        conn = store.engine.connect()
        trans = conn.begin()
        # group member A: its question, uncommitted
        row = {"q_exam": "ex", "q_chapter_id": "a", "q_number": 2, "q_norm_hash": "h-unrel",
               "q_model": "m", "q_call_id": None, "q_created_at": 1.0e9, "q_verdict": None,
               **question_row(_q(UNRELATED), "q_")}
        conn.execute(_insert_questions(), row)
        pid = conn.execute(select(Q.c.id).where(Q.c.norm_hash == "h-unrel")).scalar_one()
        neardup.index(conn, "ex", "a", [pid], [neardup.Signed.of(UNRELATED, claim.title)])
        # group member B's check reads it into the index
        neardup.check(conn, "ex", "a", Checker(), [neardup.Signed.of(OTHER + " x", claim.title)])
        got = ahead(claim_, questions, near_dup, signed)  # this thread's check ahead
        assert got.local is not None and got.local[1] == pid and got.local[0].keep == [True]
        made.append(got)
        trans.rollback()
        conn.close()
        neardup.INDEXES.clear()  # the group's on_abort
        # another commit takes the rolled-back id with the text this batch repeats
        _, c = _commit(store, claim, [ORIGINAL], 2)
        with store.engine.connect() as c2:
            assert c2.execute(select(Q.c.id).where(Q.c.question == ORIGINAL)).scalar_one() == pid
        return got

    monkeypatch.setattr(store, "_ahead", racing)
    _, committed = _commit(store, claim, [PARAPHRASE], 3)
    assert made
    assert committed.kept == () and committed.near_duplicates == 1, committed


def test_an_exact_repeat_dropped_at_commit_does_not_shift_the_check_made_ahead(
        general, tmp_path):
    """Two slices of one chapter: slice 0 stored OTHER and ORIGINAL; slice 1's reply is
    [OTHER, NEW, PARAPHRASE]: OTHER is dropped as an exact repeat, so the check inside runs on
    [NEW, PARAPHRASE] and must not take the verdict made ahead for all three (guards
    `len(keep) < len(hashes)`)."""
    store = general
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 20)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000), slice_questions=10)
    s0 = store.claim("ex", "a", "w0", 30.0, 8, slice_no=0)
    s1 = store.claim("ex", "a", "w1", 30.0, 8, slice_no=1)
    assert isinstance(s0, Claimed) and isinstance(s1, Claimed)
    assert s1.chapter_target > s1.target
    _commit(store, s0, [OTHER, ORIGINAL], 1)
    _, committed = _commit(store, s1, [OTHER, NEW, PARAPHRASE], 11)
    assert committed.kept == (NEW,), committed
    assert committed.near_duplicates == 1


def test_a_claim_older_than_an_edit_does_not_rebuild_the_index_at_every_commit(
        general, tmp_path, monkeypatch):
    """An edit changes the exam's epoch; a slice claimed before it keeps the old one in its
    claim. Its check ahead (`check_local` at the claim's epoch) must not replace the
    process's index of the current epoch with an empty one of the old: the transaction's
    check would then read the whole scope again, inside the write lock, at every commit."""
    store = general
    claim = _setup(store, tmp_path, target=20)
    _commit(store, claim, [OTHER, ORIGINAL, NEW], 1)
    with store.engine.connect() as conn:
        qid = conn.execute(select(Q.c.id).where(Q.c.question == OTHER)).scalar_one()
    store.edit("ex", qid, 1, "alice", {"question": "What port does plain HTTP use by default?"},
               near_dup=Checker())
    read: list[int] = []
    add = neardup._BandIndex.add

    def counting(self, rows):  # type: ignore[no-untyped-def]
        rows = list(rows)
        read.append(len(rows))
        return add(self, rows)

    monkeypatch.setattr(neardup._BandIndex, "add", counting)
    _commit(store, claim, ["Which AWS service runs containers without managing servers?"], 4)
    first = sum(read)  # the rebuild the edit calls for: the scope's 3 questions
    assert first == 3
    read.clear()
    _commit(store, claim, ["Which AWS database service is a managed key-value store?"], 5)
    _commit(store, claim, ["Which AWS service sends notifications to subscribers?"], 6)
    assert max(read, default=0) <= 1, f"the scope read again: {read}"
