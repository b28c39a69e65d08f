"""source_text: a source's extracted text, kept by the hash of its bytes

Revision ID: 0028
Revises: 0027
A source is parsed once (a PDF's text extraction runs in a child process under a work budget):
`enqueue`, `run` and `POST /runs` read a file's text from here while its bytes are the same, and
parse it again only when they change. The key holds the extraction's version, the hash, the
file's kind and the pages listed (examforge.sources.text_key).
"""

from alembic import op
import sqlalchemy as sa


revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'source_text',
        sa.Column('key', sa.String(length=96), primary_key=True),
        sa.Column('sections', sa.Text(), nullable=False),
        sa.Column('chars', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('source_text')
