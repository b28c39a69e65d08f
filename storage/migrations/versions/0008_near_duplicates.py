"""near-duplicate signatures, LSH band keys and the per-chapter commit lock

Revision ID: 0008
Revises: 0007
Every stored question gets its signature (examforge.neardup: normalised content words and key
terms) in `question_sig` and its LSH band keys in `question_band`, the index that finds the
near-duplicate candidates of a new question without comparing it with every stored one.
`dedup_lock` holds the rows commits lock so that checking a batch and storing it is atomic for
a chapter (or an exam). The questions already stored are indexed here, with their chapter's
title as context, so that new questions are compared with them too.
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'question_sig',
        sa.Column('question_id', sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column('exam', sa.String(length=64), nullable=False),
        sa.Column('chapter_id', sa.String(length=64), nullable=False),
        sa.Column('tokens', sa.Text(), nullable=False),
        sa.Column('key_terms', sa.Text(), nullable=False),
        sa.Column('repeats', sa.Integer(), nullable=False, server_default='0'),
    )
    op.create_index('ix_question_sig_repeats', 'question_sig', ['exam', 'chapter_id', 'repeats'])
    op.create_table(
        'question_band',
        sa.Column('exam', sa.String(length=64), primary_key=True),
        sa.Column('band_key', sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column('question_id', sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column('chapter_id', sa.String(length=64), nullable=False),
    )
    op.create_table(
        'dedup_lock',
        sa.Column('exam', sa.String(length=64), primary_key=True),
        sa.Column('scope', sa.String(length=64), primary_key=True),
        sa.Column('commits', sa.Integer(), nullable=False, server_default='0'),
    )
    _index_stored(op.get_bind())


def _index_stored(bind: sa.engine.Connection) -> None:
    # Written out as this revision's tables were (not through storage.neardup, whose rows
    # later revisions change): the signatures come from examforge.neardup.
    from examforge.neardup import band_keys, signature

    sig = sa.table('question_sig', *(sa.column(c) for c in (
        'question_id', 'exam', 'chapter_id', 'tokens', 'key_terms', 'repeats')))
    band = sa.table('question_band', *(sa.column(c) for c in (
        'exam', 'band_key', 'question_id', 'chapter_id')))
    titles = {(e, c): t for e, c, t in bind.execute(sa.text(
        'SELECT DISTINCT exam, chapter_id, title FROM slice'))}
    rows = bind.execute(sa.text(
        'SELECT id, exam, chapter_id, question FROM question ORDER BY id')).all()
    for start in range(0, len(rows), 500):
        sigs, bands = [], []
        for r in rows[start:start + 500]:
            s = signature(r.question, titles.get((r.exam, r.chapter_id), ''))
            tokens, key_terms = s.encode()
            sigs.append({'question_id': r.id, 'exam': r.exam, 'chapter_id': r.chapter_id,
                         'tokens': tokens, 'key_terms': key_terms, 'repeats': 0})
            bands += [{'exam': r.exam, 'band_key': k, 'question_id': r.id,
                       'chapter_id': r.chapter_id} for k in set(band_keys(s))]
        if sigs:
            bind.execute(sig.insert(), sigs)
        if bands:
            bind.execute(band.insert(), bands)


def downgrade() -> None:
    op.drop_table('dedup_lock')
    op.drop_table('question_band')
    op.drop_index('ix_question_sig_repeats', table_name='question_sig')
    op.drop_table('question_sig')
