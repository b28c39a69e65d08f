"""exam.verify: the exam's blind-solve policy (off, flag, replace), and no slice done while
verdicts of its range are pending

Revision ID: 0029
Revises: 0028
VERIFY was read by each worker from its own environment, so an exam enqueued with
VERIFY=replace beside workers started without it came out unverified (issue 27). The policy
is the exam's now (storage.models.VerifyPolicy), recorded by `enqueue --verify`, `run
--verify` and the API, and every worker follows it. Existing exams get the policy their
questions show: `replace` when one was withdrawn as disputed, `flag` when one has a verdict,
else `off`.

Under `replace` a solver that disputes every key made a slice replace its questions without
end (each commit counts as progress): `slice.disputes_from` is where the count of a slice's
disputed keys starts (a question id), moved past every question by `resume` of an exam
those disputes paused (PauseCode.disputes).

ef_claim (PostgreSQL) returns the exam's policy too (`exam_verify`): the holder follows
the policy its claim read, at no extra round trip.

A slice is done only when its range is full and none of its verdicts is pending. Older
planning marked such slices done (a crash between a commit and its blind solve left them
pending for ever): they are pending again, so the next run, enqueue or reconciler pass
solves them.
"""

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op
import sqlalchemy as sa


revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def _claim_0026() -> Any:
    """Migration 0026's module (this directory is not a package): its ef_claim."""
    spec = importlib.util.spec_from_file_location(
        "examforge_migration_0026", Path(__file__).with_name("0026_claim_first_call.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _claim_function(before: str) -> str:
    """0026's ef_claim, returning the exam's blind-solve policy as well."""
    out = before.replace("OUT first_call integer)", "OUT first_call integer, OUT exam_verify text)")
    out = out.replace("SELECT e.title, e.index_epoch INTO exam_title, index_epoch FROM exam e",
                      "SELECT e.title, e.index_epoch, e.verify INTO exam_title, index_epoch, "
                      "exam_verify FROM exam e")
    assert out.count("exam_verify") == 2, "0026's ef_claim is not the one this edits"
    return out


def upgrade() -> None:
    # Plain ADD COLUMN (as 0020): the exam table is referenced by the others.
    op.add_column('exam', sa.Column('verify', sa.String(length=16), nullable=False,
                                    server_default='off'))
    op.execute("""
        UPDATE exam SET verify = CASE
            WHEN EXISTS (SELECT 1 FROM question q WHERE q.exam = exam.slug
                         AND q.withdrawn = 'disputed') THEN 'replace'
            WHEN EXISTS (SELECT 1 FROM question q WHERE q.exam = exam.slug
                         AND q.verdict IS NOT NULL) THEN 'flag'
            ELSE 'off' END
    """)
    # Where a slice's count of disputed keys starts (a question id; NULL: its first).
    op.add_column('slice', sa.Column('disputes_from', sa.Integer(), nullable=True))
    # The policy a run of the API asked for, recorded on its exam when it is launched.
    op.add_column('run', sa.Column('verify', sa.String(length=16), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        before = _claim_0026()
        # Its OUT columns change: dropped and made again (same arguments).
        op.execute(f"DROP FUNCTION IF EXISTS {before.NEW_SIGNATURE}")
        op.execute(_claim_function(before.CLAIM_FUNCTION))
    op.execute("""
        UPDATE slice SET state = 'pending', attempts_since_progress = 0
        WHERE state = 'done' AND EXISTS (
            SELECT 1 FROM question q WHERE q.exam = slice.exam
               AND q.chapter_id = slice.chapter_id AND q.verdict = 'pending'
               AND q.number >= slice.first_number
               AND q.number < slice.first_number + slice.target)
    """)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        before = _claim_0026()
        op.execute(f"DROP FUNCTION IF EXISTS {before.NEW_SIGNATURE}")
        op.execute(before.CLAIM_FUNCTION)
    op.drop_column('run', 'verify')
    op.drop_column('slice', 'disputes_from')
    op.drop_column('exam', 'verify')
