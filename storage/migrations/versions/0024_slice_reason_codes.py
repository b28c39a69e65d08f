"""slice.last_error_code and slice.requeue_code: why, as a code beside the free text

Revision ID: 0024
Revises: 0023
A slice's last error and its last requeue were free text with a prefix ("transient: HTTP 503",
"worker_vanished: a worker took its message, ...") that readers and tests matched. The code
(examforge.errors.SliceReason, storage.models.RequeueReason) sits beside the text now, and the
text is only the detail: people read the code's label and the detail together
(SliceReason.describe), as they read the whole text before. Existing rows get their code from
the prefix they were written with, and lose that prefix from the detail where the label puts
it back; a text no known writer wrote keeps it whole with the code `legacy`.
"""

from alembic import op
import sqlalchemy as sa


revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None

# (how the text starts, its code, whether the prefix moves to the code's label), in order:
# the first that matches wins. A slice failed by the reconciler at its attempt cap kept the
# previous error's text with a suffix: that one is handled first, on its own.
_CAPPED_SUFFIX = ' [attempt cap reached]'
_LAST_ERROR = (
    ('attempt cap: ', 'attempt_cap', True),
    ('handed back: ', 'handed_back', True),
    ('flex_unavailable: ', 'flex_unavailable', True),
    ('rate_limited: ', 'rate_limited', True),
    ('budget_wait: ', 'budget_wait', True),
    ('budget: ', 'budget', True),
    ('auth: ', 'auth', True),
    ('transient: ', 'transient', True),
    ('permanent: ', 'permanent', True),
    ('quota: ', 'stopped', False),
    ('model_not_found: ', 'stopped', False),
    ('invalid output', 'invalid_output', False),
    ('every question was one the chapter already had', 'duplicates', False),
    ('a batch request of ', 'too_large', False),
    ('not sent: ', 'not_sent', False),
)
_REQUEUE = ('worker_vanished', 'broker_epoch_changed', 'message_lost')


def _like(prefix: str) -> str:
    return prefix.replace("'", "''") + '%'


def upgrade() -> None:
    # Plain ADD and DROP COLUMN (SQLite has both since 3.35), not a batch copy of the table.
    op.add_column('slice', sa.Column('last_error_code', sa.String(length=32), nullable=True))
    op.add_column('slice', sa.Column('requeue_code', sa.String(length=32), nullable=True))
    op.execute(f"UPDATE slice SET last_error_code = 'attempt_cap', "
               f"last_error = substr(last_error, 1, length(last_error) - {len(_CAPPED_SUFFIX)}) "
               f"WHERE last_error LIKE '%{_CAPPED_SUFFIX}'")
    for prefix, code, strip in _LAST_ERROR:
        detail = f"substr(last_error, {len(prefix) + 1})" if strip else "last_error"
        op.execute(f"UPDATE slice SET last_error_code = '{code}', last_error = {detail} "
                   f"WHERE last_error_code IS NULL AND last_error LIKE '{_like(prefix)}'")
    op.execute("UPDATE slice SET last_error_code = 'legacy' "
               "WHERE last_error_code IS NULL AND last_error IS NOT NULL")
    for code in _REQUEUE:
        prefix = f"{code}: "
        op.execute(f"UPDATE slice SET requeue_code = '{code}', "
                   f"requeue_reason = substr(requeue_reason, {len(prefix) + 1}) "
                   f"WHERE requeue_code IS NULL AND requeue_reason LIKE '{_like(prefix)}'")
    op.execute("UPDATE slice SET requeue_code = 'legacy' "
               "WHERE requeue_code IS NULL AND requeue_reason IS NOT NULL")


def downgrade() -> None:
    # The prefixes back on the text, where the upgrade (or a writer since) left them to the code.
    for prefix, code, strip in _LAST_ERROR:
        if strip:
            op.execute(f"UPDATE slice SET last_error = '{prefix}' || COALESCE(last_error, '') "
                       f"WHERE last_error_code = '{code}' "
                       f"AND COALESCE(last_error, '') NOT LIKE '{_like(prefix)}'")
    op.execute("UPDATE slice SET requeue_reason = requeue_code || ': ' "
               "|| COALESCE(requeue_reason, '') "
               "WHERE requeue_code IS NOT NULL AND requeue_code <> 'legacy'")
    op.drop_column('slice', 'requeue_code')
    op.drop_column('slice', 'last_error_code')
