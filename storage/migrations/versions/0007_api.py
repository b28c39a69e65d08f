"""the HTTP API's tables: syllabi sent through it, and runs with their idempotency keys

Revision ID: 0007
Revises: 0006
`syllabus` holds the syllabi PUT /exams/SLUG received, so that every API replica and worker
reads the same one (an exam with a file in EXAMS_DIR has none). `run` is one
POST /exams/SLUG/runs; its Idempotency-Key is UNIQUE, so two identical requests at once
insert one row. Questions get an index by (exam, call_id): the event streams read what each
call stored. Nothing existing changes.
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'syllabus',
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('exam'),
    )
    op.create_table(
        'run',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('idempotency_key', sa.String(length=255), nullable=True),
        sa.Column('fingerprint', sa.String(length=64), nullable=False),
        sa.Column('budget_usd', sa.Float(), nullable=True),
        sa.Column('call_floor', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=True),
        sa.Column('cancelled_at', sa.Float(), nullable=True),
        sa.Column('launched_at', sa.Float(), nullable=True),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('idempotency_key', name='uq_run_idempotency_key'),
    )
    op.create_index('ix_run_exam', 'run', ['exam'])
    op.create_index('ix_question_exam_call', 'question', ['exam', 'call_id'])


def downgrade() -> None:
    op.drop_index('ix_question_exam_call', table_name='question')
    op.drop_index('ix_run_exam', table_name='run')
    op.drop_table('run')
    op.drop_table('syllabus')
