"""exam.pause_code: why an exam is paused, as a code (examforge.errors.PauseCode)

Revision ID: 0020
Revises: 0019
What ends a pause (a raised budget, or `resume`) was decided by matching the text of
exam.pause_reason with LIKE 'budget:%'. The code sits beside the text now, which stays for
people. Existing pauses get theirs from the text they were written with: "budget: ..." by a
budget, "auth: ..." by AUTH_FAILURE_LIMIT auth failures, "<error kind>: ..." by a provider that
stopped the exam (quota, model), anything else `manual`.
"""

from alembic import op
import sqlalchemy as sa


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

# The error kinds (examforge.errors.ErrorKind) of the providers' refusals that pause an exam.
_PROVIDER_KINDS = ("quota", "model_not_found")


def upgrade() -> None:
    # Plain ADD and DROP COLUMN (SQLite has both since 3.35), not a batch copy of the table:
    # the exam table is referenced by the others, and SQLite's foreign keys (on) refuse to
    # drop it while their rows point at it.
    op.add_column('exam', sa.Column('pause_code', sa.String(length=16), nullable=True))
    provider = " OR ".join(f"pause_reason LIKE '{kind}:%'" for kind in _PROVIDER_KINDS)
    op.execute(f"""
        UPDATE exam SET pause_code = CASE
            WHEN pause_reason LIKE 'budget:%' THEN 'budget'
            WHEN pause_reason LIKE 'auth:%' THEN 'auth'
            WHEN {provider} THEN 'provider'
            ELSE 'manual' END
        WHERE state = 'paused'
    """)


def downgrade() -> None:
    op.drop_column('exam', 'pause_code')
