"""A language per exam (issue 31) on SQLite and PostgreSQL: the syllabus's language is
recorded on the exam and each chapter's on its slices at enqueue; a claim (the general path,
and ef_claim on PostgreSQL) hands the worker its slice's language, whatever the worker's
environment; a first call planned before the claim from a view in another language is not
recorded (the fingerprint counts the language); a chapter whose language changed since its
questions were stored waits for --regenerate, like a changed prompt; `status` and the API
show the language. Migration 0031 is tests/integration/test_migration_language.py."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from examforge.output import Question
from examforge.syllabus import Syllabus
from storage import Store, connect, migrate
from storage.store import CallPlan, Claimed, FirstCall


def _syllabus(language: str = "fa", b: str | None = "en", **extra: Any) -> Syllabus:
    chapters: list[dict[str, Any]] = [{"id": "a", "title": "فصل اول", "questions": 5},
                                      {"id": "b", "title": "Chapter b", "questions": 5}]
    if b is not None:
        chapters[1]["language"] = b
    return Syllabus.model_validate({"title": "آزمون", "language": language,
                                    "chapters": chapters, **extra})


def _languages(store: Store) -> tuple[str, dict[str, set[str]]]:
    with store.engine.connect() as conn:
        exam = conn.execute(text("SELECT language FROM exam WHERE slug = 'ex'")).scalar_one()
        rows = conn.execute(text("SELECT chapter_id, language FROM slice WHERE exam = 'ex'"))
        out: dict[str, set[str]] = {}
        for chapter_id, language in rows:
            out.setdefault(chapter_id, set()).add(language)
    return exam, out


def test_enqueue_records_the_languages_and_a_claim_hands_them_to_the_worker(store: Store):
    plan = store.sync_exam("ex", _syllabus(), slice_questions=3)
    assert plan.language == "fa"
    assert _languages(store) == ("fa", {"a": {"fa"}, "b": {"en"}})  # every slice of each
    claim = store.claim("ex", "a", "w1", 30.0, 8)
    assert isinstance(claim, Claimed) and claim.language == "fa"
    assert claim.view().language == "fa"
    other = store.claim("ex", "b", "w2", 30.0, 8)
    assert isinstance(other, Claimed) and other.language == "en"
    held = store.held_claim("ex", "a", 0, "w1")
    assert held is not None and held.language == "fa"
    report = store.status("ex")
    assert report.language == "fa"
    assert [(c.id, c.language) for c in report.chapter_list] == [("a", "fa"), ("b", "en")]


def test_a_first_call_planned_from_a_view_in_another_language_is_not_recorded(pg_url):
    engine = connect(pg_url)
    migrate(engine)
    store = Store(engine)
    try:
        store.sync_exam("ex", _syllabus(), slice_questions=50)
        known = store.fresh_view("ex", "a", 0)
        assert known is not None and known[0].language == "fa"
        view, fingerprint = known
        # The chapter's language changes (nothing stored yet: no --regenerate needed) after
        # the view was read: its plan was made for a Persian prompt.
        store.sync_exam("ex", _syllabus(language="ar"), slice_questions=50)
        stale = FirstCall(CallPlan(view.next_number, 5, prompt_tokens=1, max_tokens=2),
                          fingerprint)
        replanned: list[Any] = []
        claim = store.claim("ex", "a", "w", 30.0, 8, first=stale,
                            plan_first=lambda v: replanned.append(v) or CallPlan(
                                v.next_number, 5, prompt_tokens=3, max_tokens=4))
        assert isinstance(claim, Claimed) and claim.language == "ar"
        assert [v.language for v in replanned] == ["ar"]  # planned afresh, in Arabic
        with engine.connect() as conn:
            assert conn.execute(text("SELECT prompt_tokens FROM call")).scalars().all() == [3]
        # A view in the slice's own language is recorded by the claim itself.
        fresh = Store(engine)
        b_view, b_fp = fresh.fresh_view("ex", "b", 0) or (None, None)
        assert b_view is not None and b_view.language == "en"
        again = fresh.claim("ex", "b", "w2", 30.0, 8, first=FirstCall(
            CallPlan(b_view.next_number, 5, prompt_tokens=9, max_tokens=9), b_fp),
            plan_first=lambda v: None)
        assert isinstance(again, Claimed) and isinstance(again.first_call, int)
    finally:
        engine.dispose()


def _store_questions(store: Store, chapter: str, n: int) -> None:
    store.import_questions("ex", {chapter: [
        Question(f"سوال شماره {i}؟", (f"a{i}", f"b{i}", f"c{i}", f"d{i}"), 0, "توضیح")
        for i in range(n)]}, "test")


def test_a_changed_language_of_a_chapter_with_questions_waits_for_regenerate(store: Store):
    store.sync_exam("ex", _syllabus(), slice_questions=50)
    _store_questions(store, "a", 2)
    # The exam's language changes: chapter a (which follows it) has questions, b its own.
    plan = store.sync_exam("ex", _syllabus(language="ar"), slice_questions=50)
    assert plan.language == "ar"
    assert plan.skipped["a"].startswith("changed: language (fa, now ar) differs from the 2 "
                                        "stored questions; rerun with --regenerate a")
    assert _languages(store) == ("ar", {"a": {"fa"}, "b": {"en"}})
    # A chapter with nothing stored follows at once.
    store.sync_exam("ex", _syllabus(language="ar", b=None), slice_questions=50)
    assert _languages(store)[1]["b"] == {"ar"}
    plan = store.sync_exam("ex", _syllabus(language="ar", b=None), ["a"], slice_questions=50)
    assert "a" in plan.regenerated and plan.regenerated["a"].change == \
        "its language changed (fa, now ar)"
    assert _languages(store) == ("ar", {"a": {"ar"}, "b": {"ar"}})
    claim = store.claim("ex", "a", "w9", 30.0, 8)
    assert isinstance(claim, Claimed) and claim.language == "ar"
