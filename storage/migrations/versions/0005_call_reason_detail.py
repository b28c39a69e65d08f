"""the ledger's reasons become a closed vocabulary, with the text beside them

Revision ID: 0005
Revises: 0004
`call.reason` held free text ("crash_before_commit: holder lost its lease mid-call",
"HTTP 503: ...") that tests and reports matched by prefix. It now holds one value of a closed
list (storage.models.CallReason, or the provider error's examforge.errors.ErrorKind), and the
text moves to `call.detail`. Existing rows keep their whole text in `detail`; their reason is
the known prefix where there is one, and `legacy` otherwise.
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

# Prefixes the ledger wrote before this revision, and the reason each one is now.
_KNOWN = {
    'crash_before_commit': 'crash_before_commit', 'lease_lost': 'lease_lost',
    'commit_failed': 'commit_failed', 'invalid_output': 'invalid_output',
    'deadline': 'deadline', 'reply_too_large': 'reply_too_large', 'timeout': 'timeout',
    'connection error': 'connection', 'unreadable reply': 'unreadable',
    'HTTP 429': 'rate_limited', 'HTTP 401': 'auth', 'HTTP 403': 'auth',
    'HTTP 5': 'server_error', 'HTTP 4': 'bad_request',
}


def upgrade() -> None:
    with op.batch_alter_table('call') as batch:
        batch.add_column(sa.Column('detail', sa.Text(), nullable=True))
    op.execute('UPDATE call SET detail = reason WHERE reason IS NOT NULL')
    case = ' '.join(f"WHEN reason LIKE '{prefix}%' THEN '{value}'"
                    for prefix, value in _KNOWN.items())
    op.execute(f"UPDATE call SET reason = CASE {case} ELSE 'legacy' END "
               "WHERE reason IS NOT NULL AND outcome <> 'used'")
    op.execute("UPDATE call SET reason = NULL WHERE outcome = 'used'")
    with op.batch_alter_table('call') as batch:
        batch.alter_column('reason', type_=sa.String(length=32), existing_type=sa.Text(),
                           existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table('call') as batch:
        batch.alter_column('reason', type_=sa.Text(), existing_type=sa.String(length=32),
                           existing_nullable=True)
    op.execute("UPDATE call SET reason = COALESCE(detail, reason)")
    with op.batch_alter_table('call') as batch:
        batch.drop_column('detail')
