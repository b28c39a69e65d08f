"""The hot path's SQL functions plan their statements for each call's values (PostgreSQL)

Revision ID: 0034
Revises: 0033

PL/pgSQL caches a plan for each statement of `ef_claim`, `ef_start_call` and `ef_commit` per
connection, and after five calls keeps a generic plan, made without the call's values and with
the statistics of that moment. Made on a new database (or a new exam's first minute, before
autovacuum's ANALYZE), that plan was a bet on tables of no rows: at 2,560 one-call chapters
of one exam, the commit's duplicate check scanned every question of the exam through the
(exam, call_id) index, filtering on chapter and hash (2,050 rows for none), and its check of
what the scope stored since the worker's index filtered the exam's signatures on chapter,
since `p_dedup_scope = '' OR g.chapter_id = p_chapter` cannot use the chapter's index
without the scope's value. Both cost 2-3 ms a commit and grew with the exam; PostgreSQL's
CPU a paid call was 8-12 ms, more than the worker's.

`plan_cache_mode = force_custom_plan` on the three functions has each statement planned with
its values and the tables' current size (the planner reads a relation's pages at planning):
the unique (exam, chapter_id, norm_hash) index for the first, the (exam, chapter_id,
question_id) index for the second under the chapter scope. Planning costs less than the scans
it saves (at 32 slots: PostgreSQL's CPU a call 6.0 against 12.2 ms, bench/parts/latency.py).
"""

from alembic import op


revision = '0034'
down_revision = '0033'
branch_labels = None
depends_on = None

FUNCTIONS = ("ef_claim", "ef_start_call", "ef_commit")


def _each(action: str) -> str:
    names = ", ".join(f"'{name}'" for name in FUNCTIONS)
    return f"""
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.proname IN ({names}) AND p.pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s {action}', f);
    END LOOP;
END $$"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_each("SET plan_cache_mode = force_custom_plan"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_each("RESET plan_cache_mode"))
