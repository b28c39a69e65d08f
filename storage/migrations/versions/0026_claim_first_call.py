"""ef_claim records the slice's first call and reads its course material (PostgreSQL)

Revision ID: 0026
Revises: 0025

A one-call chapter cost four round trips before its reply (the course-material read, the
claim, the call's record, the read before the send) and one after (the commit). Now:
- ef_claim returns the chapter's passages when the slice has sources (what the first prompt
  carries), instead of a read of its own before the claim;
- a worker that knows a slice's spec (storage.leases `fresh_view`: read once per process for
  an exam's open slices) plans its first call before the claim, as for a slice with nothing
  stored, and passes the plan with the spec's fingerprint (`ef_spec_fp`). ef_claim records
  that call (through ef_start_call: fence, reservation) in the claim's own statement when
  the slice is what the plan assumed: the same fingerprint, no question in the chapter, no
  sources. Otherwise it records nothing and says so (`first_status` NULL), and the client
  plans from what the claim read, as before.
The record is the fenced step right before the send, so the read before the send is not
needed after it (runner.pipeline); a call recorded by a commit keeps that read.
SQLite has no functions of this kind: nothing to do there.
"""

from alembic import op


revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

OLD_SIGNATURE = ("ef_claim(varchar, varchar, integer, varchar, double precision, integer, "
                 "varchar, text, text, integer)")
NEW_SIGNATURE = ("ef_claim(varchar, varchar, integer, varchar, double precision, integer, "
                 "varchar, text, text, integer, text, integer, integer, integer, integer, "
                 "double precision, varchar, boolean)")

SPEC_FP_FUNCTION = r"""
CREATE OR REPLACE FUNCTION ef_spec_fp(
    p_exam_title text, p_title text, p_prompt text, p_target integer, p_first integer,
    p_chapter_target integer, p_difficulty text, p_bloom text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(concat_ws(chr(31), coalesce(p_exam_title, chr(30)), coalesce(p_title, chr(30)),
                         coalesce(p_prompt, chr(30)), p_target, p_first, p_chapter_target,
                         coalesce(p_difficulty, chr(30)), coalesce(p_bloom, chr(30))))
$$
"""

CLAIM_FUNCTION = r"""
CREATE FUNCTION ef_claim(
    p_exam varchar, p_chapter varchar, p_slice integer, p_owner varchar,
    p_lease double precision, p_max integer, p_crash_reason varchar, p_crash_detail text,
    p_budget_reason text, p_repeated_n integer,
    p_spec_fp text, p_first integer, p_requested integer, p_prompt_tokens integer,
    p_max_tokens integer, p_reserve double precision, p_model varchar, p_price_known boolean,
    OUT status text, OUT attempts integer, OUT attempts_since_progress integer,
    OUT target integer, OUT first_number integer, OUT title text, OUT prompt text,
    OUT difficulty text, OUT bloom text, OUT exam_title text, OUT chapter_target integer,
    OUT index_epoch bigint, OUT took_over integer, OUT ids integer[], OUT numbers integer[],
    OUT texts text[], OUT difficulties varchar[], OUT repeated_ids integer[],
    OUT repeated_texts text[], OUT passage_seqs integer[], OUT passage_sources text[],
    OUT passage_locations text[], OUT passage_texts text[], OUT first_status text,
    OUT first_call integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_budget double precision;
    v_now double precision;
    v_sum double precision;
    v_sources text;
BEGIN
    -- Leases.claim's lock order and statement (Ledger._exam_first, Leases._claim_stmt).
    SELECT e.budget_usd INTO v_budget FROM exam e WHERE e.slug = p_exam FOR KEY SHARE;
    IF v_budget IS NOT NULL THEN
        PERFORM 1 FROM exam e WHERE e.slug = p_exam FOR NO KEY UPDATE;
    END IF;
    v_now := extract(epoch FROM clock_timestamp());
    UPDATE slice s SET lease_owner = p_owner, lease_expires_at = v_now + p_lease,
           state = 'running', attempts = s.attempts + 1,
           attempts_since_progress = s.attempts_since_progress + 1, not_before_at = NULL,
           picked_at = v_now, updated_at = v_now
     WHERE s.exam = p_exam AND s.chapter_id = p_chapter AND s.slice_no = p_slice
       AND (s.state = 'pending' OR s.state = 'running')
       AND (s.lease_owner IS NULL OR s.lease_expires_at <= v_now)
       AND (s.not_before_at IS NULL OR s.not_before_at <= v_now)
       AND s.attempts_since_progress < p_max
       AND EXISTS (SELECT 1 FROM exam e WHERE e.slug = p_exam AND e.state = 'active')
    RETURNING s.attempts, s.attempts_since_progress, s.target, s.first_number, s.title,
              s.prompt, s.difficulty, s.bloom, s.sources
         INTO attempts, attempts_since_progress, target, first_number, title, prompt,
              difficulty, bloom, v_sources;
    IF NOT FOUND THEN
        status := 'not'; RETURN;  -- the general path says why (Leases._why_not)
    END IF;
    -- Ledger._waste_orphaned_calls: the previous holder's calls, at their worst case.
    WITH w AS (
        UPDATE call c SET outcome = 'wasted', finished_at = v_now, reason = p_crash_reason,
               detail = p_crash_detail, completion_tokens = coalesce(c.max_tokens, 0),
               cost_usd = c.reserved_usd, usage_estimated = true
         WHERE c.exam = p_exam AND c.chapter_id = p_chapter AND c.slice_no = p_slice
           AND c.outcome = 'in_flight'
        RETURNING c.reserved_usd)
    SELECT count(*), coalesce(sum(w.reserved_usd), 0) INTO took_over, v_sum FROM w;
    IF took_over > 0 AND v_budget IS NOT NULL THEN
        UPDATE exam e SET reserved_usd = e.reserved_usd - v_sum, spent_usd = e.spent_usd + v_sum,
               state = CASE WHEN e.state = 'active'
                             AND e.spent_usd + v_sum >= e.budget_usd - 1e-12
                            THEN 'paused' ELSE e.state END,
               pause_reason = CASE WHEN e.state = 'active'
                                    AND e.spent_usd + v_sum >= e.budget_usd - 1e-12
                                   THEN p_budget_reason ELSE e.pause_reason END,
               pause_code = CASE WHEN e.state = 'active'
                                  AND e.spent_usd + v_sum >= e.budget_usd - 1e-12
                                 THEN 'budget' ELSE e.pause_code END
         WHERE e.slug = p_exam;
    END IF;
    SELECT e.title, e.index_epoch INTO exam_title, index_epoch FROM exam e
     WHERE e.slug = p_exam;
    SELECT max(o.first_number + o.target - 1) INTO chapter_target FROM slice o
     WHERE o.exam = p_exam AND o.chapter_id = p_chapter;
    SELECT array_agg(q.id ORDER BY q.id), array_agg(q.number ORDER BY q.id),
           array_agg(q.question ORDER BY q.id), array_agg(q.difficulty ORDER BY q.id)
      INTO ids, numbers, texts, difficulties
      FROM question q WHERE q.exam = p_exam AND q.chapter_id = p_chapter;
    IF p_repeated_n IS NOT NULL AND ids IS NOT NULL THEN
        SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.question ORDER BY r.ord)
          INTO repeated_ids, repeated_texts
          FROM (SELECT q.id, q.question, row_number() OVER (ORDER BY g.repeats DESC, q.id) ord
                  FROM question q JOIN question_sig g ON g.question_id = q.id
                 WHERE g.exam = p_exam AND g.chapter_id = p_chapter AND g.repeats > 0
                 ORDER BY g.repeats DESC, q.id LIMIT p_repeated_n) r;
    END IF;
    IF v_sources IS NOT NULL THEN
        -- Grounding.chapter_passages: what the slice's prompts carry.
        SELECT array_agg(p.seq ORDER BY p.seq), array_agg(p.source ORDER BY p.seq),
               array_agg(p.location ORDER BY p.seq), array_agg(p.text ORDER BY p.seq)
          INTO passage_seqs, passage_sources, passage_locations, passage_texts
          FROM passage p WHERE p.exam = p_exam AND p.chapter_id = p_chapter;
    END IF;
    status := 'ok';
    -- The first call planned before the claim, for the slice as its spec says and with
    -- nothing stored: recorded only when that is what the claim found.
    IF p_spec_fp IS NOT NULL AND ids IS NULL AND v_sources IS NULL
       AND p_first = first_number
       AND p_spec_fp = ef_spec_fp(exam_title, title, prompt, target, first_number,
                                  chapter_target, difficulty, bloom) THEN
        SELECT f.status, f.call_id INTO first_status, first_call
          FROM ef_start_call(p_exam, p_chapter, p_slice, p_owner, p_lease, attempts, p_first,
                             p_requested, p_prompt_tokens, p_max_tokens, p_reserve, p_model,
                             p_price_known) f;
    END IF;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(SPEC_FP_FUNCTION)
        op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}")
        op.execute(CLAIM_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # 0025's ef_claim, from its own file (this directory is not a package).
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location(
            "examforge_migration_0025", Path(__file__).with_name("0025_commit_function.py"))
        assert spec is not None and spec.loader is not None
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        op.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")
        op.execute("DROP FUNCTION IF EXISTS ef_spec_fp")
        op.execute(before.CLAIM_FUNCTION)
