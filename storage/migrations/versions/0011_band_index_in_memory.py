"""near-duplicate band keys on the signature row; the band table dropped

Revision ID: 0011
Revises: 0010
Migration 0008 stored each question's 64 LSH band keys as 64 rows of `question_band`, the
index a commit looked its candidates up in. Each commit then wrote 320 rows at random places
of that b-tree, which cost more than the rest of the commit. The keys now go on the
question's own `question_sig` row (`bands`, 64 little-endian unsigned 64-bit integers), read
in id order by each process into an in-memory index (storage.neardup); two indexes serve
that read, by chapter and by exam. `exam.index_epoch` changes whenever an exam's questions
are deleted, so that a process rebuilds its index then. The keys are computed afresh from
each question's stored tokens (the MinHash is now examforge.neardup's own, not
datasketch's), so the index agrees with the keys new questions get.
"""

import struct

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('question_sig') as batch:
        batch.add_column(sa.Column('bands', sa.LargeBinary(), nullable=True))
    with op.batch_alter_table('exam') as batch:
        batch.add_column(sa.Column('index_epoch', sa.BigInteger(), nullable=True))
    op.create_index('ix_question_sig_chapter_id', 'question_sig',
                    ['exam', 'chapter_id', 'question_id'])
    op.create_index('ix_question_sig_exam_id', 'question_sig', ['exam', 'question_id'])
    bind = op.get_bind()
    from examforge.neardup import Signature, band_keys

    sig = sa.table('question_sig', sa.column('question_id', sa.Integer),
                   sa.column('bands', sa.LargeBinary))
    rows = [{'qid': qid, 'b': struct.pack(f'<{len(ks)}Q', *ks)}
            for qid, tokens in bind.execute(sa.text(
                'SELECT question_id, tokens FROM question_sig ORDER BY question_id'))
            for ks in [band_keys(Signature.decode(tokens, ''))]]
    for start in range(0, len(rows), 1000):
        bind.execute(sig.update().where(sig.c.question_id == sa.bindparam('qid'))
                     .values(bands=sa.bindparam('b')), rows[start:start + 1000])
    exam = sa.table('exam', sa.column('slug', sa.String), sa.column('index_epoch', sa.BigInteger))
    import secrets
    for (slug,) in bind.execute(sa.text('SELECT slug FROM exam')).all():
        bind.execute(exam.update().where(exam.c.slug == slug)
                     .values(index_epoch=secrets.randbits(62)))
    op.drop_table('question_band')


def downgrade() -> None:
    op.create_table(
        'question_band',
        sa.Column('exam', sa.String(length=64), primary_key=True),
        sa.Column('band_key', sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column('question_id', sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column('chapter_id', sa.String(length=64), nullable=False),
    )
    bind = op.get_bind()
    band = sa.table('question_band', sa.column('exam', sa.String),
                    sa.column('band_key', sa.BigInteger), sa.column('question_id', sa.Integer),
                    sa.column('chapter_id', sa.String))
    rows = []
    for qid, exam, chapter, blob in bind.execute(sa.text(
            'SELECT question_id, exam, chapter_id, bands FROM question_sig')):
        if blob:
            rows += [{'exam': exam, 'band_key': k, 'question_id': qid, 'chapter_id': chapter}
                     for k in set(struct.unpack(f'<{len(blob) // 8}Q', blob))]
    for start in range(0, len(rows), 5000):
        bind.execute(band.insert(), rows[start:start + 5000])
    op.drop_index('ix_question_sig_exam_id', table_name='question_sig')
    op.drop_index('ix_question_sig_chapter_id', table_name='question_sig')
    # ALTER TABLE .. DROP COLUMN (SQLite 3.35+), not batch mode's copy of the table: the
    # slices' foreign key refuses the copy's DROP TABLE exam.
    with op.batch_alter_table('exam', recreate='never') as batch:
        batch.drop_column('index_epoch')
    with op.batch_alter_table('question_sig', recreate='never') as batch:
        batch.drop_column('bands')
