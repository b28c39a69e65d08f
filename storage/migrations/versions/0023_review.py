"""question review: a review state and version per question, and the table of review actions

Revision ID: 0023
Revises: 0022
A person reviews questions before export (storage.review): each question gets `review`
(unreviewed, approved, rejected), `version` (checked and bumped by every review action, so
that of two reviewers saving the same question the second is refused with 409, never applied
over the first), and who acted last and when. `question_edit` keeps every action with its
author and, for an edit, each changed field before and after. Existing questions are
unreviewed, at version 1.
"""

from alembic import op
import sqlalchemy as sa


revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN, no batch copy of the table (see 0020).
    op.add_column('question', sa.Column('review', sa.String(length=16), nullable=False,
                                        server_default='unreviewed'))
    op.add_column('question', sa.Column('version', sa.Integer(), nullable=False,
                                        server_default='1'))
    op.add_column('question', sa.Column('reviewed_by', sa.String(length=64), nullable=True))
    op.add_column('question', sa.Column('reviewed_at', sa.Float(), nullable=True))
    op.create_table(
        'question_edit',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('question_id', sa.Integer(), nullable=False),
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('chapter_id', sa.String(length=64), nullable=False),
        sa.Column('number', sa.Integer(), nullable=False),
        sa.Column('action', sa.String(length=16), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('client', sa.String(length=64), nullable=False, server_default=''),
        sa.Column('changes', sa.Text(), nullable=True),
        sa.Column('note', sa.Text(), nullable=True),
        sa.Column('at', sa.Float(), nullable=False),
    )
    op.create_index('ix_question_edit_question', 'question_edit', ['question_id', 'id'])
    op.create_index('ix_question_edit_exam', 'question_edit', ['exam', 'id'])


def downgrade() -> None:
    op.drop_index('ix_question_edit_exam', table_name='question_edit')
    op.drop_index('ix_question_edit_question', table_name='question_edit')
    op.drop_table('question_edit')
    op.drop_column('question', 'reviewed_at')
    op.drop_column('question', 'reviewed_by')
    op.drop_column('question', 'version')
    op.drop_column('question', 'review')
