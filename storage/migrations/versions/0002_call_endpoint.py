"""which endpoint served each call

Revision ID: 0002
Revises: 0001
With LLM_FALLBACK_BASE_URL a call may be served by the primary or by the fallback, at different
prices: the ledger records which, so each provider's bill can be matched call by call. NULL for
calls whose endpoint is unknown (in flight, killed, and every call made before this revision).
"""

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('call', sa.Column('endpoint', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('call') as batch:  # SQLite cannot drop a column in place
        batch.drop_column('endpoint')
