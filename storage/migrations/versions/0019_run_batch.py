"""run.batch: a run of the API asked for batch mode (POST /exams/SLUG/runs {"batch": true})

Revision ID: 0019
Revises: 0018
Kept on the run so that a run whose hand-off failed (the broker refused) is launched later
by the sweep in the mode it asked for. Existing runs are synchronous.
"""

from alembic import op
import sqlalchemy as sa


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.add_column(sa.Column('batch', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.drop_column('batch')
