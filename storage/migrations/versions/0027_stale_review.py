"""question.stale: why a reviewed question kept through `enqueue --regenerate` may no longer
match its chapter

Revision ID: 0027
Revises: 0026
`enqueue --regenerate CHAPTER` keeps the chapter's approved and edited questions (issue 27):
each is marked `stale` in its review state, and this column names the change that made it
so ("source notes/week1.md differs (its file's hash changed)"), for the reviewer to decide.
NULL for every other question; an approve or an edit clears it.
"""

from alembic import op
import sqlalchemy as sa


revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, no batch copy of the table (see 0020).
    op.add_column('question', sa.Column('stale', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('question', 'stale')
