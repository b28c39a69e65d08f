"""cached prompt tokens on the call: `call.cached_tokens`

Revision ID: 0014
Revises: 0013
OpenAI reports the part of a prompt read from its prompt cache as
`usage.prompt_tokens_details.cached_tokens` and bills it at a discount. The call row now keeps
that count, so a call's cost (prompt - cached at the prompt price, cached at the cached price)
can be checked against its row and `status` can show it. Existing calls get 0: they were booked
with every prompt token at the full price, as they were priced then.
"""

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('call') as batch:
        batch.add_column(sa.Column('cached_tokens', sa.Integer(), nullable=False,
                                   server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('call') as batch:
        batch.drop_column('cached_tokens')
