"""ef_commit, ef_claim, ef_start_call: a paid call's steps in one round trip each (PostgreSQL)

Revision ID: 0025
Revises: 0024

The per-call path's commit (storage.fastpath) as one SQL function: the fence, the checks
that the client's optimistic preparation still holds, the questions and their signatures,
the call's usage and its settlement, the steering reads and the next call's record, in one
statement and so one transaction. Anything it does not handle (a cancelled slice, a count
or a target that changed, a duplicate, a near-duplicate index that is behind, a call
already settled) it answers with a status before it writes anything but the fence's lease
extension, and the client commits through the general path instead (storage.ledger).
ef_claim takes a slice's lease and reads what the first prompt needs (the slice, the
chapter's questions, the most repeated ones); ef_start_call records a call under the
lease's fence with its budget reservation. Each answers a case it does not handle (a claim
not won, a budget without room) with a status, and the client takes the general path.
SQLite has no functions of this kind: nothing to do there.
"""

from alembic import op


revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

COMMIT_FUNCTION = r"""
CREATE OR REPLACE FUNCTION ef_commit(
    p_exam varchar, p_chapter varchar, p_slice integer, p_owner varchar, p_lease double precision,
    p_call integer, p_first integer, p_stored integer, p_target integer,
    -- the questions, one array element each, numbered by the client from p_first + p_stored
    p_numbers integer[], p_questions text[], p_choices text[], p_answers integer[],
    p_explanations text[], p_hashes varchar[], p_difficulties varchar[], p_blooms varchar[],
    p_sources text[], p_passages integer[], p_model varchar,
    -- near-duplicates: the scope's lock key ('' exam, else the chapter; NULL: no check), its
    -- lock taken (p_dedup_lock), the index epoch and highest question id the client's check saw
    p_dedup_scope varchar, p_dedup_lock boolean, p_epoch bigint, p_max_id integer,
    p_tokens text[], p_key_terms text[], p_bands bytea[], p_repeated integer[],
    -- the call's ending and usage
    p_detail text, p_prompt_tokens integer, p_completion_tokens integer, p_cost double precision,
    p_endpoint varchar, p_estimated boolean, p_cached integer, p_tier varchar,
    p_budget_reason text,
    -- what the next prompts list: 'newest' (p_newest of them), 'steer' (p_repeated_n most
    -- repeated, p_newest newest, the numbers p_sample), or NULL
    p_recent varchar, p_newest integer, p_repeated_n integer, p_sample integer[],
    -- the next call, recorded only if the slice then has p_plan_stored of p_target
    p_order_key integer, p_plan_stored integer, p_plan_first integer, p_plan_requested integer,
    p_plan_prompt_tokens integer, p_plan_max_tokens integer, p_plan_reserve double precision,
    p_plan_model varchar, p_plan_price_known boolean, p_attempt integer,
    OUT status text, OUT stored integer, OUT target integer, OUT ids integer[],
    OUT next_call integer, OUT newest_ids integer[], OUT newest_texts text[],
    OUT repeated_ids integer[], OUT repeated_texts text[], OUT sample_ids integer[],
    OUT sample_texts text[], OUT sample_numbers integer[])
LANGUAGE plpgsql AS $$
DECLARE
    v_budget double precision;
    v_first integer;
    v_state varchar;
    v_now double precision;
    v_reserved double precision;
    v_kept integer := coalesce(array_length(p_numbers, 1), 0);
    v_fits boolean;
BEGIN
    -- Lock order as in the general path: the exam row (a budgeted exam's), the slice's, the
    -- near-duplicate scope's, the call's.
    SELECT budget_usd INTO v_budget FROM exam WHERE slug = p_exam FOR KEY SHARE;
    IF v_budget IS NOT NULL THEN
        PERFORM 1 FROM exam WHERE slug = p_exam FOR NO KEY UPDATE;
    END IF;
    v_now := extract(epoch FROM clock_timestamp());
    UPDATE slice s SET lease_expires_at = v_now + p_lease, updated_at = v_now
     WHERE s.exam = p_exam AND s.chapter_id = p_chapter AND s.slice_no = p_slice
       AND s.lease_owner = p_owner AND s.lease_expires_at > v_now
       AND s.state IN ('running', 'cancelled')
    RETURNING s.target, s.first_number, s.state INTO target, v_first, v_state;
    IF NOT FOUND THEN
        status := 'lost'; RETURN;
    END IF;
    SELECT count(*) INTO stored FROM question q
     WHERE q.exam = p_exam AND q.chapter_id = p_chapter
       AND q.number >= v_first AND q.number < v_first + target;
    IF v_state <> 'running' OR v_first <> p_first OR stored <> p_stored
       OR target <> p_target OR v_kept = 0 OR v_kept > target - stored THEN
        status := 'changed'; RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM question q WHERE q.exam = p_exam AND q.chapter_id = p_chapter
                  AND q.norm_hash = ANY (p_hashes)) THEN
        status := 'duplicate'; RETURN;
    END IF;
    IF p_dedup_scope IS NOT NULL THEN
        IF p_dedup_lock THEN
            INSERT INTO dedup_lock (exam, scope, commits) VALUES (p_exam, p_dedup_scope, 1)
            ON CONFLICT (exam, scope) DO UPDATE SET commits = dedup_lock.commits + 1;
        END IF;
        -- The client's check saw the scope up to p_max_id at epoch p_epoch: anything stored
        -- since (or a new epoch) and it checks again.
        IF (SELECT index_epoch FROM exam WHERE slug = p_exam) IS DISTINCT FROM p_epoch
           OR EXISTS (SELECT 1 FROM question_sig g WHERE g.exam = p_exam
                        AND (p_dedup_scope = '' OR g.chapter_id = p_chapter)
                        AND g.question_id > p_max_id) THEN
            status := 'stale'; RETURN;
        END IF;
    END IF;
    SELECT c.reserved_usd INTO v_reserved FROM call c
     WHERE c.id = p_call AND c.outcome = 'in_flight' FOR UPDATE;
    IF NOT FOUND THEN
        status := 'settled'; RETURN;
    END IF;
    -- A next call that the budget will have no room for: the general path records none and
    -- says why (NoRoom), after settling dead holders' calls (Ledger._start_planned).
    IF v_budget IS NOT NULL AND p_plan_requested IS NOT NULL AND p_stored + v_kept < target
       AND NOT EXISTS (SELECT 1 FROM exam e WHERE e.slug = p_exam
                          AND (e.spent_usd + p_cost) + (e.reserved_usd - v_reserved)
                              + p_plan_reserve <= e.budget_usd + 1e-12) THEN
        status := 'noroom'; RETURN;
    END IF;
    -- The exam's question ids become visible in id order (StoreBase._questions_in_order).
    PERFORM pg_advisory_xact_lock(1162236208, p_order_key);
    WITH ins AS (
        INSERT INTO question (exam, chapter_id, number, question, choices, answer_index,
                              explanation, norm_hash, difficulty, bloom, source, passage,
                              model, call_id, created_at)
        SELECT p_exam, p_chapter, n, qt, ch, ai, ex, h, d, b, src, pg, p_model, p_call, v_now
          FROM unnest(p_numbers, p_questions, p_choices, p_answers, p_explanations, p_hashes,
                      p_difficulties, p_blooms, p_sources, p_passages)
               AS u(n, qt, ch, ai, ex, h, d, b, src, pg)
        RETURNING id, number)
    SELECT array_agg(ins.id ORDER BY ins.number) INTO ids FROM ins;
    IF p_dedup_scope IS NOT NULL THEN
        INSERT INTO question_sig (question_id, exam, chapter_id, tokens, key_terms, repeats,
                                  bands)
        SELECT i, p_exam, p_chapter, t, k, 0, bd
          FROM unnest(ids, p_tokens, p_key_terms, p_bands) AS u(i, t, k, bd);
        UPDATE question_sig g SET repeats = g.repeats + r.n
          FROM (SELECT x AS id, count(*) AS n FROM unnest(p_repeated) AS x GROUP BY x) r
         WHERE g.question_id = r.id;
    END IF;
    -- The lease again from now (Ledger._commit's "progress"): this statement may have waited
    -- above for the exam's question order, and the row, locked since the fence, is ours.
    UPDATE slice s SET attempts_since_progress = 0, last_error_code = NULL, last_error = NULL,
           lease_expires_at = extract(epoch FROM clock_timestamp()) + p_lease
     WHERE s.exam = p_exam AND s.chapter_id = p_chapter AND s.slice_no = p_slice;
    UPDATE call c SET outcome = 'used', reason = NULL, detail = p_detail, status_code = NULL,
           questions_stored = v_kept, prompt_tokens = p_prompt_tokens,
           completion_tokens = p_completion_tokens, cost_usd = p_cost, endpoint = p_endpoint,
           usage_estimated = p_estimated, cached_tokens = p_cached, service_tier = p_tier,
           finished_at = extract(epoch FROM clock_timestamp())
     WHERE c.id = p_call;
    IF v_budget IS NOT NULL THEN
        -- Ledger._settle: every SET sees the row as it was.
        UPDATE exam e SET reserved_usd = e.reserved_usd - v_reserved,
               spent_usd = e.spent_usd + p_cost,
               state = CASE WHEN e.state = 'active'
                             AND e.spent_usd + p_cost >= e.budget_usd - 1e-12
                            THEN 'paused' ELSE e.state END,
               pause_reason = CASE WHEN e.state = 'active'
                                    AND e.spent_usd + p_cost >= e.budget_usd - 1e-12
                                   THEN p_budget_reason ELSE e.pause_reason END,
               pause_code = CASE WHEN e.state = 'active'
                                  AND e.spent_usd + p_cost >= e.budget_usd - 1e-12
                                 THEN 'budget' ELSE e.pause_code END
         WHERE e.slug = p_exam;
    END IF;
    UPDATE exam e SET auth_failures = 0 WHERE e.slug = p_exam AND e.auth_failures > 0;
    stored := stored + v_kept;
    IF p_recent IS NOT NULL THEN
        SELECT array_agg(r.id ORDER BY r.id DESC), array_agg(r.question ORDER BY r.id DESC)
          INTO newest_ids, newest_texts
          FROM (SELECT q.id, q.question FROM question q
                 WHERE q.exam = p_exam AND q.chapter_id = p_chapter
                 ORDER BY q.id DESC LIMIT p_newest) r;
    END IF;
    IF p_recent = 'steer' THEN
        SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.question ORDER BY r.ord)
          INTO repeated_ids, repeated_texts
          FROM (SELECT q.id, q.question, row_number() OVER (ORDER BY g.repeats DESC, q.id) ord
                  FROM question q JOIN question_sig g ON g.question_id = q.id
                 WHERE g.exam = p_exam AND g.chapter_id = p_chapter AND g.repeats > 0
                 ORDER BY g.repeats DESC, q.id LIMIT p_repeated_n) r;
        IF p_sample IS NOT NULL THEN
            SELECT array_agg(q.id), array_agg(q.question), array_agg(q.number)
              INTO sample_ids, sample_texts, sample_numbers
              FROM question q
             WHERE q.exam = p_exam AND q.chapter_id = p_chapter AND q.number = ANY (p_sample);
        END IF;
    END IF;
    IF stored >= target THEN
        UPDATE slice s SET state = 'done', lease_owner = NULL, lease_expires_at = NULL
         WHERE s.exam = p_exam AND s.chapter_id = p_chapter AND s.slice_no = p_slice;
    ELSIF p_plan_requested IS NOT NULL AND stored = p_plan_stored THEN
        -- Ledger._start_planned: the budget check and the reservation are one conditional
        -- UPDATE; no room, and nothing is recorded (the client's slow path sorts it out).
        v_fits := v_budget IS NULL;
        IF NOT v_fits THEN
            UPDATE exam e SET reserved_usd = e.reserved_usd + p_plan_reserve
             WHERE e.slug = p_exam
               AND e.spent_usd + e.reserved_usd + p_plan_reserve <= e.budget_usd + 1e-12;
            v_fits := FOUND;
        END IF;
        IF v_fits THEN
            INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number, requested,
                              worker, outcome, prompt_tokens, completion_tokens, cached_tokens,
                              cost_usd, questions_stored, started_at, max_tokens,
                              reserved_usd, model, price_known, usage_estimated)
            VALUES (p_exam, p_chapter, p_slice, p_attempt, p_plan_first, p_plan_requested,
                    p_owner, 'in_flight', p_plan_prompt_tokens, 0, 0, 0, 0,
                    extract(epoch FROM clock_timestamp()), p_plan_max_tokens, p_plan_reserve,
                    p_plan_model, p_plan_price_known, false)
            RETURNING id INTO next_call;
        END IF;
    END IF;
    status := 'ok';
END
$$
"""

CLAIM_FUNCTION = r"""
CREATE OR REPLACE FUNCTION ef_claim(
    p_exam varchar, p_chapter varchar, p_slice integer, p_owner varchar,
    p_lease double precision, p_max integer, p_crash_reason varchar, p_crash_detail text,
    p_budget_reason text, p_repeated_n integer,
    OUT status text, OUT attempts integer, OUT attempts_since_progress integer,
    OUT target integer, OUT first_number integer, OUT title text, OUT prompt text,
    OUT difficulty text, OUT bloom text, OUT exam_title text, OUT chapter_target integer,
    OUT index_epoch bigint, OUT took_over integer, OUT ids integer[], OUT numbers integer[],
    OUT texts text[], OUT difficulties varchar[], OUT repeated_ids integer[],
    OUT repeated_texts text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_budget double precision;
    v_now double precision;
    v_sum double precision;
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
              s.prompt, s.difficulty, s.bloom
         INTO attempts, attempts_since_progress, target, first_number, title, prompt,
              difficulty, bloom;
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
    status := 'ok';
END
$$
"""

START_CALL_FUNCTION = r"""
CREATE OR REPLACE FUNCTION ef_start_call(
    p_exam varchar, p_chapter varchar, p_slice integer, p_owner varchar,
    p_lease double precision, p_attempt integer, p_first integer, p_requested integer,
    p_prompt_tokens integer, p_max_tokens integer, p_reserve double precision,
    p_model varchar, p_price_known boolean,
    OUT status text, OUT call_id integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_budget double precision;
    v_now double precision;
BEGIN
    -- Ledger.start_call: the exam row first, the fence (running only), the reservation.
    SELECT e.budget_usd INTO v_budget FROM exam e WHERE e.slug = p_exam FOR KEY SHARE;
    IF v_budget IS NOT NULL THEN
        PERFORM 1 FROM exam e WHERE e.slug = p_exam FOR NO KEY UPDATE;
    END IF;
    v_now := extract(epoch FROM clock_timestamp());
    UPDATE slice s SET lease_expires_at = v_now + p_lease
     WHERE s.exam = p_exam AND s.chapter_id = p_chapter AND s.slice_no = p_slice
       AND s.lease_owner = p_owner AND s.lease_expires_at > v_now AND s.state = 'running';
    IF NOT FOUND THEN
        status := 'lost'; RETURN;
    END IF;
    IF v_budget IS NOT NULL THEN
        UPDATE exam e SET reserved_usd = e.reserved_usd + p_reserve
         WHERE e.slug = p_exam
           AND e.spent_usd + e.reserved_usd + p_reserve <= e.budget_usd + 1e-12;
        IF NOT FOUND THEN
            status := 'noroom'; RETURN;  -- the general path settles the dead and says why
        END IF;
    END IF;
    INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number, requested, worker,
                      outcome, prompt_tokens, completion_tokens, cached_tokens, cost_usd,
                      questions_stored, started_at, max_tokens, reserved_usd, model,
                      price_known, usage_estimated)
    VALUES (p_exam, p_chapter, p_slice, p_attempt, p_first, p_requested, p_owner, 'in_flight',
            p_prompt_tokens, 0, 0, 0, 0, extract(epoch FROM clock_timestamp()), p_max_tokens,
            p_reserve, p_model, p_price_known, false)
    RETURNING id INTO call_id;
    status := 'ok';
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(COMMIT_FUNCTION)
        op.execute(CLAIM_FUNCTION)
        op.execute(START_CALL_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS ef_start_call")
        op.execute("DROP FUNCTION IF EXISTS ef_claim")
        op.execute("DROP FUNCTION IF EXISTS ef_commit")
