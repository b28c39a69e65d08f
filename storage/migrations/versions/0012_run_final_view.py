"""a finished run's view, kept: `run.final_view`

Revision ID: 0012
Revises: 0011
GET /runs/ID and a run's final SSE event were computed from the exam as it is now, so a
later run of the same exam (a raised target, a raised budget) changed what an earlier,
finished run said of itself: its questions, the exam's spend, its last change. The view a run
had when it was first seen final is now written beside its state, once, and read from then
on. Existing runs keep NULL: their view is computed as before.
"""

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.add_column(sa.Column('final_view', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.drop_column('final_view')
