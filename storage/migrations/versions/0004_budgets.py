"""budgets: what each exam may spend, has spent and has reserved; each call's worst case

Revision ID: 0004
Revises: 0003
An exam's budget is checked and its reservation taken in one conditional UPDATE of the exam
row, so the running totals live there; existing exams start with `spent_usd` equal to the sum
of their ledger (and nothing reserved: a call recorded in flight before this revision has no
reservation to settle). Calls record the model asked for, their max_tokens, their worst-case
cost, whether their usage is our own estimate, and whether a price was known.
"""

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('exam') as batch:
        batch.add_column(sa.Column('budget_usd', sa.Float(), nullable=True))
        batch.add_column(sa.Column('spent_usd', sa.Float(), nullable=False, server_default='0'))
        batch.add_column(sa.Column('reserved_usd', sa.Float(), nullable=False,
                                   server_default='0'))
    with op.batch_alter_table('call') as batch:
        batch.add_column(sa.Column('model', sa.String(length=128), nullable=True))
        batch.add_column(sa.Column('max_tokens', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('reserved_usd', sa.Float(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('usage_estimated', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column('price_known', sa.Boolean(), nullable=False,
                                   server_default=sa.true()))
    op.execute('UPDATE exam SET spent_usd = COALESCE((SELECT SUM(cost_usd) FROM call '
               'WHERE call.exam = exam.slug), 0)')


def downgrade() -> None:
    with op.batch_alter_table('call') as batch:
        for name in ('price_known', 'usage_estimated', 'reserved_usd', 'max_tokens', 'model'):
            batch.drop_column(name)
    with op.batch_alter_table('exam') as batch:
        for name in ('reserved_usd', 'spent_usd', 'budget_usd'):
            batch.drop_column(name)
