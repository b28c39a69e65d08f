"""exam.verify: the exam's blind-solve policy (off, flag, replace), and no slice done while
verdicts of its range are pending

Revision ID: 0027
Revises: 0026
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

A slice is done only when its range is full and none of its verdicts is pending. Older
planning marked such slices done (a crash between a commit and its blind solve left them
pending for ever): they are pending again, so the next run, enqueue or reconciler pass
solves them.
"""

from alembic import op
import sqlalchemy as sa


revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


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
    op.execute("""
        UPDATE slice SET state = 'pending', attempts_since_progress = 0
        WHERE state = 'done' AND EXISTS (
            SELECT 1 FROM question q WHERE q.exam = slice.exam
               AND q.chapter_id = slice.chapter_id AND q.verdict = 'pending'
               AND q.number >= slice.first_number
               AND q.number < slice.first_number + slice.target)
    """)


def downgrade() -> None:
    op.drop_column('run', 'verify')
    op.drop_column('slice', 'disputes_from')
    op.drop_column('exam', 'verify')
