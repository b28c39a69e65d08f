"""a finished run's view, kept: `run.final_view`; keys per client: `run.client`

Revision ID: 0012
Revises: 0011
GET /runs/ID and a run's final SSE event were computed from the exam as it is now, so a
later run of the same exam (a raised target, a raised budget) changed what an earlier,
finished run said of itself: its questions, the exam's spend, its last change. The view a run
had when it was first seen final is now written beside its state, once, and read from then
on. Existing runs keep NULL: their view is computed as before.

An Idempotency-Key was unique over every client: two clients (two tokens) that chose the same
key got each other's run, or a 422. `run.client` (a hash of the token, '' without auth) now
scopes it: UNIQUE(client, idempotency_key). Existing runs get '', so a key sent before the
upgrade starts a new run if sent again after it (within its 24 hours) with a token.
Downgrading fails if two clients have used one key since.
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
        batch.add_column(sa.Column('client', sa.String(length=32), nullable=False,
                                   server_default=''))
        batch.drop_constraint('uq_run_idempotency_key', type_='unique')
        batch.create_unique_constraint('uq_run_client_key', ['client', 'idempotency_key'])


def downgrade() -> None:
    with op.batch_alter_table('run') as batch:
        batch.drop_constraint('uq_run_client_key', type_='unique')
        batch.create_unique_constraint('uq_run_idempotency_key', ['idempotency_key'])
        batch.drop_column('client')
        batch.drop_column('final_view')
