"""partial indexes on what can still change; exams in keyset order

Revision ID: 0017
Revises: 0016
The work that runs all the time (every reconcile pass, each claim's look at the exam) read
the slice and call tables by state and outcome with no index on either, so each pass
scanned all of history: 1.6-1.9 s per pass at a million done slices (issue 19). These
indexes hold only the rows that can still change, so what they cost follows the work in
progress, not what is stored:

- `ix_slice_active`: slices pending or running, in the order the reconciler reads them;
- `ix_slice_cancelled_held`: cancelled slices whose holder kept its lease for the call it
  was in (Planning.cancel), the ones `settle_cancelled` looks for;
- `ix_call_in_flight`: calls in flight, by slice (settling orphans, pausing spent exams).

And `ix_exam_created`: `exams` and GET /exams page through exams newest first by
(created_at, slug), a keyset that new exams never shift.
"""

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

ACTIVE = "state IN ('pending', 'running')"
HELD = "state = 'cancelled' AND lease_owner IS NOT NULL"
IN_FLIGHT = "outcome = 'in_flight'"


def _where(sql: str) -> dict:
    return {"postgresql_where": sa.text(sql), "sqlite_where": sa.text(sql)}


def upgrade() -> None:
    op.create_index('ix_slice_active', 'slice', ['exam', 'position', 'slice_no'],
                    **_where(ACTIVE))
    op.create_index('ix_slice_cancelled_held', 'slice', ['exam', 'chapter_id', 'slice_no'],
                    **_where(HELD))
    op.create_index('ix_call_in_flight', 'call', ['exam', 'chapter_id', 'slice_no'],
                    **_where(IN_FLIGHT))
    op.create_index('ix_exam_created', 'exam', ['created_at', 'slug'])


def downgrade() -> None:
    op.drop_index('ix_exam_created', table_name='exam')
    op.drop_index('ix_call_in_flight', table_name='call')
    op.drop_index('ix_slice_cancelled_held', table_name='slice')
    op.drop_index('ix_slice_active', table_name='slice')
