"""initial schema

Revision ID: 0001
Revises: 
Exams, chapters (with their leases), questions and the ledger of paid calls.
"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('call',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('exam', sa.String(length=64), nullable=False),
    sa.Column('chapter_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('first_number', sa.Integer(), nullable=False),
    sa.Column('requested', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=128), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sa.Float(), nullable=False),
    sa.Column('questions_stored', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('call', schema=None) as batch_op:
        batch_op.create_index('ix_call_chapter_outcome', ['exam', 'chapter_id', 'outcome'], unique=False)

    op.create_table('exam',
    sa.Column('slug', sa.String(length=64), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('pause_reason', sa.Text(), nullable=True),
    sa.Column('auth_failures', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('slug')
    )
    op.create_table('question',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('exam', sa.String(length=64), nullable=False),
    sa.Column('chapter_id', sa.String(length=64), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('choices', sa.Text(), nullable=False),
    sa.Column('answer_index', sa.Integer(), nullable=False),
    sa.Column('explanation', sa.Text(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('call_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('exam', 'chapter_id', 'number', name='uq_question_number')
    )
    op.create_table('chapter',
    sa.Column('exam', sa.String(length=64), nullable=False),
    sa.Column('chapter_id', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=True),
    sa.Column('spec_hash', sa.String(length=32), nullable=False),
    sa.Column('target', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('attempts_since_progress', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=128), nullable=True),
    sa.Column('lease_expires_at', sa.Float(), nullable=True),
    sa.Column('not_before_at', sa.Float(), nullable=True),
    sa.Column('enqueued_at', sa.Float(), nullable=True),
    sa.Column('enqueue_epoch', sa.String(length=64), nullable=True),
    sa.Column('picked_at', sa.Float(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('last_error_at', sa.Float(), nullable=True),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['exam'], ['exam.slug'], ),
    sa.PrimaryKeyConstraint('exam', 'chapter_id')
    )
    op.create_index('ix_chapter_lease_owner', 'chapter', ['lease_owner'])


def downgrade() -> None:
    op.drop_index('ix_chapter_lease_owner', table_name='chapter')
    op.drop_table('chapter')
    op.drop_table('question')
    op.drop_table('exam')
    with op.batch_alter_table('call', schema=None) as batch_op:
        batch_op.drop_index('ix_call_chapter_outcome')

    op.drop_table('call')
