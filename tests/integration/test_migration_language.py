"""Migration 0031 (exam.language, slice.language; ef_claim returning the slice's language and
ef_spec_fp counting it) on both databases, from 0030 with data: the exams and slices stored
before it are English, as their prompts were, and their chapters' hashes are unchanged (a
re-enqueue in English holds nothing back); a downgrade drops what it added, keeps the slices
and puts back 0029's ef_claim and 0026's ef_spec_fp (PostgreSQL)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from storage import Store, connect, migrate
from storage.db import alembic_config
from storage.store import Claimed
from test_exam_language import _languages, _syllabus


def _functions(engine) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """PostgreSQL: each version of ef_claim and ef_spec_fp, by its argument names."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT proname, array_to_string(proargnames, ',') FROM pg_proc "
            "WHERE proname IN ('ef_claim', 'ef_spec_fp') ORDER BY proname")).all()
    out: dict[str, list[str]] = {}
    for name, args in rows:
        out.setdefault(name, []).append(args or "")
    return out


def test_0031_over_stored_exams_and_back(db_url: str):
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    try:
        store.sync_exam("ex", _syllabus(language="en", b=None), slice_questions=3)
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0030")
        assert "language" not in {c["name"] for c in inspect(engine).get_columns("exam")}
        assert "language" not in {c["name"] for c in inspect(engine).get_columns("slice")}
        migrate(engine)  # over the exam stored before languages: English, as its prompts were
        assert _languages(store) == ("en", {"a": {"en"}, "b": {"en"}})
        claim = store.claim("ex", "a", "w", 30.0, 8)
        assert isinstance(claim, Claimed) and claim.language == "en"
        # Its chapters' hashes are what they were: a re-enqueue in English changes nothing.
        plan = store.sync_exam("ex", _syllabus(language="en", b=None), slice_questions=3)
        assert not any(why.startswith("changed") for why in plan.skipped.values())
        assert "b" in plan.to_enqueue
        store.sync_exam("ex", _syllabus(), slice_questions=3)
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0030")
            slices = conn.execute(text("SELECT count(*) FROM slice")).scalar_one()
        assert slices == 4
        if engine.dialect.name == "postgresql":
            functions = _functions(engine)
            assert len(functions["ef_claim"]) == len(functions["ef_spec_fp"]) == 1
            assert "exam_verify" in functions["ef_claim"][0]
            assert "chapter_language" not in functions["ef_claim"][0]
            assert "p_language" not in functions["ef_spec_fp"][0]
        migrate(engine)
        if engine.dialect.name == "postgresql":
            functions = _functions(engine)
            assert "chapter_language" in functions["ef_claim"][0]
            assert functions["ef_spec_fp"][0].endswith("p_language")
        # The fast claim (PostgreSQL: ef_claim as 0031 makes it again) reads the language.
        store.sync_exam("ex", _syllabus(language="ru"), slice_questions=3)
        claim = Store(engine).claim("ex", "b", "w3", 30.0, 8)
        assert isinstance(claim, Claimed) and claim.language == "en"
    finally:
        engine.dispose()
