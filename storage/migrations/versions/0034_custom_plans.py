"""The hot path's SQL functions plan their statements for each call's values (PostgreSQL)

Revision ID: 0034
Revises: 0033

PL/pgSQL caches a plan for each statement of `ef_claim`, `ef_start_call` and `ef_commit` per
connection, and after five calls keeps a generic plan, made without the call's values and with
the tables' statistics of that moment. Made on a new database's unanalysed tables, that plan
was a bet on tables of no rows: at 2,560 one-call chapters of one exam, the commit's duplicate
check scanned every question of the exam through the (exam, call_id) index, filtering on
chapter and hash (2,050 rows for none), and its check of what the scope stored since the
worker's index filtered the exam's signatures on chapter, since `p_dedup_scope = '' OR
g.chapter_id = p_chapter` cannot use the chapter's index without the scope's value. Both cost
2-3 ms a commit and grew with the exam; PostgreSQL's CPU a paid call was 12-13 ms there, more
than the worker's.

`plan_cache_mode = force_custom_plan` on the three functions has each statement planned with
its values and the tables' current size (the planner reads a relation's pages at planning):
the unique (exam, chapter_id, norm_hash) index for the first, an index on the exam and the
chapter for the second under the chapter scope. Planning costs less than the scans it saves
(at 32 slots: PostgreSQL's CPU a call 5.9 against 12.0-13.2 ms, traced runs of
bench/parts/latency.py's workload).

`CREATE OR REPLACE FUNCTION` (and DROP and CREATE) resets a function's settings: a later
migration that recreates one of these functions calls `custom_plans()` of this module after
it, in its upgrade and in its downgrade (tests/integration/test_custom_plans.py checks head).
"""

from alembic import op


revision = '0034'
down_revision = '0033'
branch_labels = None
depends_on = None

FUNCTIONS = ("ef_claim", "ef_start_call", "ef_commit")


def _each(action: str) -> str:
    """`action` on each of FUNCTIONS in the current schema, where the migrations create them;
    an error unless exactly those three are found (a silent no-op would leave the generic
    plans)."""
    names = ", ".join(f"'{name}'" for name in FUNCTIONS)
    return f"""
DO $$
DECLARE f regprocedure; n integer := 0;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.proname IN ({names})
                AND p.pronamespace = (SELECT oid FROM pg_namespace
                                       WHERE nspname = current_schema())
    LOOP
        EXECUTE format('ALTER FUNCTION %s {action}', f);
        n := n + 1;
    END LOOP;
    IF n <> {len(FUNCTIONS)} THEN
        RAISE EXCEPTION 'expected the {len(FUNCTIONS)} hot-path functions in schema %, found %',
            current_schema(), n;
    END IF;
END $$"""


def custom_plans() -> None:
    """Each statement of the hot path's functions planned for its call's values."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_each("SET plan_cache_mode = force_custom_plan"))


def upgrade() -> None:
    custom_plans()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_each("RESET plan_cache_mode"))
