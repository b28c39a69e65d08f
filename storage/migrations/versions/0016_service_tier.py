"""the processing tier a call was served at: `call.service_tier`

Revision ID: 0016
Revises: 0015
LLM_SERVICE_TIER sends OpenAI's `service_tier` (flex, priority, default) and each reply says
which tier served it; a call's cost is priced at that tier (flex at half the standard price).
The call row now keeps the tier its reply reported, so its cost can be checked against it and
`status` can show the spend per tier. Existing calls get NULL: no tier was asked or recorded.
"""

from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('call') as batch:
        batch.add_column(sa.Column('service_tier', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('call') as batch:
        batch.drop_column('service_tier')
