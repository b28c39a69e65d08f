"""Store.import_questions on SQLite and on the real PostgreSQL (db_url runs both)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage.base import K, Q, S
from examforge.errors import ChapterBusy, SliceReason, UnknownChapter
from storage.models import CallOutcome
from storage.store import Claimed, Usage


def _sync(store, tmp_path, chapters, slug="ex", slice_questions=50):
    path = write_syllabus(tmp_path / "exams", slug, chapters)
    return store.sync_exam(slug, load_syllabus(path, max_questions=1000),
                           slice_questions=slice_questions)


def _qs(n, start=0, tag="imported"):
    return [Question(f"{tag} {start + i}?", ("a", "b", "c", "d"), 1, "why")
            for i in range(n)]


def _numbers(store, slug="ex"):
    with store.engine.connect() as conn:
        rows = conn.execute(select(Q.c.chapter_id, Q.c.number, Q.c.question, Q.c.model,
                                   Q.c.call_id).where(Q.c.exam == slug)
                            .order_by(Q.c.chapter_id, Q.c.number)).all()
    return rows


def _slices(store, slug="ex"):
    with store.engine.connect() as conn:
        return {(r.chapter_id, r.slice_no): r.state for r in conn.execute(
            select(S.c.chapter_id, S.c.slice_no, S.c.state).where(S.c.exam == slug))}


def test_import_fills_each_slices_free_numbers_in_order_and_marks_full_ones_done(
        store, tmp_path):
    _sync(store, tmp_path, [("a", 12)], slice_questions=5)  # 1-5, 6-10, 11-12
    # A worker stored two questions in the second slice first: numbers 6 and 7.
    claim = store.claim("ex", "a", "w", 10.0, 8, slice_no=1)
    assert isinstance(claim, Claimed) and claim.first_number == 6
    call = store.start_call(claim, 6, 2, lease_s=10.0)
    store.commit_batch(claim, 10.0, call, _qs(2, tag="generated"), model="m",
                       usage=Usage(10, 20, 0.001))
    store.release(claim, retry_in_s=0, code=SliceReason.handed_back, detail="test")

    result = store.import_questions("ex", {"a": _qs(8)}, "naive.jsonl")
    assert (result.imported, result.already_stored, result.past_target) == (8, 0, 0)
    filled = [(s.slice_no, s.first, s.count, s.done) for s in result.chapters[0].slices]
    assert filled == [(0, 1, 5, True), (1, 8, 3, True)]
    assert [r.number for r in _numbers(store)] == list(range(1, 11))
    assert _slices(store) == {("a", 0): "done", ("a", 1): "done", ("a", 2): "pending"}

    more = store.import_questions("ex", {"a": _qs(4, start=100)}, "more.jsonl")
    assert (more.imported, more.past_target) == (2, 2)
    assert [r.number for r in _numbers(store)] == list(range(1, 13))
    assert set(_slices(store).values()) == {"done"}


def test_a_second_import_stores_nothing_and_counts_what_was_already_stored(store, tmp_path):
    _sync(store, tmp_path, [("a", 10), ("b", 10)])
    questions = {"a": _qs(6), "b": _qs(3, tag="b")}
    first = store.import_questions("ex", questions, "f.jsonl")
    assert first.imported == 9
    before = _numbers(store)
    second = store.import_questions("ex", questions, "f.jsonl")
    assert (second.imported, second.already_stored) == (0, 9)
    assert _numbers(store) == before
    # Same text in another case and spacing, and repeated within one file: skipped too.
    again = store.import_questions(
        "ex", {"a": [Question("IMPORTED   0?", ("a", "b", "c", "d"), 0, ""),
                     *_qs(1, start=50), *_qs(1, start=50)]}, "g.jsonl")
    assert (again.imported, again.already_stored, again.repeated) == (1, 1, 1)


def test_the_ledger_shows_the_import_as_zero_cost_rows_apart_from_paid_calls(store, tmp_path):
    _sync(store, tmp_path, [("a", 60), ("b", 5)])  # a: slices 1-50, 51-60
    result = store.import_questions("ex", {"a": _qs(55), "b": _qs(2, tag="b")}, "f.jsonl")
    with store.engine.connect() as conn:
        calls = [dict(r._mapping) for r in conn.execute(
            select(K).where(K.c.exam == "ex").order_by(K.c.id))]
    assert [(c["chapter_id"], c["slice_no"], c["first_number"], c["questions_stored"])
            for c in calls] == [("a", 0, 1, 50), ("a", 1, 51, 5), ("b", 0, 1, 2)]
    for c in calls:
        assert c["outcome"] == CallOutcome.imported.value and c["reason"] is None
        assert (c["model"], c["worker"], c["endpoint"], c["attempt"]) == (
            "import", "import", None, 0)
        assert (c["cost_usd"], c["prompt_tokens"], c["completion_tokens"]) == (0, 0, 0)
        assert c["detail"] == "import from f.jsonl" and c["finished_at"] is not None
    rows = _numbers(store)
    assert {r.model for r in rows} == {"import"}
    by_call = {c["id"]: c["questions_stored"] for c in calls}
    assert {cid: sum(1 for r in rows if r.call_id == cid) for cid in by_call} == by_call
    assert [s.call_id for c in result.chapters for s in c.slices] == list(by_call)
    report = store.status("ex")
    assert report.usage.calls == 0 and report.usage.calls_used == 0  # no request was sent
    assert (report.usage.calls_imported, report.usage.questions_imported) == (3, 57)
    assert report.cost_usd == 0 and report.questions.done == 57
    assert [c.calls for c in report.chapter_list] == [0, 0]
    # What estimates learn per question comes from paid calls only.
    assert store.completion_tokens_per_question() is None


def test_a_claim_after_an_import_numbers_on_from_what_was_imported(store, tmp_path):
    _sync(store, tmp_path, [("a", 12)])
    store.import_questions("ex", {"a": _qs(7)}, "f.jsonl")
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert isinstance(claim, Claimed) and claim.stored == 7 and len(claim.known) == 7
    call = store.start_call(claim, 8, 5, lease_s=10.0)
    done = store.commit_batch(claim, 10.0, call, _qs(5, tag="generated"), model="m",
                              usage=Usage(10, 20, 0.001))
    assert done.done
    assert [r.number for r in _numbers(store)] == list(range(1, 13))


def test_import_is_refused_while_a_worker_holds_a_slice_of_the_chapter(store, tmp_path):
    _sync(store, tmp_path, [("a", 10), ("b", 10)])
    claim = store.claim("ex", "a", "worker-1", 30.0, 8)
    assert isinstance(claim, Claimed)
    with pytest.raises(ChapterBusy, match=r"ex/a is being generated: slice 0 is held by "
                                          r"worker worker-1"):
        store.import_questions("ex", {"b": _qs(2), "a": _qs(2)}, "f.jsonl")
    assert _numbers(store) == []  # not even chapter b: all or nothing
    # Another chapter of the same exam can be imported meanwhile.
    assert store.import_questions("ex", {"b": _qs(2)}, "f.jsonl").imported == 2
    store.release(claim, retry_in_s=0, code=SliceReason.handed_back, detail="test")
    assert store.import_questions("ex", {"a": _qs(2)}, "f.jsonl").imported == 2


def test_import_refuses_a_chapter_the_exam_does_not_have(store, tmp_path):
    _sync(store, tmp_path, [("a", 10)])
    with pytest.raises(UnknownChapter, match="'nope' is not a chapter of exam ex"):
        store.import_questions("ex", {"a": _qs(2), "nope": _qs(1)}, "f.jsonl")
    assert _numbers(store) == []
    assert store.chapter_ids("ex") == ["a"] and store.chapter_ids("other") is None
