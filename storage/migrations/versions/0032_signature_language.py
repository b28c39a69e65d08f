"""near-duplicate signatures in the chapter's language: every stored signature recomputed

Revision ID: 0032
Revises: 0031

The near-duplicate signatures (`question_sig`: tokens, key terms, band keys) were computed by
English rules whatever the question's language. They are computed in the chapter's language
now (examforge.neardup_lang: each script's letter variants, digits, the language's stemmer,
stop words, lead-ins and number words; examforge.neardup.SIGNATURE_VERSION 3), and a name
such as "m5.large" is one key term with its dotted suffix. Every stored signature is
recomputed in its chapter's language (slice.language, migration 0031) with its chapter's
title; only the rows that change are written, in batches of 1,000, and an exam with any
changed row gets a new index epoch, which makes every process rebuild its in-memory band
index of it (storage.neardup). English signatures change only where a dotted name or another
script's digits or letters appear. Every stored question is signed again: 20,000 questions,
every row rewritten, took 3.8 s on SQLite (2.2 s of CPU) on a 2-core machine, so about 20 s
for 100,000.

The signatures come from examforge.neardup, as in 0008, 0011 and 0013: a later change to
them needs a migration of its own. A downgrade leaves them: 0031's code compares new
questions by English rules, which can only miss repeats in the other languages, as it did.
"""

import secrets
import struct
from collections.abc import Iterator

import sqlalchemy as sa
from alembic import op

revision = '0032'
down_revision = '0031'
branch_labels = None
depends_on = None

BATCH = 1000


def _batches(rows: list[dict[str, object]]) -> Iterator[list[dict[str, object]]]:
    for start in range(0, len(rows), BATCH):
        yield rows[start:start + BATCH]


def upgrade() -> None:
    from examforge.neardup import band_keys_many, signature

    bind = op.get_bind()
    chapters = {(e, c): (t or '', lang or 'en') for e, c, t, lang in bind.execute(sa.text(
        'SELECT exam, chapter_id, min(title), min(language) FROM slice '
        'GROUP BY exam, chapter_id'))}
    changes: list[dict[str, object]] = []
    exams: set[str] = set()
    rows = bind.execute(sa.text(
        'SELECT s.question_id, s.exam, s.chapter_id, s.tokens, s.key_terms, s.bands, '
        'q.question FROM question_sig s JOIN question q ON q.id = s.question_id '
        'ORDER BY s.question_id').execution_options(yield_per=BATCH))
    pending: list[tuple[int, str, str, str, bytes | None, object]] = []

    def flush() -> None:
        sigs = [sig for *_, sig in pending]
        for (qid, exam, tokens, key_terms, bands, _), sig, keys in zip(
                pending, sigs, band_keys_many(sigs)):  # type: ignore[arg-type]
            new = (*sig.encode(), struct.pack(f'<{len(keys)}Q', *keys))  # type: ignore[attr-defined]
            if new != (tokens, key_terms, bands):
                changes.append({'i': qid, 't': new[0], 'k': new[1], 'b': new[2]})
                exams.add(exam)
        pending.clear()

    for qid, exam, chapter_id, tokens, key_terms, bands, text in rows:
        title, language = chapters.get((exam, chapter_id), ('', 'en'))
        pending.append((qid, exam, tokens, key_terms,
                        bytes(bands) if bands is not None else None,
                        signature(text, title, language)))
        if len(pending) >= BATCH:
            flush()
    flush()
    sig_table = sa.table('question_sig', sa.column('question_id', sa.Integer),
                         sa.column('tokens', sa.Text), sa.column('key_terms', sa.Text),
                         sa.column('bands', sa.LargeBinary))
    for batch in _batches(changes):
        bind.execute(sig_table.update().where(sig_table.c.question_id == sa.bindparam('i'))
                     .values(tokens=sa.bindparam('t'), key_terms=sa.bindparam('k'),
                             bands=sa.bindparam('b')), batch)
    exam_table = sa.table('exam', sa.column('slug', sa.String),
                          sa.column('index_epoch', sa.BigInteger))
    for slug in sorted(exams):
        bind.execute(exam_table.update().where(exam_table.c.slug == slug)
                     .values(index_epoch=secrets.randbits(62)))


def downgrade() -> None:
    # The signatures stay (see the docstring).
    pass
