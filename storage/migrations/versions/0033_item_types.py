"""slice.types, question.type and question.answer: the item types teachers use (issue 32)

Revision ID: 0033
Revises: 0032

A chapter may ask for true/false, multiple-response, short-answer and numerical items beside
four-choice ones (its `types`, examforge.item_types). Each slice records its chapter's counts
per type (`slice.types`, JSON; NULL: all mcq, as every chapter recorded before was), and each
question its type (`question.type`, 'mcq' for every existing row) and, for a type other than
mcq, its answer fields (`question.answer`, JSON; `answer_index` is -1 then) and what the
blind solver answered (`question.solved_answer`, JSON: `solved_index` holds an mcq's).

PostgreSQL: ef_commit stores each question's type and answer, which an item of another type
than mcq carries in its `p_choices` element (its type, answer and choices, separated by a
unit separator, which JSON never holds unescaped): no parameter is added, so that the
statement keeps to the 50 placeholders psycopg caches its parsing for; ef_claim returns the slice's types (`chapter_types`) and the type and answer of
each of the chapter's questions (`types`, `answers`: what the slice's calls still lack of
each type), and its fingerprint of a first call planned before the claim counts the types
(with the difficulty, as FRESH_SQL computes it: unchanged for a slice without types).
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op
import sqlalchemy as sa


revision = '0033'
down_revision = '0032'
branch_labels = None
depends_on = None


def _migration(name: str, file: str) -> Any:
    """Another migration's module (this directory is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _edited(before: str, edits: tuple[tuple[str, str], ...], what: str) -> str:
    out = before
    for old, new in edits:
        assert out.count(old) == 1, f"{what} is not the one this edits: {old!r}"
        out = out.replace(old, new)
    return out


def _functions() -> tuple[Any, str, str]:
    """0026's module (ef_claim's signature), ef_claim as 0031 left it, and 0025's
    ef_commit."""
    first = _migration("examforge_migration_0026", "0026_claim_first_call.py")
    language = _migration("examforge_migration_0031", "0031_language.py")
    _, claim = language._claims()
    commit = _migration("examforge_migration_0025", "0025_commit_function.py")
    return first, language._claim_function(claim), commit.COMMIT_FUNCTION


def _claim_function(before: str) -> str:
    """0031's ef_claim, returning the slice's types and its chapter's questions' types and
    answers, and counting the types in the first call's fingerprint."""
    return _edited(before, (
        ("OUT chapter_language text)",
         "OUT chapter_language text, OUT chapter_types text, OUT types varchar[], "
         "OUT answers text[])"),
        ("s.prompt, s.difficulty, s.bloom, s.sources, s.language",
         "s.prompt, s.difficulty, s.bloom, s.sources, s.language, s.types"),
        ("difficulty, bloom, v_sources, chapter_language;",
         "difficulty, bloom, v_sources, chapter_language, chapter_types;"),
        ("array_agg(q.difficulty ORDER BY q.id)\n      INTO ids, numbers, texts, difficulties",
         "array_agg(q.difficulty ORDER BY q.id),\n"
         "           array_agg(q.type ORDER BY q.id), array_agg(q.answer ORDER BY q.id)\n"
         "      INTO ids, numbers, texts, difficulties, types, answers"),
        ("chapter_target, difficulty, bloom, chapter_language) THEN",
         "chapter_target, CASE WHEN chapter_types IS NULL THEN difficulty\n"
         "                                  ELSE concat(difficulty, chr(29), chapter_types) END,\n"
         "                                  bloom, chapter_language) THEN"),
    ), "0031's ef_claim")


def _commit_function(before: str) -> str:
    """0025's ef_commit, storing each question's type and answer."""
    return _edited(before, (
        ("explanation, norm_hash, difficulty, bloom, source, passage,\n"
         "                              model, call_id, created_at)",
         "explanation, norm_hash, difficulty, bloom, source, passage,\n"
         "                              type, answer, model, call_id, created_at)"),
        # An item of another type than mcq comes as `type` US `answer` US `choices` in its
        # p_choices element (storage.fastpath._choices); an mcq's is its choices alone.
        ("SELECT p_exam, p_chapter, n, qt, ch, ai, ex, h, d, b, src, pg, p_model",
         "SELECT p_exam, p_chapter, n, qt,\n"
         "               CASE WHEN strpos(ch, chr(31)) > 0 THEN split_part(ch, chr(31), 3)\n"
         "                    ELSE ch END,\n"
         "               ai, ex, h, d, b, src, pg,\n"
         "               CASE WHEN strpos(ch, chr(31)) > 0 THEN split_part(ch, chr(31), 1)\n"
         "                    ELSE 'mcq' END,\n"
         "               CASE WHEN strpos(ch, chr(31)) > 0\n"
         "                    THEN nullif(split_part(ch, chr(31), 2), '') END,\n"
         "               p_model"),
    ), "0025's ef_commit")


def upgrade() -> None:
    op.add_column('slice', sa.Column('types', sa.Text(), nullable=True))
    op.add_column('question', sa.Column('type', sa.String(length=16), nullable=False,
                                        server_default='mcq'))
    op.add_column('question', sa.Column('answer', sa.Text(), nullable=True))
    op.add_column('question', sa.Column('solved_answer', sa.Text(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        first, claim, commit = _functions()
        op.execute(f"DROP FUNCTION IF EXISTS {first.NEW_SIGNATURE}")
        op.execute(_claim_function(claim))
        op.execute(_commit_function(commit))  # CREATE OR REPLACE: the same arguments


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        first, claim, commit = _functions()
        op.execute(f"DROP FUNCTION IF EXISTS {first.NEW_SIGNATURE}")
        op.execute(claim)
        op.execute(commit)
    op.drop_column('question', 'solved_answer')
    op.drop_column('question', 'answer')
    op.drop_column('question', 'type')
    op.drop_column('slice', 'types')
