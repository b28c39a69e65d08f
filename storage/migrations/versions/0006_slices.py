"""chapters become slices: fixed ranges of question numbers, each its own unit of work

Revision ID: 0006
Revises: 0005
A chapter was one lease, so its calls ran one after another however many workers there were.
Now each chapter is split into slices of at most SLICE_QUESTIONS questions (the setting when
the migration runs, 50 by default), each with its own lease, attempts, backoff and message:
the `chapter` table becomes `slice`, keyed by (exam, chapter_id, slice_no), with the first
number of its range.

What is stored stays where it is: a chapter's questions were numbered 1..n by its single
lease, so slice k (numbers k*size+1 .. (k+1)*size) finds its own among them. A chapter of more
than one slice keeps its row (leases, attempts, requeue history) as slice 0 and gets a row for
each further range; a new slice whose range is already stored is done, the others wait for a
message the reconciler publishes (their chapter was enqueued, and the queue holds no message
for them: the lost-message audit finds them within a few reconcile passes), or the next
`enqueue`.

Calls get the slice their first number falls in. Questions get the hash of their normalised
text, unique within a chapter, so that slices running at once can never both store the same
question; rows that repeat an earlier question of their chapter (possible before this rule)
keep a NULL hash and are never compared.
"""

import hashlib
import math
import os
import warnings

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

_DEFAULT_SLICE_QUESTIONS = 50
_COPIED = ('position', 'title', 'prompt', 'spec_hash', 'enqueued_at', 'enqueue_epoch',
           'updated_at')


def _slice_size() -> int:
    raw = os.environ.get('SLICE_QUESTIONS', '').strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else _DEFAULT_SLICE_QUESTIONS


def _norm_hash(text: str) -> str:
    # examforge.output.text_hash, inlined: a migration must not change when the code does.
    return hashlib.md5(' '.join(text.lower().split()).encode()).hexdigest()


def upgrade() -> None:
    bind = op.get_bind()
    size = _slice_size()
    op.drop_index('ix_chapter_lease_owner', table_name='chapter')
    op.rename_table('chapter', 'slice')
    if bind.dialect.name == 'postgresql':
        op.execute('ALTER TABLE slice RENAME CONSTRAINT chapter_pkey TO slice_pkey')
        op.execute('ALTER TABLE slice RENAME CONSTRAINT chapter_exam_fkey TO slice_exam_fkey')
    with op.batch_alter_table('slice', recreate='always') as batch:
        batch.add_column(sa.Column('slice_no', sa.Integer(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('first_number', sa.Integer(), nullable=False,
                                   server_default='1'))
    if bind.dialect.name == 'postgresql':
        op.execute('ALTER TABLE slice DROP CONSTRAINT slice_pkey')
        op.execute('ALTER TABLE slice ADD CONSTRAINT slice_pkey '
                   'PRIMARY KEY (exam, chapter_id, slice_no)')
    else:
        with warnings.catch_warnings():
            # SQLAlchemy notes that the copy's primary key differs from the reflected one:
            # that is the point of this step.
            warnings.simplefilter('ignore', sa.exc.SAWarning)
            with op.batch_alter_table('slice', recreate='always') as batch:
                batch.create_primary_key('pk_slice', ['exam', 'chapter_id', 'slice_no'])
    with op.batch_alter_table('slice') as batch:
        batch.alter_column('slice_no', server_default=None)
        batch.alter_column('first_number', server_default=None)
        batch.create_index('ix_slice_lease_owner', ['lease_owner'])

    with op.batch_alter_table('call') as batch:
        batch.add_column(sa.Column('slice_no', sa.Integer(), nullable=False,
                                   server_default='0'))
    with op.batch_alter_table('call') as batch:
        batch.alter_column('slice_no', server_default=None)
    op.execute(f'UPDATE call SET slice_no = (first_number - 1) / {size} WHERE first_number > 0')

    with op.batch_alter_table('question') as batch:
        batch.add_column(sa.Column('norm_hash', sa.String(length=32), nullable=True))
    _hash_questions(bind)
    with op.batch_alter_table('question') as batch:
        batch.create_unique_constraint('uq_question_text', ['exam', 'chapter_id', 'norm_hash'])

    _reslice(bind, size)


def _hash_questions(bind: sa.engine.Connection) -> None:
    seen: set[tuple[str, str, str]] = set()
    updates = []
    rows = bind.execute(sa.text('SELECT id, exam, chapter_id, question FROM question ORDER BY id'))
    for qid, exam, chapter_id, text in rows:
        digest = _norm_hash(text)
        if (exam, chapter_id, digest) not in seen:
            seen.add((exam, chapter_id, digest))
            updates.append({'i': qid, 'h': digest})
    for i in range(0, len(updates), 1000):
        bind.execute(sa.text('UPDATE question SET norm_hash = :h WHERE id = :i'),
                     updates[i:i + 1000])


def _reslice(bind: sa.engine.Connection, size: int) -> None:
    chapters = bind.execute(sa.text(
        'SELECT exam, chapter_id, target, state, ' + ', '.join(_COPIED)
        + ' FROM slice WHERE target > :size'), {'size': size}).mappings().all()
    for ch in chapters:
        numbers = [n for (n,) in bind.execute(sa.text(
            'SELECT number FROM question WHERE exam = :e AND chapter_id = :c'),
            {'e': ch['exam'], 'c': ch['chapter_id']})]
        count = math.ceil(ch['target'] / size)
        bind.execute(sa.text(
            'UPDATE slice SET target = :size WHERE exam = :e AND chapter_id = :c '
            'AND slice_no = 0'), {'size': size, 'e': ch['exam'], 'c': ch['chapter_id']})
        if sum(1 for n in numbers if n <= size) >= size and ch['state'] != 'cancelled':
            bind.execute(sa.text(
                "UPDATE slice SET state = 'done', lease_owner = NULL, lease_expires_at = NULL "
                'WHERE exam = :e AND chapter_id = :c AND slice_no = 0'),
                {'e': ch['exam'], 'c': ch['chapter_id']})
        for k in range(1, count):
            first = k * size + 1
            target = min(size, ch['target'] - k * size)
            stored = sum(1 for n in numbers if first <= n < first + target)
            if stored >= target:
                state = 'done'
            elif ch['state'] in ('cancelled', 'failed'):
                state = ch['state']
            else:
                state = 'pending'
            bind.execute(sa.text(
                'INSERT INTO slice (exam, chapter_id, slice_no, first_number, target, state, '
                'attempts, attempts_since_progress, requeues, ' + ', '.join(_COPIED) + ') '
                'VALUES (:exam, :chapter_id, :k, :first, :target, :state, 0, 0, 0, '
                + ', '.join(f':{c}' for c in _COPIED) + ')'),
                {**{c: ch[c] for c in _COPIED}, 'exam': ch['exam'],
                 'chapter_id': ch['chapter_id'], 'k': k, 'first': first, 'target': target,
                 'state': state})


def downgrade() -> None:
    bind = op.get_bind()
    # One row per chapter again: slice 0 takes the chapter's whole target; a chapter with a
    # slice not done is pending.
    op.execute('UPDATE slice SET target = (SELECT MAX(s.first_number + s.target - 1) FROM slice s '
               'WHERE s.exam = slice.exam AND s.chapter_id = slice.chapter_id) '
               'WHERE slice_no = 0')
    op.execute("UPDATE slice SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL "
               "WHERE slice_no = 0 AND EXISTS (SELECT 1 FROM slice s WHERE s.exam = slice.exam "
               "AND s.chapter_id = slice.chapter_id AND s.state <> 'done')")
    op.execute('DELETE FROM slice WHERE slice_no > 0')
    with op.batch_alter_table('question') as batch:
        batch.drop_constraint('uq_question_text', type_='unique')
        batch.drop_column('norm_hash')
    with op.batch_alter_table('call') as batch:
        batch.drop_column('slice_no')
    with op.batch_alter_table('slice') as batch:
        batch.drop_index('ix_slice_lease_owner')
    if bind.dialect.name == 'postgresql':
        op.execute('ALTER TABLE slice DROP CONSTRAINT slice_pkey')
        op.execute('ALTER TABLE slice ADD CONSTRAINT chapter_pkey PRIMARY KEY (exam, chapter_id)')
        op.execute('ALTER TABLE slice RENAME CONSTRAINT slice_exam_fkey TO chapter_exam_fkey')
        with op.batch_alter_table('slice') as batch:
            batch.drop_column('first_number')
            batch.drop_column('slice_no')
    else:
        with op.batch_alter_table('slice', recreate='always') as batch:
            batch.drop_column('first_number')
            batch.drop_column('slice_no')
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', sa.exc.SAWarning)
                batch.create_primary_key('pk_chapter', ['exam', 'chapter_id'])
    op.rename_table('slice', 'chapter')
    op.create_index('ix_chapter_lease_owner', 'chapter', ['lease_owner'])
