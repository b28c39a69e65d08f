"""Grounding in course material: passages, uploaded sources, and each question's source

Revision ID: 0021
Revises: 0020
- slice.sources: the hashes of the chapter's source files when its slices were cut (JSON,
  {entry: sha256 prefix}; NULL for a chapter without sources): a changed file is detected by
  its hash, like a changed title by spec_hash.
- question.source (where it came from: "guide.pdf, page 4, passage p3") and question.passage
  (the passage's number in its chapter, what `status` counts as cited).
- passage: a chapter's material cut into passages at enqueue (examforge.sources).
- source_file: the sources of an exam made through the API (PUT /exams/SLUG/sources/NAME),
  kept in the database and never read from a path.
"""

from alembic import op
import sqlalchemy as sa


revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (no batch copy: the exam table's foreign keys, see 0020).
    op.add_column('slice', sa.Column('sources', sa.Text(), nullable=True))
    op.add_column('question', sa.Column('source', sa.Text(), nullable=True))
    op.add_column('question', sa.Column('passage', sa.Integer(), nullable=True))
    op.create_table(
        'passage',
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('chapter_id', sa.String(length=64), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('source', sa.Text(), nullable=False),
        sa.Column('location', sa.Text(), nullable=True),
        sa.Column('text', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('exam', 'chapter_id', 'seq'),
    )
    op.create_table(
        'source_file',
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('exam', 'name'),
    )


def downgrade() -> None:
    op.drop_table('source_file')
    op.drop_table('passage')
    op.drop_column('question', 'passage')
    op.drop_column('question', 'source')
    op.drop_column('slice', 'sources')
