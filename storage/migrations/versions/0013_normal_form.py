"""one normal form: stored question hashes and near-duplicate signatures recomputed

Revision ID: 0013
Revises: 0012
The exact-duplicate hash (`question.norm_hash`) and the near-duplicate signatures
(`question_sig`) are now computed from one normal form (examforge.output.canonical): NFKC,
format characters (zero-width spaces and joiners, soft hyphens, BOMs) removed, whitespace
collapsed. Before, the hash applied none of it and the signatures only NFKC, so a zero-width
space inside "AWS", or NFD against NFC, stored a second copy of a question. Every stored hash
and every signature whose text (or chapter title) the normal form changes is recomputed.

Two stored questions of one chapter that the new form makes equal cannot both keep their
hash (UNIQUE(exam, chapter_id, norm_hash)). The first stored (lowest id) keeps it; the later
one keeps its row, its number and its signature, with no hash (NULL, which UNIQUE allows
many of), as migration 0006 left the duplicates it found; a warning names each. Deleting it
here would renumber the chapter under the calls that stored it; `producer import` and the
commit's check still see the first one's hash, so nothing equal to either is stored again.

The rows are read once, streamed (`yield_per`), in chapter order: one chapter's hashes are in
memory at a time; the updates, only of rows that change, go in batches of 1,000. Changed
hashes are first set to NULL and then to their new value, so that no intermediate state
breaks UNIQUE whatever the order. An exam whose signatures changed gets a new index epoch,
which makes every process rebuild its in-memory band index of it (storage.neardup).
100,000 questions, a tenth of them changed, take 3.8 s on SQLite and 5.5 s on PostgreSQL.

The hashes' form is written out here (a migration must not change when the code does); the
signatures come from examforge.neardup, as in 0008 and 0011, so a later change to them needs
a migration of its own (examforge.neardup.SIGNATURE_VERSION).
"""

import hashlib
import logging
import secrets
import unicodedata
from collections.abc import Callable, Iterator
from functools import lru_cache

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

log = logging.getLogger(__name__)
BATCH = 1000


@lru_cache(maxsize=1)
def _format_chars() -> dict[int, None]:
    return {cp: None for cp in range(0x80, 0x110000)
            if unicodedata.category(chr(cp)) == 'Cf'}


def _new_hash(text: str) -> str:
    # examforge.output.text_hash as of this revision, inlined: a migration must not change
    # when the code does.
    if not text.isascii():
        text = unicodedata.normalize('NFKC', text.translate(_format_chars()))
    return hashlib.md5(' '.join(text.split()).lower().encode()).hexdigest()


def _old_hash(text: str) -> str:
    # examforge.output.text_hash before this revision (migration 0006's).
    return hashlib.md5(' '.join(text.lower().split()).encode()).hexdigest()


def upgrade() -> None:
    bind = op.get_bind()
    _rehash(bind, _new_hash)
    _resign(bind)


def downgrade() -> None:
    # The hashes go back to the old form (the code of 0012 compares new questions by it).
    # The signatures stay: the old code's are the same for every text but those the normal
    # form changes, and it can only miss those repeats, as it did before.
    _rehash(op.get_bind(), _old_hash)


def _batches(rows: list[dict[str, object]]) -> Iterator[list[dict[str, object]]]:
    for start in range(0, len(rows), BATCH):
        yield rows[start:start + BATCH]


def _rehash(bind: sa.engine.Connection, digest: Callable[[str], str]) -> None:
    """Every question's hash by `digest`; within a chapter, the lowest id keeps a hash that
    several questions now share, the others get NULL (and a warning)."""
    changes: list[dict[str, object]] = []
    clashes: list[tuple[str, str, int, int]] = []
    chapter: tuple[str, str] | None = None
    first: dict[str, int] = {}  # this chapter's hashes -> the number of the first with it
    rows = bind.execute(sa.text(
        'SELECT id, exam, chapter_id, number, question, norm_hash FROM question '
        'ORDER BY exam, chapter_id, id').execution_options(yield_per=BATCH))
    for qid, exam, chapter_id, number, text, stored in rows:
        if (exam, chapter_id) != chapter:
            chapter, first = (exam, chapter_id), {}
        h: str | None = digest(text)
        if h in first:
            clashes.append((exam, chapter_id, first[h], number))
            h = None
        else:
            first[h] = number  # type: ignore[index]
        if h != stored:
            changes.append({'i': qid, 'h': h})
    for batch in _batches(changes):
        bind.execute(sa.text('UPDATE question SET norm_hash = NULL WHERE id = :i'), batch)
    for batch in _batches([c for c in changes if c['h'] is not None]):
        bind.execute(sa.text('UPDATE question SET norm_hash = :h WHERE id = :i'), batch)
    for exam, chapter_id, kept, dup in clashes:
        log.warning('%s/%s: question %d is the same as question %d in the normal form; both '
                    'are kept, and question %d no longer holds its hash',
                    exam, chapter_id, dup, kept, dup)


def _resign(bind: sa.engine.Connection) -> None:
    """The signatures (tokens, key terms, band keys) of the questions whose text or chapter
    title the normal form changes. (Any other's is the same as before: the signatures applied
    NFKC already.)"""
    import struct

    from examforge.neardup import band_keys, signature
    from examforge.output import canonical

    def moved(text: str) -> bool:
        return canonical(text) != unicodedata.normalize('NFKC', text)

    titles = {(e, c): t or '' for e, c, t in bind.execute(sa.text(
        'SELECT DISTINCT exam, chapter_id, title FROM slice'))}
    changes: list[dict[str, object]] = []
    exams: set[str] = set()
    rows = bind.execute(sa.text(
        'SELECT s.question_id, s.exam, s.chapter_id, s.tokens, s.key_terms, s.bands, '
        'q.question FROM question_sig s JOIN question q ON q.id = s.question_id '
        'ORDER BY s.question_id').execution_options(yield_per=BATCH))
    for qid, exam, chapter_id, tokens, key_terms, bands, text in rows:
        title = titles.get((exam, chapter_id), '')
        if not moved(text) and not moved(title):
            continue
        sig = signature(text, title)
        keys = band_keys(sig)
        new = (*sig.encode(), struct.pack(f'<{len(keys)}Q', *keys))
        if new != (tokens, key_terms, bytes(bands) if bands is not None else None):
            changes.append({'i': qid, 't': new[0], 'k': new[1], 'b': new[2]})
            exams.add(exam)
    sig_table = sa.table('question_sig', sa.column('question_id', sa.Integer),
                         sa.column('tokens', sa.Text), sa.column('key_terms', sa.Text),
                         sa.column('bands', sa.LargeBinary))
    for batch in _batches(changes):
        bind.execute(sig_table.update().where(sig_table.c.question_id == sa.bindparam('i'))
                     .values(tokens=sa.bindparam('t'), key_terms=sa.bindparam('k'),
                             bands=sa.bindparam('b')), batch)
    exam = sa.table('exam', sa.column('slug', sa.String), sa.column('index_epoch', sa.BigInteger))
    for slug in sorted(exams):
        bind.execute(exam.update().where(exam.c.slug == slug)
                     .values(index_epoch=secrets.randbits(62)))
