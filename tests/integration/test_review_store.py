"""The review's store methods (storage/review.py), on SQLite and the real PostgreSQL (db_url
runs both): approve, reject, edit with its history, the version check under racing threads,
and what exports and `review` read afterwards."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from examforge.errors import Conflict, UnknownQuestion, UserError, VersionConflict
from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage.base import QE, Q


@pytest.fixture
def exam(store, tmp_path):
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 4), ("b", 2)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    store.import_questions("ex", {
        "a": [Question(f"What is a{i}?", (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 1, f"because {i}")
              for i in range(4)],
        "b": [Question(f"What is b{i}?", (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 2, f"since {i}")
              for i in range(2)]}, "test")
    return store


def _ids(store, chapter):
    return [q["id"] for q in store.chapter_questions("ex", chapter)[1]]


def test_questions_start_unreviewed_at_version_1(exam):
    title, items = exam.chapter_questions("ex", "a")
    assert title == "Chapter a" and [q["number"] for q in items] == [1, 2, 3, 4]
    assert {(q["review"], q["version"], q["edited"]) for q in items} == {("unreviewed", 1, False)}
    assert all(q["verdict"] is None and q["source"] is None for q in items)
    summary = {c.chapter_id: c for c in exam.review_summary("ex")}
    assert (summary["a"].questions, summary["a"].unreviewed, summary["a"].approved) == (4, 4, 0)


def test_approve_bumps_the_version_and_records_who(exam):
    qid = _ids(exam, "a")[0]
    view = exam.approve("ex", qid, 1, "client-1")
    assert (view["review"], view["version"], view["reviewed_by"]) == ("approved", 2, "client-1")
    assert exam.approve("ex", qid, 2, "client-2")["version"] == 2  # already approved: no-op
    history = exam.question_history("ex", qid)
    assert [(h["action"], h["version"], h["client"]) for h in history] == [
        ("approve", 2, "client-1")]


def test_a_stale_version_is_refused_with_the_current_one(exam):
    qid = _ids(exam, "a")[0]
    exam.edit("ex", qid, 1, "alice", {"question": "What is A, really?"})
    with pytest.raises(VersionConflict) as caught:
        exam.edit("ex", qid, 1, "bob", {"question": "Bob's text?"})
    assert caught.value.version == 2
    assert caught.value.question["question"] == "What is A, really?"
    with pytest.raises(VersionConflict):
        exam.approve("ex", qid, 1, "bob")
    assert exam.review_question("ex", qid)["question"] == "What is A, really?"
    assert len(exam.question_history("ex", qid)) == 1


def test_an_edit_keeps_the_original_and_exports_carry_the_edit(exam):
    qid = _ids(exam, "a")[1]
    before = exam.review_question("ex", qid)
    exam.approve("ex", qid, 1, "alice")
    view = exam.edit("ex", qid, 2, "bob", {
        "question": "  Edited?  ", "choices": ["p", "q", "r", "s"], "answer_index": 3,
        "explanation": before["explanation"], "difficulty": "hard"})
    # An approved question edited is unreviewed again; the text is stripped as generated.
    assert (view["review"], view["version"], view["edited"]) == ("unreviewed", 3, True)
    assert view["question"] == "Edited?" and view["answer_index"] == 3
    edit = exam.question_history("ex", qid)[-1]
    assert edit["action"] == "edit" and edit["client"] == "bob" and edit["at"] > 0
    assert edit["changes"] == {
        "question": [before["question"], "Edited?"],
        "choices": [before["choices"], ["p", "q", "r", "s"]],
        **({} if before["answer_index"] == 3 else {"answer_index": [before["answer_index"], 3]}),
        "difficulty": [None, "hard"], "review": ["approved", "unreviewed"]}
    exported = {q["number"]: q for q in exam.iter_questions("ex") if q["chapter_id"] == "a"}
    assert exported[2]["question"] == "Edited?" and exported[2]["choices"] == ["p", "q", "r", "s"]
    assert exported[2]["difficulty"] == "hard"


def test_bad_edits_are_refused_and_change_nothing(exam):
    qid = _ids(exam, "a")[0]
    for changes, field in (({"choices": ["a", "a", "b", "c"]}, "choices"),
                           ({"choices": ["a", "b"]}, "choices"),
                           ({"answer_index": 4}, "answer_index"),
                           ({"question": " "}, "question"),
                           ({"difficulty": "extreme"}, "difficulty"),
                           ({"number": 3}, "number")):
        with pytest.raises(UserError, match=field):
            exam.edit("ex", qid, 1, "alice", changes)
    assert exam.review_question("ex", qid)["version"] == 1
    assert exam.question_history("ex", qid) == []
    # The same values again are no change: no version, no history.
    same = exam.review_question("ex", qid)
    assert exam.edit("ex", qid, 1, "alice", {"question": same["question"]})["version"] == 1


def test_reject_is_final_and_never_exported(exam):
    ids = _ids(exam, "b")
    exam.approve("ex", ids[0], 1, "alice")
    view = exam.reject("ex", ids[1], 1, "alice", note="wrong key")
    assert view["review"] == "rejected"
    with pytest.raises(Conflict, match="rejected"):
        exam.approve("ex", ids[1], 2, "bob")
    with pytest.raises(Conflict, match="rejected"):
        exam.edit("ex", ids[1], 2, "bob", {"question": "Again?"})
    assert exam.question_history("ex", ids[1])[-1]["note"] == "wrong key"
    numbers = [(q["chapter_id"], q["number"]) for q in exam.iter_questions("ex")]
    assert ("b", 2) not in numbers and ("b", 1) in numbers and len(numbers) == 5
    approved = [(q["chapter_id"], q["number"]) for q in exam.iter_questions(
        "ex", approved_only=True)]
    assert approved == [("b", 1)]
    summary = {c.chapter_id: c for c in exam.review_summary("ex")}
    assert (summary["b"].approved, summary["b"].rejected) == (1, 1)
    # The rejected one is still listed for the record, after the chapter's bank.
    assert [q["review"] for q in exam.chapter_questions("ex", "b")[1]][-1] == "rejected"


def test_unknown_question_and_another_exams_question(exam, tmp_path):
    with pytest.raises(UnknownQuestion):
        exam.approve("ex", 10**9, 1, "alice")
    path = write_syllabus(tmp_path / "exams", "other", [("a", 1)])
    exam.sync_exam("other", load_syllabus(path, max_questions=1000))
    qid = _ids(exam, "a")[0]
    with pytest.raises(UnknownQuestion):
        exam.approve("other", qid, 1, "alice")


def test_of_many_racing_saves_from_one_version_exactly_one_wins(exam):
    qid = _ids(exam, "a")[2]
    barrier = threading.Barrier(8)
    won, lost = [], []

    def save(i: int) -> None:
        barrier.wait()
        try:
            won.append(exam.edit("ex", qid, 1, f"r{i}", {"explanation": f"reviewer {i}"}))
        except VersionConflict as exc:
            lost.append(exc.version)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and lost == [2] * 7
    assert exam.review_question("ex", qid)["explanation"] == won[0]["explanation"]
    with exam.engine.connect() as conn:
        assert len(conn.execute(select(QE).where(QE.c.question_id == qid)).all()) == 1
        assert conn.execute(select(Q.c.version).where(Q.c.id == qid)).scalar_one() == 2


def test_regenerate_and_prune_drop_the_history(exam, tmp_path):
    qid = _ids(exam, "a")[0]
    exam.approve("ex", qid, 1, "alice")
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 4), ("b", 2)])
    # --discard-reviewed: the reviewed questions go too (without it they are kept,
    # tests/integration/test_reviewed_work_kept.py).
    exam.sync_exam("ex", load_syllabus(path, max_questions=1000), regenerate={"a"},
                   discard_reviewed=True)
    with exam.engine.connect() as conn:
        assert conn.execute(select(QE.c.id).where(QE.c.chapter_id == "a")).all() == []


def test_a_budgeted_exams_review_takes_the_exam_row_first(store, tmp_path):
    """On PostgreSQL the exam row of a budgeted exam is every writer's first lock: a review
    action takes it too (no deadlock with a worker's commit), and works as on any exam."""
    path = write_syllabus(tmp_path / "exams", "bud", [("a", 2)])
    store.sync_exam("bud", load_syllabus(path, max_questions=1000), budget_usd=1.0)
    store.import_questions("bud", {"a": [
        Question(f"Budgeted {i}?", (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 0, "why")
        for i in range(2)]}, "test")
    first, second = store.chapter_questions("bud", "a")[1]
    assert store.reject("bud", first["id"], 1, "alice")["withdrawn"] == "rejected"
    assert store.approve("bud", second["id"], 1, "alice")["review"] == "approved"
    assert [q["number"] for q in store.iter_questions("bud")] == [second["number"]]


def test_a_rejected_question_is_not_counted_as_stored_by_a_dry_run(exam):
    """stored_texts (what `--dry-run` takes as already generated) holds the bank only: a
    rejected question left its number, so the estimate asks for its replacement."""
    exam.reject("ex", _ids(exam, "a")[1], 1, "me")
    texts = exam.stored_texts("ex")
    assert texts["a"] == ["What is a0?", "What is a2?", "What is a3?"]
    assert len(texts["b"]) == 2


def test_a_question_withdrawn_as_disputed_cannot_be_rejected_too(exam):
    """Out of the bank already: a reject would count it twice (disputed in status, rejected
    in review). Refused like an approve or an edit, and nothing changes."""
    qid = _ids(exam, "a")[1]
    assert exam.withdraw("ex", [qid], "disputed").withdrawn == (qid,)
    for act in (lambda: exam.reject("ex", qid, 1, "alice"),
                lambda: exam.approve("ex", qid, 1, "alice"),
                lambda: exam.edit("ex", qid, 1, "alice", {"question": "Other?"})):
        with pytest.raises(Conflict, match="out of the bank already"):
            act()
    view = exam.review_question("ex", qid)
    assert (view["review"], view["withdrawn"], view["version"]) == ("unreviewed", "disputed", 1)
    assert exam.question_history("ex", qid) == []
    summary = {c.chapter_id: c for c in exam.review_summary("ex")}
    assert summary["a"].rejected == 0
