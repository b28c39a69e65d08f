"""api_token and audit: named tokens with a role and exam scope, and an audit of every
action that spends or changes access; run.started_by

Revision ID: 0030
Revises: 0029
Access was one flat list of tokens (API_TOKENS), each able to do everything on every exam,
and the review history named people by a hash of their token (issue 30). `api_token` holds
named tokens, as the SHA-256 of each (never the token), with a role and the exams it may
see; a name is unique among live tokens (a partial index), so a revoked name can be issued
again. `audit` records who started, cancelled or resumed a run, set a budget, put a syllabus
or source, or added or revoked a token, when, and how it ended. `run.started_by` is the
name of whoever started a run; the runs before keep only their `client` hash.
"""

from alembic import op
import sqlalchemy as sa


revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'api_token',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('role', sa.String(length=16), nullable=False),
        sa.Column('exams', sa.Text(), nullable=True),
        sa.Column('token_hash', sa.String(length=64), nullable=False, unique=True),
        sa.Column('created_by', sa.String(length=96), nullable=False, server_default=''),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('last_used_at', sa.Float(), nullable=True),
        sa.Column('revoked_at', sa.Float(), nullable=True),
    )
    live = sa.text("revoked_at IS NULL")
    op.create_index('uq_api_token_live_name', 'api_token', ['name'], unique=True,
                    postgresql_where=live, sqlite_where=live)
    op.create_table(
        'audit',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('at', sa.Float(), nullable=False),
        sa.Column('actor', sa.String(length=96), nullable=False),
        sa.Column('action', sa.String(length=32), nullable=False),
        sa.Column('exam', sa.String(length=64), nullable=True),
        sa.Column('details', sa.Text(), nullable=True),
        sa.Column('outcome', sa.String(length=16), nullable=False),
    )
    op.create_index('ix_audit_at', 'audit', ['at'])
    op.create_index('ix_audit_exam', 'audit', ['exam', 'id'])
    # Plain ADD COLUMN (as 0020): the run table is read by every replica's sweep.
    op.add_column('run', sa.Column('started_by', sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column('run', 'started_by')
    op.drop_index('ix_audit_exam', table_name='audit')
    op.drop_index('ix_audit_at', table_name='audit')
    op.drop_table('audit')
    op.drop_index('uq_api_token_live_name', table_name='api_token')
    op.drop_table('api_token')
