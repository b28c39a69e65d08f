"""question: withdrawn from the numbering, and the blind solve's verdict

Revision ID: 0022
Revises: 0020
A question can leave its chapter's numbering (VERIFY=replace disputes it, a reviewer rejects
it) and stay in the database: `number` becomes nullable (NULL once withdrawn; UNIQUE never
compares NULLs, so its number is free for a replacement), `withdrawn` says why and
`withdrawn_number` keeps the number it had. `verdict`, `solved_index` and `verify_call_id`
are the blind solve's (VERIFY). Existing rows: numbered, never verified. call.kind says
what a call asked for: NULL (generation, every call so far) or 'solve'.

SQLite cannot change a column's nullability in place: the question table is copied (it has
no foreign keys pointing at it). A downgrade deletes the withdrawn rows (they have no number
to keep) with their signatures.
"""

from alembic import op
import sqlalchemy as sa


revision = '0022'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('question') as batch:
        batch.alter_column('number', existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column('withdrawn', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('withdrawn_number', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('verdict', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('solved_index', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('verify_call_id', sa.Integer(), nullable=True))
    # What a call asked for: NULL (every call so far) is generation, 'solve' a blind solve.
    op.add_column('call', sa.Column('kind', sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM call WHERE kind IS NOT NULL")
    op.drop_column('call', 'kind')
    op.execute("DELETE FROM question_sig WHERE question_id IN "
               "(SELECT id FROM question WHERE number IS NULL)")
    op.execute("DELETE FROM question WHERE number IS NULL")
    with op.batch_alter_table('question') as batch:
        batch.drop_column('verify_call_id')
        batch.drop_column('solved_index')
        batch.drop_column('verdict')
        batch.drop_column('withdrawn_number')
        batch.drop_column('withdrawn')
        batch.alter_column('number', existing_type=sa.Integer(), nullable=False)
