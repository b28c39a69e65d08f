"""a run's hand-off claim: `run.launching_until`

Revision ID: 0010
Revises: 0009
A run is stored (its Idempotency-Key decides which request makes it) before its work is
handed on (enqueued to Celery, or started in `serve --local`). Whoever hands it on (the
request, a repeat of its key, or the periodic sweep of any API replica) first claims it with a
conditional UPDATE that sets `launching_until` (a lease in the database's clock) where
`launched_at` is NULL and no live claim exists: one hand-off at a time, and a claim whose
holder died lapses. Existing runs keep NULL (no claim); nothing else changes.
"""

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.add_column(sa.Column('launching_until', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.drop_column('launching_until')
