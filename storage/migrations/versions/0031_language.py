"""exam.language and slice.language: the language an exam and each chapter are written in

Revision ID: 0031
Revises: 0030

The prompts never said what language to write in, so a Persian chapter title might or might
not get Persian questions (issue 31). A syllabus names its language now (a BCP 47 tag,
examforge.languages), for the exam and per chapter: `exam.language` records the syllabus's at
every enqueue (status and the API show it), and each slice carries its chapter's, beside its
title and prompt, so that a claim reads it with the rest and every worker writes and
validates in it, whatever its environment. Existing exams and slices are English, as their
prompts were.

ef_claim (PostgreSQL) returns the slice's language (`chapter_language`), and the fingerprint
of a first call planned before the claim (`ef_spec_fp`, migration 0026) counts it: a plan
made from a view of the slice in another language is not recorded.
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op
import sqlalchemy as sa


revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None

OLD_SPEC_FP = "ef_spec_fp(text, text, text, integer, integer, integer, text, text)"
NEW_SPEC_FP = "ef_spec_fp(text, text, text, integer, integer, integer, text, text, text)"

SPEC_FP_FUNCTION = r"""
CREATE FUNCTION ef_spec_fp(
    p_exam_title text, p_title text, p_prompt text, p_target integer, p_first integer,
    p_chapter_target integer, p_difficulty text, p_bloom text, p_language text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(concat_ws(chr(31), coalesce(p_exam_title, chr(30)), coalesce(p_title, chr(30)),
                         coalesce(p_prompt, chr(30)), p_target, p_first, p_chapter_target,
                         coalesce(p_difficulty, chr(30)), coalesce(p_bloom, chr(30)),
                         coalesce(p_language, chr(30))))
$$
"""


def _migration(name: str, file: str) -> Any:
    """Another migration's module (this directory is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _claims() -> tuple[Any, str]:
    """0026's module (the signature, the old ef_spec_fp) and ef_claim as 0029 left it."""
    first = _migration("examforge_migration_0026", "0026_claim_first_call.py")
    verify = _migration("examforge_migration_0029", "0029_exam_verify.py")
    return first, verify._claim_function(first.CLAIM_FUNCTION)


def _claim_function(before: str) -> str:
    """0029's ef_claim, returning the slice's language and counting it in the fingerprint."""
    edits = (
        ("OUT exam_verify text)", "OUT exam_verify text, OUT chapter_language text)"),
        ("s.prompt, s.difficulty, s.bloom, s.sources",
         "s.prompt, s.difficulty, s.bloom, s.sources, s.language"),
        ("difficulty, bloom, v_sources;", "difficulty, bloom, v_sources, chapter_language;"),
        ("chapter_target, difficulty, bloom) THEN",
         "chapter_target, difficulty, bloom, chapter_language) THEN"),
    )
    out = before
    for old, new in edits:
        assert out.count(old) == 1, f"0029's ef_claim is not the one this edits: {old!r}"
        out = out.replace(old, new)
    return out


def upgrade() -> None:
    # Plain ADD COLUMN (as 0029): the exam table is referenced by the others.
    op.add_column('exam', sa.Column('language', sa.String(length=35), nullable=False,
                                    server_default='en'))
    op.add_column('slice', sa.Column('language', sa.String(length=35), nullable=False,
                                     server_default='en'))
    if op.get_bind().dialect.name == "postgresql":
        first, claim = _claims()
        # Its OUT columns change: dropped and made again (same arguments).
        op.execute(f"DROP FUNCTION IF EXISTS {first.NEW_SIGNATURE}")
        op.execute(f"DROP FUNCTION IF EXISTS {OLD_SPEC_FP}")
        op.execute(SPEC_FP_FUNCTION)
        op.execute(_claim_function(claim))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        first, claim = _claims()
        op.execute(f"DROP FUNCTION IF EXISTS {first.NEW_SIGNATURE}")
        op.execute(f"DROP FUNCTION IF EXISTS {NEW_SPEC_FP}")
        op.execute(first.SPEC_FP_FUNCTION)
        op.execute(claim)
    op.drop_column('slice', 'language')
    op.drop_column('exam', 'language')
