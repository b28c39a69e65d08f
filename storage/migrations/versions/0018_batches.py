"""batch mode: the `batch` table (one row per submission to a provider's Batch API) and
`exam.mode`

Revision ID: 0018
Revises: 0017
A submission is recorded before anything is sent to the provider (issue 18): its id is the
`batch/<id>` owner of the slice leases and calls it holds, and it goes into the provider
batch's metadata so that a crash between the create call and recording its reply is found
again by listing the provider's batches. `exam.mode` says how the exam is generated: `sync`
(Celery chapter tasks, as before) or `batch` (the batch runner; the reconciler then publishes
no chapter tasks for it). Existing exams are `sync`.
"""

from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'batch',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('provider_batch_id', sa.String(length=128), nullable=True),
        sa.Column('input_file_id', sa.String(length=128), nullable=True),
        sa.Column('output_file_id', sa.String(length=128), nullable=True),
        sa.Column('error_file_id', sa.String(length=128), nullable=True),
        sa.Column('provider_status', sa.String(length=32), nullable=True),
        sa.Column('model', sa.String(length=128), nullable=True),
        sa.Column('requests', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('bytes', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('request_total', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('request_completed', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('request_failed', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('submitted_at', sa.Float(), nullable=True),
        sa.Column('expires_at', sa.Float(), nullable=True),
        sa.Column('finished_at', sa.Float(), nullable=True),
        sa.Column('polled_at', sa.Float(), nullable=True),
        sa.Column('lease_owner', sa.String(length=128), nullable=True),
        sa.Column('lease_expires_at', sa.Float(), nullable=True),
        sa.Column('create_attempts', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('cancel_requested', sa.Boolean(), nullable=False,
                  server_default=sa.false()),
        sa.Column('detail', sa.Text(), nullable=True),
        sa.Column('usage', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_batch_exam_created', 'batch', ['exam', 'created_at'])
    op.create_index('ix_batch_state', 'batch', ['state'])
    with op.batch_alter_table('exam') as batch:
        batch.add_column(sa.Column('mode', sa.String(length=16), nullable=False,
                                   server_default='sync'))


def downgrade() -> None:
    # In place, not batch mode: batch mode rebuilds `exam` on SQLite, and dropping the old
    # table fails while slices reference it (foreign keys on). SQLite >= 3.35 drops a plain
    # column in place.
    op.drop_column('exam', 'mode')
    op.drop_index('ix_batch_state', table_name='batch')
    op.drop_index('ix_batch_exam_created', table_name='batch')
    op.drop_table('batch')
