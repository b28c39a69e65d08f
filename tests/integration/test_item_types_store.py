"""Item types (issue 32) on SQLite and PostgreSQL: a mixed chapter generated against the mock
through the per-call path (on PostgreSQL: ef_claim and ef_commit, migration 0033) stores
exactly its counts per type with each type's answer fields; a new claim reads what its slice
stored per type (the general path, and ef_claim's arrays); migration 0033 over stored
questions makes them mcq, and its downgrade puts back 0031's ef_claim and 0025's ef_commit."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from alembic import command
from sqlalchemy import inspect, text

from examforge.llm import LLMClient
from examforge.output import Question, check_item
from examforge.syllabus import Syllabus
from runner.pipeline import Runtime, process_chapter
from storage import Store, connect, migrate
from storage.db import alembic_config
from storage.store import Claimed
from storage.types import Usage

MIXED = {"mcq": 6, "multi": 3, "truefalse": 4, "short": 3, "numeric": 2}


def _syllabus(types: dict[str, int] | None = MIXED) -> Syllabus:
    chapter: dict[str, Any] = {"id": "a", "title": "Mixed", "questions": 18}
    if types is not None:
        chapter["types"] = types
    return Syllabus.model_validate({"title": "Ex", "chapters": [
        chapter, {"id": "b", "title": "Plain", "questions": 3}]})


def test_a_mixed_chapter_is_stored_exactly_on_each_database(
        db_url: str, mock_llm: Any, make_settings: Any) -> None:
    settings = make_settings(database_url=db_url, llm_base_url=mock_llm.base_url,
                             questions_per_call=5, slice_questions=9,
                             llm_response_format="json_schema")
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    plan = store.sync_exam("ex", _syllabus(), slice_questions=9)
    rt = Runtime.build(settings, store, LLMClient(settings))
    try:
        for chapter_id, slice_no in plan.slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT chapter_id, number, type, choices, answer_index, answer FROM question "
                "ORDER BY chapter_id, number")).all()
            wasted = conn.execute(text(
                "SELECT outcome, detail FROM call WHERE outcome <> 'used'")).all()
        mixed = [r for r in rows if r.chapter_id == "a"]
        assert [r.number for r in mixed] == list(range(1, 19))
        assert Counter(r.type for r in mixed) == MIXED
        assert {r.type for r in rows if r.chapter_id == "b"} == {"mcq"}
        for r in mixed:
            if r.type == "mcq":
                assert r.answer is None and 0 <= r.answer_index <= 3
            else:
                assert r.answer_index == -1 and json.loads(r.answer)
                if r.type != "multi":
                    assert json.loads(r.choices) == []
        assert Counter(json.loads(r.answer)["value"] for r in mixed
                       if r.type == "truefalse") == {True: 2, False: 2}
        # Every paid call stored questions: none asked for a type its slice had enough of.
        assert wasted == []
        assert mock_llm.stats()["billed_calls"] == 2 + 2 + 1
    finally:
        rt.close()
        engine.dispose()


def test_a_new_claim_reads_what_its_slice_stored_per_type(store: Store) -> None:
    store.sync_exam("ex", _syllabus({"mcq": 2, "truefalse": 16}), slice_questions=18)
    claim = store.claim("ex", "a", "old", 10.0, 8)
    assert isinstance(claim, Claimed)
    assert claim.levels.types == {"mcq": 2, "truefalse": 16}
    assert claim.levels.stored_types == {}
    call = store.start_call(claim, 1, 3, lease_s=10.0)
    stored = [check_item({"type": "truefalse", "question": f"Statement {n}.",
                          "answer": n != 2, "explanation": ""}) for n in range(3)]
    stored.append(Question("Old?", ("a", "b", "c", "d"), 0, ""))
    store.commit_batch(claim, 10.0, call, stored, model="m", usage=Usage(1, 1, 0.0))
    store.release_held("old", [("ex", "a", 0)], retry_in_s=0)
    again = store.claim("ex", "a", "new", 10.0, 8)
    assert isinstance(again, Claimed) and again.stored == 4
    assert again.levels.stored_types == {"mcq": 1, "truefalse": 3, "truefalse:true": 2,
                                         "truefalse:false": 1}
    with store.engine.connect() as conn:
        kinds = conn.execute(text("SELECT type, answer FROM question ORDER BY number")).all()
    assert [k.type for k in kinds] == ["truefalse"] * 3 + ["mcq"]
    assert kinds[-1].answer is None


def _functions(engine: Any) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT proname, array_to_string(proargnames, ',') FROM pg_proc "
            "WHERE proname IN ('ef_claim', 'ef_commit')")).all()
    assert len(rows) == 2  # one version of each
    return {name: args for name, args in rows}


def test_0033_over_stored_questions_and_back(db_url: str) -> None:
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    try:
        store.sync_exam("ex", _syllabus(None), slice_questions=3)
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0032")
        assert "types" not in {c["name"] for c in inspect(engine).get_columns("slice")}
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, model, created_at) VALUES ('ex', 'b', 1, 'Q?', "
                "'[\"a\",\"b\",\"c\",\"d\"]', 2, '', 'm', 0)"))
        migrate(engine)
        with engine.connect() as conn:
            row = conn.execute(text("SELECT type, answer FROM question")).one()
            types = set(conn.execute(text("SELECT types FROM slice")).scalars())
        assert (row.type, row.answer) == ("mcq", None) and types == {None}
        if engine.dialect.name == "postgresql":
            functions = _functions(engine)
            assert "chapter_types" in functions["ef_claim"]
            with engine.connect() as conn:
                body = conn.execute(text("SELECT prosrc FROM pg_proc "
                                         "WHERE proname = 'ef_commit'")).scalar_one()
            assert "split_part(ch, chr(31), 3)" in body
        # Its chapters' hashes are what they were: a re-enqueue changes nothing.
        plan = store.sync_exam("ex", _syllabus(None), slice_questions=3)
        assert not any(why.startswith("changed") for why in plan.skipped.values())
        # A chapter whose types change once it has questions waits for --regenerate.
        plan = store.sync_exam("ex", Syllabus.model_validate({"title": "Ex", "chapters": [
            {"id": "b", "title": "Plain", "questions": 3,
             "types": {"mcq": 1, "short": 2}}]}), slice_questions=3)
        assert plan.skipped["b"].startswith("changed: item types (all mcq, now ")
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0032")
        assert "type" not in {c["name"] for c in inspect(engine).get_columns("question")}
        if engine.dialect.name == "postgresql":
            functions = _functions(engine)
            assert "chapter_types" not in functions["ef_claim"]
            assert "chapter_language" in functions["ef_claim"]
            with engine.connect() as conn:
                body = conn.execute(text("SELECT prosrc FROM pg_proc "
                                         "WHERE proname = 'ef_commit'")).scalar_one()
            assert "chr(31)" not in body
        migrate(engine)
    finally:
        engine.dispose()


def test_a_mixed_chapter_in_batch_mode_stores_exactly_its_counts(
        make_settings: Any, db_url: str, mock_llm: Any, tmp_path: Any) -> None:
    from test_batch_mode import _rows, _setup, _until_done

    from runner.batching import BatchRuntime

    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, {
        "title": "Bx", "chapters": [{"id": "a", "title": "Mixed", "questions": 18,
                                     "types": MIXED}]},
        questions_per_call=5, slice_questions=9)
    rt = BatchRuntime.build(settings, store)
    try:
        _until_done(rt)
    finally:
        rt.close()
    calls, questions, _ = _rows(store)
    assert Counter(q.type for q in questions) == MIXED
    assert sorted(q.number for q in questions) == list(range(1, 19))
    assert [c.outcome for c in calls] == ["used"] * 4  # two calls a slice of 9, none wasted
    assert Counter(json.loads(q.answer)["value"] for q in questions
                   if q.type == "truefalse") == {True: 2, False: 2}


def test_batch_mode_drops_an_item_restating_another_type_and_still_reaches_the_counts(
        make_settings: Any, db_url: str, mock_llm: Any, tmp_path: Any,
        monkeypatch: Any) -> None:
    """Batch mode runs the sync pipeline's check across types (drop_restated, whose rules
    tests/unit/test_item_types.py shows) on every output line of a chapter with types, with
    the chapter's stored questions: here the check is made to drop the first true/false
    statement it sees, as if it restated a stored mcq; the line books it in its note, and a
    later round makes it up, so the chapter still ends at exactly its counts."""
    from test_batch_mode import _rows, _setup, _until_done

    import runner.batching
    from runner.batching import BatchRuntime
    from runner.pipeline import drop_restated

    seen: list[int] = []

    def dropping_one(keyed: Any, batch: Any, checker: Any, title: str,
                     language: str) -> Any:
        seen.append(len(keyed))
        kept, near = drop_restated(keyed, batch, checker, title, language)
        first = next((q for q in kept if q.type == "truefalse"), None)
        if first is not None and len(seen) == 1:
            return [q for q in kept if q is not first], near + 1
        return kept, near

    monkeypatch.setattr(runner.batching, "drop_restated", dropping_one)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, {
        "title": "Bx", "chapters": [{"id": "a", "title": "Mixed", "questions": 18,
                                     "types": MIXED}]},
        questions_per_call=5, slice_questions=9)
    rt = BatchRuntime.build(settings, store)
    try:
        _until_done(rt)
    finally:
        rt.close()
    calls, questions, _ = _rows(store)
    assert Counter(q.type for q in questions) == MIXED
    assert sorted(q.number for q in questions) == list(range(1, 19))
    assert len(seen) >= 5  # every line of the chapter was checked, the round that made up too
    assert any("1 near_duplicate rejected across types" in (c.detail or "") for c in calls)
