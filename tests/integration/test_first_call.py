"""A slice's first call planned before its claim from the open slices' specs
(Leases.fresh_view) and recorded by the claim only when the slice is what the plan assumed
(the same spec, nothing stored in the chapter, no sources); otherwise nothing is recorded from
it and the call is planned from what the claim read. PostgreSQL records it in the claim's own
statement (migration 0026); SQLite in the claim's write transaction, without planning inside
it. The claim also returns the chapter's course material, on both databases."""

from __future__ import annotations

import sqlite3
from typing import Any, Iterator

import pytest
from sqlalchemy import event, text

from examforge.sources import ChapterMaterial, read_material
from examforge.syllabus import Syllabus
from helpers import migrates_at_once
from storage import Store, connect, migrate
from storage import leases as leases_module
from storage.store import CallPlan, ChapterView, Claimed, FirstCall, NoRoom


def _syllabus(chapters: list[dict[str, Any]]) -> Syllabus:
    return Syllabus.model_validate({"title": "T", "chapters": chapters})


def _open(url: str) -> Iterator[tuple[Store, list[str]]]:
    engine = connect(url)
    migrate(engine)
    store = Store(engine)
    store.sync_exam("ex", _syllabus([{"id": "a", "title": "A", "questions": 5},
                                     {"id": "b", "title": "B", "questions": 5}]),
                    slice_questions=50)
    statements: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _log(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        statements.append(statement.split("(")[0])

    yield store, statements
    engine.dispose()


@pytest.fixture
@migrates_at_once
def pg_store(db_url):  # type: ignore[no-untyped-def]
    """Both databases (the name is older than SQLite's planning before the claim)."""
    yield from _open(db_url)


@pytest.fixture
def sqlite_store(sqlite_url):  # type: ignore[no-untyped-def]
    yield from _open(sqlite_url)


def _calls(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT chapter_id, requested, prompt_tokens, reserved_usd, "
                                 "outcome FROM call ORDER BY id")).all()


def _first(store: Store, chapter: str, requested: int = 5, reserve: float = 0.01
           ) -> tuple[ChapterView, FirstCall]:
    known = store.fresh_view("ex", chapter, 0)
    assert known is not None
    view, fingerprint = known
    return view, FirstCall(CallPlan(view.next_number, requested, prompt_tokens=111,
                                    max_tokens=222, reserve_usd=reserve), fingerprint)


class Replan:
    """plan_first: what the pipeline's `_Calls.replan` does, counted."""

    def __init__(self, requested: int = 3) -> None:
        self.views: list[ChapterView] = []
        self.requested = requested

    def __call__(self, view: ChapterView) -> CallPlan:
        self.views.append(view)
        return CallPlan(view.next_number, self.requested, prompt_tokens=7, max_tokens=9)


def test_the_first_call_planned_before_the_claim_is_recorded_by_the_claim(pg_store):
    store, statements = pg_store
    store.set_budget("ex", 1.0)
    view, first = _first(store, "a")
    assert (view.title, view.stored, view.target, view.exam_title) == ("A", 0, 5, "T")
    statements.clear()
    replan = Replan()
    claim = store.claim("ex", "a", "w", 30.0, 8, plan_first=replan, first=first)
    assert isinstance(claim, Claimed) and isinstance(claim.first_call, int)
    if store.engine.dialect.name == "postgresql":
        assert statements == ["SELECT * FROM ef_claim"], "one statement for the claim and call"
    assert replan.views == [], "nothing planned inside the claim"
    assert [tuple(r) for r in _calls(store)] == [("a", 5, 111, 0.01, "in_flight")]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT reserved_usd FROM exam")).scalar_one() == \
            pytest.approx(0.01)


def test_a_spec_changed_since_it_was_read_is_planned_again_from_the_claim(pg_store):
    store, _ = pg_store
    _view, first = _first(store, "a")
    with store.engine.begin() as conn:  # a --regenerate with a new prompt, say
        conn.execute(text("UPDATE slice SET prompt = 'new' WHERE chapter_id = 'a'"))
    replan = Replan()
    claim = store.claim("ex", "a", "w", 30.0, 8, plan_first=replan, first=first)
    assert isinstance(claim, Claimed) and isinstance(claim.first_call, int)
    assert [v.prompt for v in replan.views] == ["new"]
    assert [tuple(r)[:3] for r in _calls(store)] == [("a", 3, 7)]  # the replanned call


def test_a_chapter_with_questions_is_planned_from_what_the_claim_read(pg_store):
    store, _ = pg_store
    _view, first = _first(store, "a")
    with store.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO question (exam, chapter_id, number, question, choices, answer_index, "
            "explanation, norm_hash, model, created_at) VALUES ('ex', 'a', 1, 'q?', "
            "'[\"x\", \"y\"]', 0, '', 'h1', 'm', 0)"))
    replan = Replan()
    claim = store.claim("ex", "a", "w", 30.0, 8, plan_first=replan, first=first)
    assert isinstance(claim, Claimed) and claim.stored == 1
    assert [(v.stored, v.recent) for v in replan.views] == [(1, ("q?",))]
    assert [tuple(r)[:3] for r in _calls(store)] == [("a", 3, 7)]


def test_no_room_in_the_budget_for_the_first_call_is_said_not_recorded(pg_store):
    store, _ = pg_store
    store.set_budget("ex", 0.001)
    _view, first = _first(store, "a", reserve=0.01)
    claim = store.claim("ex", "a", "w", 30.0, 8, plan_first=Replan(), first=first)
    assert isinstance(claim, Claimed) and isinstance(claim.first_call, NoRoom)
    assert _calls(store) == []


def test_a_claim_not_won_records_nothing(pg_store):
    store, _ = pg_store
    _view, first = _first(store, "a")
    assert isinstance(store.claim("ex", "a", "holder", 30.0, 8), Claimed)
    replan = Replan()
    assert not isinstance(store.claim("ex", "a", "w", 30.0, 8, plan_first=replan,
                                      first=first), Claimed)
    assert _calls(store) == [] and replan.views == []


def test_a_slice_added_later_is_read_again_and_finished_ones_are_not_offered(
        pg_store, monkeypatch):
    store, statements = pg_store
    assert store.fresh_view("ex", "a", 0) is not None
    statements.clear()
    assert store.fresh_view("ex", "b", 0) is not None  # read once per exam, not per slice
    assert statements == []
    store.sync_exam("ex", _syllabus([{"id": "a", "title": "A", "questions": 5},
                                     {"id": "b", "title": "B", "questions": 5},
                                     {"id": "c", "title": "C", "questions": 5}]),
                    slice_questions=50)
    assert store.fresh_view("ex", "c", 0) is None  # not again within FRESH_REREAD_S
    monkeypatch.setattr(leases_module, "FRESH_REREAD_S", 0.0)
    assert store.fresh_view("ex", "c", 0) is not None
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE slice SET state = 'done' WHERE chapter_id = 'b'"))
    assert store.fresh_view("ex", "nope", 0) is None  # a miss reads again: b is gone
    assert store.fresh_view("ex", "b", 0) is None


def test_views_not_read_for_a_while_are_forgotten_at_the_next_read(pg_store, monkeypatch):
    """A worker that serves exam after exam keeps only the recent exams' views."""
    store, _ = pg_store
    store.sync_exam("other", _syllabus([{"id": "x", "title": "X", "questions": 5}]),
                    slice_questions=50)
    assert store.fresh_view("ex", "a", 0) is not None
    assert store.fresh_view("other", "x", 0) is not None
    assert set(store._fresh) == {"ex", "other"}
    monkeypatch.setattr(leases_module, "FRESH_FORGET_S", 0.0)
    assert store.fresh_view("other", "x", 0) is not None  # known: no read, nothing dropped
    assert set(store._fresh) == {"ex", "other"}
    store.sync_exam("third", _syllabus([{"id": "y", "title": "Y", "questions": 5}]),
                    slice_questions=50)
    assert store.fresh_view("third", "y", 0) is not None  # a read: the old views go
    assert set(store._fresh) == {"third"}
    assert store.fresh_view("ex", "a", 0) is not None  # and come back when needed


def test_sqlite_plans_nothing_inside_its_claims_write_transaction(sqlite_store):
    """The point of planning before the claim on SQLite: the one writer is not held while a
    call's prompt is built and admitted. The planner, when the claim must call it, runs inside
    the transaction; with a fitting plan it is not called at all."""
    store, _ = sqlite_store
    _view, first = _first(store, "a")
    inside: list[bool] = []

    def replan(view: ChapterView) -> CallPlan:
        other = sqlite3.connect(store.engine.url.database, timeout=0)
        try:  # another writer is refused while the claim's transaction holds the lock
            other.execute("BEGIN IMMEDIATE")
            other.rollback()
            inside.append(False)
        except sqlite3.OperationalError as exc:
            assert "locked" in str(exc)
            inside.append(True)
        finally:
            other.close()
        return CallPlan(view.next_number, 3, prompt_tokens=7, max_tokens=9)
    assert isinstance(store.claim("ex", "a", "w", 30.0, 8, plan_first=replan, first=first),
                      Claimed)
    assert inside == []
    # A plan for another slice's spec does not fit: planned again, inside.
    _view, other = _first(store, "a")
    assert isinstance(store.claim("ex", "b", "w", 30.0, 8, plan_first=replan, first=other),
                      Claimed)
    assert inside == [True]
    assert [tuple(r)[:3] for r in _calls(store)] == [("a", 5, 111), ("b", 3, 7)]


@pytest.mark.parametrize("change", ["difficulty", "language", "types", "title"])
def test_sqlite_fingerprint_changes_with_each_part_of_the_spec(sqlite_store, change):
    """A fingerprint that missed a part of the spec would let a plan made for the old spec
    be recorded (a call asking for the wrong levels, language or item types)."""
    store, _ = sqlite_store
    _view, first = _first(store, "a")
    changed = {"difficulty": "easy", "language": "fa", "types": {"truefalse": 5},
               "title": "A2"}[change]
    chapter: dict[str, Any] = {"id": "a", "title": "A", "questions": 5, change: changed}
    store.sync_exam("ex", _syllabus([chapter, {"id": "b", "title": "B", "questions": 5}]),
                    slice_questions=50)
    replan = Replan()
    claim = store.claim("ex", "a", "w", 30.0, 8, plan_first=replan, first=first)
    assert isinstance(claim, Claimed) and isinstance(claim.first_call, int)
    assert len(replan.views) == 1, f"a changed {change} was not noticed"
    assert [tuple(r)[:3] for r in _calls(store)] == [("a", 3, 7)]


def test_the_claim_returns_the_chapters_course_material(store: Any):
    """Both databases; the fast path's claim (PostgreSQL) and the general one (SQLite)."""
    notes = "# One\n\n" + "alpha " * 300 + "\n\n# Two\n\n" + "beta " * 300
    material = {"a": read_material(["n.md"], lambda name: notes.encode(), str),
                "b": ChapterMaterial()}
    store.sync_exam("ex", _syllabus([
        {"id": "a", "title": "A", "questions": 5, "sources": ["n.md"]},
        {"id": "b", "title": "B", "questions": 5}]), slice_questions=50, material=material)
    assert store.fresh_view("ex", "a", 0) is None  # with sources: planned from the claim
    if store.engine.dialect.name == "postgresql":  # known as such: not read again
        assert store.fresh_view("ex", "b", 0) is not None
        assert ("a", 0) in store._fresh["ex"][1]
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    assert [p.where for p in claim.passages] == ["One", "Two"]
    assert claim.passages == tuple(store.chapter_passages("ex", "a"))
    assert claim.view().passages == claim.passages
    other = store.claim("ex", "b", "w", 30.0, 8)
    assert isinstance(other, Claimed) and other.passages == ()
