"""what the reconciler re-published, and why

Revision ID: 0003
Revises: 0002
The reconciler re-publishes chapters whose message is gone: a worker that vanished after taking
it, a broker that lost its data, and now a queue that lost some of its messages while the
broker's epoch survived. Each chapter keeps how often that happened, when last, and why, so
`status` can say so.
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('chapter') as batch:
        batch.add_column(sa.Column('requeues', sa.Integer(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('requeued_at', sa.Float(), nullable=True))
        batch.add_column(sa.Column('requeue_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('chapter') as batch:
        batch.drop_column('requeue_reason')
        batch.drop_column('requeued_at')
        batch.drop_column('requeues')
