"""Migration 0009 (difficulty and Bloom level) on a 0006 database that holds rows: what is
stored stays, with no levels, and the new fields work on it from then on."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import seed_at_0006, write_syllabus
from storage import Store, connect, migrate
from storage.types import Usage
from storage.store import Claimed


def test_0009_adds_levels_keeping_what_is_stored(db_url: str, tmp_path: Path) -> None:
    engine = connect(db_url)
    with engine.begin() as conn:
        seed_at_0006(conn, title="Chapter a", target=8, spec_hash=_spec_hash(tmp_path),
                     attempts=1, since_progress=1)
        for n in (1, 2, 3):
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, norm_hash, model, created_at) VALUES "
                "('ex', 'a', :n, :q, '[\"w\", \"x\", \"y\", \"z\"]', 2, 'e', :h, 'm', 1)"),
                {"n": n, "q": f"Old question {n}?", "h": f"hash{n}"})
    migrate(engine)
    columns = {t: {c["name"] for c in inspect(engine).get_columns(t)}
               for t in ("slice", "question")}
    assert {"difficulty", "bloom"} <= columns["slice"] and {"difficulty", "bloom"} <= \
        columns["question"]
    store = Store(engine)
    old = store.questions("ex")
    assert [(q["number"], q["choices"], q["answer_index"], q["difficulty"], q["bloom"])
            for q in old] == [(n, ["w", "x", "y", "z"], 2, None, None) for n in (1, 2, 3)]
    # The chapter gains a mix with three questions stored: no --regenerate needed (each
    # stored question keeps the level it was written at, here none).
    path = write_syllabus(tmp_path / "exams", "ex", {"title": "Ex", "chapters": [
        {"id": "a", "title": "Chapter a", "questions": 8,
         "difficulty": {"easy": 0.5, "hard": 0.5}, "bloom": ["apply"]}]})
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=100))
    assert plan.slices == [("a", 0)] and plan.skipped == {}
    claim = store.claim("ex", "a", "w", 10.0, 8)
    assert isinstance(claim, Claimed)
    assert (claim.levels.difficulty, claim.levels.bloom, claim.levels.stored) == (
        {"easy": 0.5, "hard": 0.5}, ("apply",), {})
    call = store.start_call(claim, 4, 1, lease_s=10.0)
    store.commit_batch(claim, 10.0, call, [Question("New?", ("a", "b", "c", "d"), 0, "",
                                                    difficulty="hard", bloom="apply")],
                       model="m", usage=Usage(1, 1, 0.0))
    new = store.questions("ex")[-1]
    assert (new["number"], new["difficulty"], new["bloom"]) == (4, "hard", "apply")
    engine.dispose()


def _spec_hash(tmp_path: Path) -> str:
    path = write_syllabus(tmp_path / "spec", "ex", {"title": "Ex", "chapters": [
        {"id": "a", "title": "Chapter a", "questions": 8}]})
    return load_syllabus(path, max_questions=100).chapters[0].spec_hash
