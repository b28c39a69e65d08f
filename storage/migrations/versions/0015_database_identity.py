"""the database's identity: `database_identity`, one row with a random id

Revision ID: 0015
Revises: 0014
A producer and a worker that open different databases (a relative sqlite:///examforge.db
read from two directories) saw nothing wrong: the worker found no work in its database and
acked the message, and the exam stayed pending forever. Each database now has an id, written
once when its schema is created (or upgraded to this revision, rows and all); the producer
carries it in every task message and a worker on another database leaves the message alone
and says so. `producer doctor` shows it.
"""

import time
import uuid

from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        'database_identity',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('database_id', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.bulk_insert(table, [{'id': 1, 'database_id': uuid.uuid4().hex,
                            'created_at': time.time()}])


def downgrade() -> None:
    op.drop_table('database_identity')
