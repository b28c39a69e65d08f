"""difficulty and Bloom level: per chapter on its slices, per question on the question

Revision ID: 0009
Revises: 0008
A syllabus chapter may now say how hard its questions are (`difficulty`: one level, or a mix
of levels with shares) and which Bloom levels they target (`bloom`). Workers read a chapter's
fields from its slice rows, so the slices carry them (JSON text, NULL when the syllabus says
nothing); each question stores the level it was written at and the Bloom level it targets, so
that exports can tag it. Existing rows keep NULL everywhere: nothing was asked of them, and an
export gives them no such tag.
"""

from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('slice') as batch:
        batch.add_column(sa.Column('difficulty', sa.Text(), nullable=True))
        batch.add_column(sa.Column('bloom', sa.Text(), nullable=True))
    with op.batch_alter_table('question') as batch:
        batch.add_column(sa.Column('difficulty', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('bloom', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('question') as batch:
        batch.drop_column('bloom')
        batch.drop_column('difficulty')
    with op.batch_alter_table('slice') as batch:
        batch.drop_column('bloom')
        batch.drop_column('difficulty')
