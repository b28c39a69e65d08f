"""Near-duplicates in the store, on SQLite and the real PostgreSQL: rejected at commit and
counted in the call's detail, compared across the exam when asked, atomic between two slices
committing at once (PostgreSQL), and the questions stored before migration 0008 indexed."""

from __future__ import annotations

import struct
import threading

import pytest
from helpers import seed_at_0006, wait_for, write_syllabus
from sqlalchemy import inspect, select, text

from examforge.errors import SliceReason
from examforge.neardup import Checker, Scope
from examforge.output import Question
from examforge.syllabus import load_syllabus
from storage import Store, connect, migrate, neardup
from storage.store import Claimed, K, Steer, Usage

ORIGINAL = "Which AWS service provides durable object storage for static website assets?"
PARAPHRASE = "Which of the following AWS services offers durable object storage for static " \
             "website assets?"


def _q(text: str) -> Question:
    return Question(text, ("a", "b", "c", "d"), 0, "")


def _claim(store: Store, chapter: str = "a", slice_no: int = 0, owner: str = "w") -> Claimed:
    claim = store.claim("ex", chapter, owner, 30.0, 8, slice_no=slice_no)
    assert isinstance(claim, Claimed), claim
    return claim


CHAPTER = Checker()


def _commit(store: Store, claim: Claimed, texts: list[str], checker: Checker = CHAPTER,
            first: int | None = None):  # type: ignore[no-untyped-def]
    call = store.start_call(claim, first or claim.first_number, len(texts), lease_s=30.0)
    return call, store.commit_batch(claim, 30.0, call, [_q(t) for t in texts], model="m",
                                    usage=Usage(1, 1, 0.0), near_dup=checker, steer=Steer())


def _sync(store: Store, tmp_path, chapters, slice_questions: int = 50):  # type: ignore[no-untyped-def]
    path = write_syllabus(tmp_path / "exams", "ex", chapters)
    store.sync_exam("ex", load_syllabus(path, max_questions=1000),
                    slice_questions=slice_questions)


def _detail(store: Store, call_id: int) -> str:
    with store.engine.connect() as conn:
        return conn.execute(select(K.c.detail).where(K.c.id == call_id)).scalar_one() or ""


def test_a_near_duplicate_is_rejected_counted_and_listed_first_in_the_next_prompts(
        store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = _claim(store)
    _commit(store, claim, [ORIGINAL, "What is the default port used by HTTPS?"])
    call, committed = _commit(store, claim, [PARAPHRASE, "What is the default port used by SSH?",
                                             "Which port does HTTPS use by default?"])
    # The paraphrase and the HTTPS reordering are dropped; SSH is another fact.
    assert (committed.stored, committed.near_duplicates, committed.duplicates) == (3, 2, 2)
    assert committed.kept == ("What is the default port used by SSH?",)
    assert _detail(store, call) == "2 near_duplicate rejected"
    # The stored questions the model wrote again come last in the list (kept when it is cut).
    assert set(committed.recent[-2:]) == {ORIGINAL, "What is the default port used by HTTPS?"}
    with store.engine.connect() as conn:
        repeats = dict(conn.execute(select(neardup.Q.c.question, neardup.QS.c.repeats).join(
            neardup.QS, neardup.QS.c.question_id == neardup.Q.c.id)).all())
    assert repeats == {ORIGINAL: 1, "What is the default port used by HTTPS?": 1,
                       "What is the default port used by SSH?": 0}


def test_a_batch_of_nothing_but_near_duplicates_is_wasted_and_re_asked(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    claim = _claim(store)
    _commit(store, claim, [ORIGINAL])
    call, committed = _commit(store, claim, [PARAPHRASE], first=2)
    assert (committed.stored, committed.kept, committed.next_call) == (1, (), None)
    with store.engine.connect() as conn:
        row = conn.execute(select(K.c.outcome, K.c.reason, K.c.detail)
                           .where(K.c.id == call)).one()
    assert (row.outcome, row.reason) == ("wasted", "invalid_output")
    assert "1 near_duplicate rejected" in row.detail


def test_two_near_duplicates_in_one_batch_keep_the_first(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    _, committed = _commit(store, _claim(store), [ORIGINAL, PARAPHRASE])
    assert committed.kept == (ORIGINAL,) and committed.near_duplicates == 1


def test_the_exam_scope_compares_with_every_chapter(store, tmp_path):
    _sync(store, tmp_path, [("a", 10), ("b", 10), ("c", 10)])
    _commit(store, _claim(store, "a"), [ORIGINAL])
    _, in_chapter = _commit(store, _claim(store, "b"), [PARAPHRASE])
    assert in_chapter.kept == (PARAPHRASE,)  # the default scope: its own chapter only
    _, in_exam = _commit(store, _claim(store, "c"),
                         [("Which AWS service offers durable object storage for static website "
                          "assets?")], Checker(scope=Scope.exam))
    assert in_exam.kept == () and in_exam.near_duplicates == 1


@pytest.mark.parametrize("locked", [True, False], ids=["with the lock", "without it"])
def test_two_slices_committing_near_duplicates_at_once_store_only_one(
        pg_url, tmp_path, monkeypatch, locked):
    """Slice 0's commit is held inside its transaction, after its check and insert; slice 1
    commits a paraphrase meanwhile, through a second store (another worker process: within
    one process, commits take turns in its group commit before they reach the database).
    With the chapter's lock row, slice 1 waits for slice 0's commit and then finds its
    question; without it (the control), both land."""
    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    _sync(store, tmp_path, [("a", 20)], slice_questions=10)
    first, second = _claim(store, slice_no=0, owner="w0"), _claim(store, slice_no=1, owner="w1")
    inside, release = threading.Event(), threading.Event()
    index = neardup.index

    def held_index(conn, exam, chapter_id, ids, signed):  # type: ignore[no-untyped-def]
        index(conn, exam, chapter_id, ids, signed)
        if threading.current_thread().name == "slice-0":
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(neardup, "index", held_index)
    if not locked:
        from storage.base import StoreBase

        monkeypatch.setattr(neardup, "lock", lambda *args: None)
        # The exam's question-order lock would queue slice 1's insert too (after its check,
        # which is what the control must show unguarded).
        monkeypatch.setattr(StoreBase, "_questions_in_order", staticmethod(lambda *args: None))
    results: dict[str, object] = {}
    other = Store(connect(pg_url))

    def commit(name: str, claim: Claimed, texts: list[str]) -> None:
        results[name] = _commit(store if name == "0" else other, claim, texts)[1]

    t0 = threading.Thread(target=commit, name="slice-0", args=("0", first, [ORIGINAL]))
    t0.start()
    assert inside.wait(30)
    t1 = threading.Thread(target=commit, name="slice-1", args=("1", second, [PARAPHRASE]))
    t1.start()
    if locked:
        def waiting_on_lock() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%dedup_lock%'")).scalar())

        wait_for(waiting_on_lock, 30, "slice 1 to wait for the chapter's lock")
    else:
        t1.join(30)
        assert "1" in results  # it did not wait for slice 0
    release.set()
    t0.join(30)
    t1.join(30)
    stored = [q["question"] for q in store.questions("ex")]
    if locked:
        assert stored == [ORIGINAL]
        assert results["1"].near_duplicates == 1  # type: ignore[attr-defined]
    else:
        assert sorted(stored) == sorted([ORIGINAL, PARAPHRASE])
    engine.dispose()
    other.engine.dispose()


def test_0008_indexes_the_questions_stored_before_it(db_url):
    engine = connect(db_url)
    with engine.begin() as conn:
        seed_at_0006(conn, title="Storage", target=10)
        for n, q in enumerate([ORIGINAL, "What is the default port used by HTTPS?"], 1):
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, norm_hash, model, created_at) VALUES "
                "('ex', 'a', :n, :q, '[]', 0, '', :h, 'm', 1)"), {"n": n, "q": q, "h": str(n)})
    migrate(engine)
    store = Store(engine)
    with engine.connect() as conn:
        signed = conn.execute(text("SELECT count(*) FROM question_sig")).scalar_one()
        bands = conn.execute(text("SELECT count(*) FROM question_sig WHERE length(bands) = 512")
                             ).scalar_one()
    assert (signed, bands) == (2, 2)
    _, committed = _commit(store, _claim(store), [PARAPHRASE, "Which port does SSH use?"],
                           first=3)
    assert committed.kept == ("Which port does SSH use?",) and committed.near_duplicates == 1
    engine.dispose()


def test_imported_questions_are_indexed_and_a_regenerated_chapter_forgets_its_own(
        store, tmp_path):
    _sync(store, tmp_path, [("a", 10), ("b", 10)])
    store.import_questions("ex", {"a": [_q(ORIGINAL)], "b": [_q(ORIGINAL)]}, "bank.jsonl")
    claim = _claim(store, "a")
    _, committed = _commit(store, claim, [PARAPHRASE], first=2)
    assert committed.kept == () and committed.near_duplicates == 1
    store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="test")
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 10), ("b", 10)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000), regenerate=["a"])
    with store.engine.connect() as conn:
        left = {c for (c,) in conn.execute(select(neardup.QS.c.chapter_id))}
    assert left == {"b"}  # chapter a's questions and their index rows are gone together
    _, again = _commit(store, _claim(store, "a"), [PARAPHRASE])
    assert again.kept == (PARAPHRASE,)


def test_a_process_sees_what_other_processes_stored_since_it_last_looked(
        store, tmp_path, monkeypatch):
    """Each process keeps its own in-memory band index and reads the rows stored since it
    last looked: a question another process (here, another index registry) stored after
    this one built its index is still found."""
    _sync(store, tmp_path, [("a", 10)])
    claim = _claim(store)
    _commit(store, claim, ["What is the default port used by HTTPS?"])  # this process looks
    other = neardup._Indexes()
    mine = neardup.INDEXES
    monkeypatch.setattr(neardup, "INDEXES", other)
    _commit(store, claim, [ORIGINAL], first=2)  # stored by "another process"
    monkeypatch.setattr(neardup, "INDEXES", mine)
    _, committed = _commit(store, claim, [PARAPHRASE], first=3)
    assert committed.kept == () and committed.near_duplicates == 1
    # And a process that starts afresh builds its index from the rows.
    monkeypatch.setattr(neardup, "INDEXES", neardup._Indexes())
    _, again = _commit(store, claim, ["Which AWS service offers durable object storage for "
                                      "static website assets?"], first=3)
    assert again.kept == () and again.near_duplicates == 1


def test_an_index_is_rebuilt_when_its_exam_lost_questions(store, tmp_path):
    """SQLite gives a deleted question's id to the next one: a process's index that only
    read ids above the highest it had would never see the new question. Regenerating the
    chapter changes the exam's index epoch, and the index is rebuilt."""
    _sync(store, tmp_path, [("a", 10)])
    claim = _claim(store)
    _commit(store, claim, ["What is the default port used by HTTPS?",
                           "What is the default port used by SSH?", "Which port does FTP use?"])
    _commit(store, claim, ["Which port does SMTP use?"], first=4)  # the index reads ids 1-3
    store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="test")
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 10)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000), regenerate=["a"])
    claim = _claim(store)
    _commit(store, claim, [ORIGINAL])  # on SQLite, id 1 again
    _, committed = _commit(store, claim, [PARAPHRASE], first=2)
    assert committed.kept == () and committed.near_duplicates == 1


def test_an_import_skips_near_duplicates_of_stored_questions_and_of_its_own_lines(
        store, tmp_path):
    _sync(store, tmp_path, [("a", 200)], slice_questions=200)
    store.import_questions("ex", {"a": [_q(ORIGINAL)]}, "first.jsonl", near_dup=CHAPTER)
    # A file of 100 distinct questions with a paraphrase of the stored one and of its own
    # first line: past 64 lines, its own lines are compared through band keys of their own.
    lines = [f"What is the default port number used by protocol number {n}?"
             for n in range(100)]
    lines += [PARAPHRASE, "What's the default port number used by protocol number 0?"]
    result = store.import_questions("ex", {"a": [_q(t) for t in lines]}, "second.jsonl",
                                    near_dup=CHAPTER)
    assert (result.imported, result.near_duplicates) == (100, 2)
    # Without a checker (NEAR_DUP_SCOPE=off) both land.
    more = store.import_questions("ex", {"a": [_q(PARAPHRASE)]}, "third.jsonl")
    assert more.imported == 1


def test_0011_moves_the_band_keys_onto_the_signature_rows_and_back(db_url):
    """0011 copies each question's band keys from question_band (as 0008 wrote them) onto its
    question_sig row, gives every exam an index epoch and drops the table; its downgrade
    writes the rows back."""
    from alembic import command

    from examforge.neardup import band_keys, signature
    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        seed_at_0006(conn, title="Storage", target=10)
        conn.execute(text(
            "INSERT INTO question (exam, chapter_id, number, question, choices, answer_index, "
            "explanation, norm_hash, model, created_at) VALUES "
            "('ex', 'a', 1, :q, '[]', 0, '', 'h1', 'm', 1)"), {"q": ORIGINAL})
        command.upgrade(alembic_config(conn), "0010")
        before = conn.execute(text("SELECT count(*) FROM question_band")).scalar_one()
    migrate(engine)
    expected = sorted(set(band_keys(signature(ORIGINAL, "Storage"))))
    with engine.connect() as conn:
        blob = conn.execute(text("SELECT bands FROM question_sig")).scalar_one()
        epoch = conn.execute(text("SELECT index_epoch FROM exam")).scalar_one()
        assert "question_band" not in inspect(conn).get_table_names()
    assert before == 64 and sorted(struct.unpack("<64Q", blob)) == expected
    assert epoch is not None
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0010")
        back = sorted(conn.execute(text("SELECT band_key FROM question_band")).scalars())
    assert back == expected
    engine.dispose()


def test_question_ids_become_visible_in_id_order_on_postgresql(pg_url, tmp_path):
    """Two chapters' commits on PostgreSQL: a commit that has taken its question ids waits
    for the exam's order lock, so no lower id is ever committed after a higher one (a keyset
    page `after=` the higher one would skip it). The lock is held here by a bare transaction
    that inserted a question; chapter b's commit must queue behind it, and its ids must come
    after."""
    from sqlalchemy import text

    from storage import Store, connect, migrate

    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    _sync(store, tmp_path, [("a", 5), ("b", 5)])
    claim = _claim(store, "b")
    call = store.start_call(claim, 1, 1, lease_s=30.0)
    holder = engine.connect()
    holder_tx = holder.begin()
    Store._questions_in_order(holder, "ex")
    held_id = holder.execute(text(
        "INSERT INTO question (exam, chapter_id, number, question, choices, answer_index, "
        "explanation, norm_hash, model, created_at) VALUES ('ex', 'a', 1, 'Held?', '[]', 0, "
        "'', 'h-held', 'm', 0) RETURNING id")).scalar_one()
    done = threading.Event()

    def commit() -> None:
        store.commit_batch(claim, 30.0, call, [_q("Which port does SSH use by default?")],
                           model="m", usage=Usage(1, 1, 0.0), near_dup=CHAPTER, steer=Steer())
        done.set()

    worker = threading.Thread(target=commit)
    worker.start()
    with engine.connect() as probe:
        wait_for(lambda: probe.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"))
            .scalar_one() == 1, 10, "chapter b's commit to queue on the order lock")
    assert not done.is_set()
    holder_tx.commit()
    holder.close()
    worker.join(10)
    assert done.is_set()
    with engine.connect() as conn:
        b_id = conn.execute(text("SELECT id FROM question WHERE chapter_id = 'b'")).scalar_one()
    assert b_id > held_id
    engine.dispose()


def test_the_steering_sample_covers_the_whole_chapter_over_a_few_calls(store, tmp_path):
    """storage.neardup.steering: each call's sample is drawn anew, so the prompts cover the
    whole chapter; the newest are listed apart, and nothing is listed twice."""
    _sync(store, tmp_path, [("a", 200)], slice_questions=200)
    claim = _claim(store)
    for start in range(0, 200, 20):
        _commit(store, claim, [f"Stored question number {n}?" for n in range(start, start + 20)],
                checker=None)
    steer = Steer(avoid=40)
    shown: set[str] = set()
    with store.engine.connect() as conn:
        for seed in range(30):
            picked = neardup.steered(conn, steer, "ex", "a", 200, seed=seed)
            assert len(picked) == len(set(picked)) <= 40
            assert picked.newest == tuple(f"Stored question number {n}?" for n in range(190, 200))
            assert picked.sample and not set(picked.sample) & set(picked.newest)
            shown.update(picked)
    assert len(shown) >= 190, len(shown)  # 30 draws of 30 of 200: about 1 in 130 missed
