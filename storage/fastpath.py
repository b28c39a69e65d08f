"""A paid call's commit in one round trip (PostgreSQL): SQL text for the function `ef_commit`
(migration 0021), prepared once per connection by psycopg, run in autocommit, so that the
one statement is the whole transaction.

The design is optimistic. Everything that needs Python is done before the statement, from
what the holder knows: which questions are near-duplicates (checked against this process's
in-memory band index of the scope, storage.neardup, read-only), their numbers (the holder is
the only writer of its slice's range: it numbers on from the count it last saw), their
balanced choices, signatures and band keys, the steering sample's numbers, and the next
call's plan (built and admitted before, runner.pipeline `_Calls.prepare`). The function
checks, under the same locks as the general path (the exam row of a budgeted exam, the
slice's fence, the near-duplicate scope's `dedup_lock` row, the call's row), that what the
preparation assumed still holds: the lease, the slice's count and target, no question of
the batch already in the chapter (norm_hash), the scope's index epoch and no signature
stored in the scope above the highest question id the check saw. When all hold it writes
everything; when one does not it says which (`status`) and the caller commits through the
general path (storage.ledger `Ledger._commit`), which reads and locks as before. No lock is
held across a round trip to the client: each is taken and released inside the one
statement.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from examforge.balance import balanced
from examforge.errors import Rejection
from examforge.neardup import Checker, Scope
from examforge.output import Question as ParsedQuestion
from storage import neardup
from storage.types import CallPlan, Claimed, Committed, Planner, Steer, Usage

# The parameters of ef_commit, in order, with their SQL types (cast in the text: psycopg
# sends a Python list or None without a type the server could choose a function by).
_PARAMS = (
    ("p_exam", "varchar"), ("p_chapter", "varchar"), ("p_slice", "integer"),
    ("p_owner", "varchar"), ("p_lease", "double precision"), ("p_call", "integer"),
    ("p_first", "integer"), ("p_stored", "integer"), ("p_target", "integer"),
    ("p_numbers", "integer[]"), ("p_questions", "text[]"), ("p_choices", "text[]"),
    ("p_answers", "integer[]"), ("p_explanations", "text[]"), ("p_hashes", "varchar[]"),
    ("p_difficulties", "varchar[]"), ("p_blooms", "varchar[]"), ("p_model", "varchar"),
    ("p_dedup_scope", "varchar"), ("p_dedup_lock", "boolean"), ("p_epoch", "bigint"),
    ("p_max_id", "integer"), ("p_tokens", "text[]"), ("p_key_terms", "text[]"),
    ("p_bands", "bytea[]"), ("p_repeated", "integer[]"),
    ("p_detail", "text"), ("p_prompt_tokens", "integer"), ("p_completion_tokens", "integer"),
    ("p_cost", "double precision"), ("p_endpoint", "varchar"), ("p_estimated", "boolean"),
    ("p_cached", "integer"), ("p_tier", "varchar"), ("p_budget_reason", "text"),
    ("p_recent", "varchar"), ("p_newest", "integer"), ("p_repeated_n", "integer"),
    ("p_sample", "integer[]"), ("p_order_key", "integer"), ("p_plan_stored", "integer"),
    ("p_plan_first", "integer"), ("p_plan_requested", "integer"),
    ("p_plan_prompt_tokens", "integer"), ("p_plan_max_tokens", "integer"),
    ("p_plan_reserve", "double precision"), ("p_plan_model", "varchar"),
    ("p_plan_price_known", "boolean"), ("p_attempt", "integer"),
)
COMMIT_SQL = "SELECT * FROM ef_commit({})".format(
    ", ".join(f"%({name})s::{kind}" for name, kind in _PARAMS))
CLAIM_PARAMS = ("p_exam", "p_chapter", "p_slice", "p_owner", "p_lease", "p_max",
                "p_crash_reason", "p_crash_detail", "p_budget_reason", "p_repeated_n")
CLAIM_SQL = ("SELECT * FROM ef_claim(%(p_exam)s::varchar, %(p_chapter)s::varchar, "
             "%(p_slice)s::integer, %(p_owner)s::varchar, %(p_lease)s::double precision, "
             "%(p_max)s::integer, %(p_crash_reason)s::varchar, %(p_crash_detail)s::text, "
             "%(p_budget_reason)s::text, %(p_repeated_n)s::integer)")
START_CALL_SQL = (
    "SELECT * FROM ef_start_call(%(p_exam)s::varchar, %(p_chapter)s::varchar, "
    "%(p_slice)s::integer, %(p_owner)s::varchar, %(p_lease)s::double precision, "
    "%(p_attempt)s::integer, %(p_first)s::integer, %(p_requested)s::integer, "
    "%(p_prompt_tokens)s::integer, %(p_max_tokens)s::integer, "
    "%(p_reserve)s::double precision, %(p_model)s::varchar, %(p_price_known)s::boolean)")
# The heartbeat (Leases.renew) as one statement: the live leases of the owners whose rows are
# not locked are extended (SKIP LOCKED: a row locked is almost always its holder's commit,
# whose fence extends the lease itself); the owners returned are those renewed or still live
# under a lock, as of the statement's start.
RENEW_SQL = """
WITH now AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS t),
live AS (
    SELECT s.exam, s.chapter_id, s.slice_no FROM slice s, now
     WHERE s.lease_owner = ANY (%(owners)s::varchar[]) AND s.lease_expires_at > now.t
       AND s.state IN ('running', 'cancelled')
       FOR UPDATE OF s SKIP LOCKED),
renewed AS (
    UPDATE slice s SET lease_expires_at = now.t + %(lease)s::double precision
      FROM live, now
     WHERE s.exam = live.exam AND s.chapter_id = live.chapter_id
       AND s.slice_no = live.slice_no
    RETURNING s.lease_owner)
SELECT lease_owner FROM renewed
UNION
SELECT s.lease_owner FROM slice s, now
 WHERE s.lease_owner = ANY (%(owners)s::varchar[]) AND s.lease_expires_at > now.t
   AND s.state IN ('running', 'cancelled')
"""
# Whether a commit whose near-duplicate scope other slices write too (a chapter of several
# slices, or the exam scope) takes this path. The function handles it (it takes the scope's
# `dedup_lock` row inside its one statement, so no lock outlives a round trip), but the
# integration test of two slices racing near-duplicates
# (tests/integration/test_neardup_store.py) holds the general path's transaction open
# between its check and its commit through `neardup.index`, which this path never calls:
# until that test can hold this path too, such commits go the general way.
SHARED_SCOPES = False
# StoreBase._questions_in_order's lock key of an exam, as the function takes it.
_ORDER_KEYS: dict[str, int] = {}
# What the prompts list without steering when other slices write the chapter (ledger).
_RECENT_DEFAULT = 20


def order_key(exam: str) -> int:
    key = _ORDER_KEYS.get(exam)
    if key is None:
        key = _ORDER_KEYS[exam] = int.from_bytes(
            hashlib.blake2b(exam.encode(), digest_size=4).digest(), "big", signed=True)
    return key


class Prepared:
    """What the client prepared for one commit (see the module's docstring)."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.kept: list[tuple[ParsedQuestion, str]] = []
        self.signed_kept: list[neardup.Signed] = []
        self.plan: CallPlan | None = None
        self.max_id = 0
        self.near = 0
        self.surplus = 0
        self.note = ""
        self.scope: Scope | None = None


def prepare(url: str, claim: Claimed, stored: int, target: int, lease_s: float,
            call_id: int, questions: Sequence[ParsedQuestion], hashes: list[str], *,
            model: str, usage: Usage, note: str, plan_next: Planner | None,
            near_dup: Checker | None, signed: Sequence[neardup.Signed] | None,
            steer: Steer | None, budget_reason: str, recent_default: int) -> Prepared | None:
    """The commit's parameters, prepared for the slice at `stored` of `target`; None when
    the general path must commit (the index cannot be trusted, nothing would be kept)."""
    p = Prepared()
    keep = list(range(len(questions)))
    if len(set(hashes)) != len(hashes):
        return None
    repeated: list[int] = []
    epoch: int | None = None
    shared = claim.chapter_target > claim.target
    if near_dup is not None and signed is not None:
        if (shared or near_dup.scope is Scope.exam) and not SHARED_SCOPES:
            return None
        epoch = claim.index_epoch
        checked = neardup.check_local(url, claim.exam, claim.chapter_id, near_dup, epoch,
                                      list(signed))
        if checked is None:
            return None
        verdict, p.max_id = checked
        keep = [i for i, ok in zip(keep, verdict.keep) if ok]
        repeated = list(verdict.repeated)
        p.near = verdict.rejected
        p.scope = near_dup.scope
        if p.near:
            note = ", ".join(filter(None, [note, f"{p.near} {Rejection.near_duplicate.value} rejected"]))
    p.surplus = max(0, len(keep) - max(0, target - stored))
    if p.surplus:
        keep = keep[:len(keep) - p.surplus]
        note = ", ".join(filter(None, [note, f"{p.surplus} beyond the target not stored"]))
    if not keep:
        return None
    p.note = note
    p.kept = [(questions[i], hashes[i]) for i in keep]
    first = claim.first_number
    rows = [balanced(q, claim.exam, claim.chapter_id, first + stored + i)
            for i, (q, _) in enumerate(p.kept)]
    after = stored + len(keep)
    if plan_next is not None and after < target:
        p.plan = plan_next(claim.view(after, target))
    recent: str | None = None
    newest = repeated_n = 0
    sample: list[int] | None = None
    if steer is not None and steer.mode == "recent":
        recent, newest = "newest", steer.avoid
    elif steer is not None:
        limit = steer.avoid
        if limit > 0:
            recent, newest, repeated_n = "steer", max(1, limit // 4), limit // 2
            sample = neardup.sample_numbers((1, claim.chapter_target), limit, call_id)
    elif shared:
        recent, newest = "newest", recent_default
    if near_dup is not None and signed is not None:
        p.signed_kept = [signed[i] for i in keep]
    encoded = [s.sig.encode() for s in p.signed_kept]
    plan = p.plan
    p.params = {
        "p_exam": claim.exam, "p_chapter": claim.chapter_id, "p_slice": claim.slice_no,
        "p_owner": claim.owner, "p_lease": lease_s, "p_call": call_id,
        "p_first": first, "p_stored": stored, "p_target": target,
        "p_numbers": [first + stored + i for i in range(len(rows))],
        "p_questions": [q.question for q in rows],
        "p_choices": [_choices(q) for q in rows],
        "p_answers": [q.answer_index for q in rows],
        "p_explanations": [q.explanation for q in rows],
        "p_hashes": [h for _, h in p.kept],
        "p_difficulties": [q.difficulty for q in rows], "p_blooms": [q.bloom for q in rows],
        "p_model": model,
        "p_dedup_scope": None if p.scope is None else (
            "" if p.scope is Scope.exam else claim.chapter_id),
        "p_dedup_lock": p.scope is not None and (shared or p.scope is Scope.exam),
        "p_epoch": epoch, "p_max_id": p.max_id,
        "p_tokens": [t for t, _ in encoded], "p_key_terms": [k for _, k in encoded],
        "p_bands": [s.blob() for s in p.signed_kept], "p_repeated": repeated,
        "p_detail": note or None, "p_prompt_tokens": usage.prompt_tokens,
        "p_completion_tokens": usage.completion_tokens, "p_cost": usage.cost_usd,
        "p_endpoint": usage.endpoint, "p_estimated": usage.estimated,
        "p_cached": usage.cached_tokens, "p_tier": usage.service_tier,
        "p_budget_reason": budget_reason,
        "p_recent": recent, "p_newest": newest, "p_repeated_n": repeated_n,
        "p_sample": sample, "p_order_key": order_key(claim.exam),
        "p_plan_stored": after, "p_plan_first": None if plan is None else plan.first_number,
        "p_plan_requested": None if plan is None else plan.requested,
        "p_plan_prompt_tokens": None if plan is None else plan.prompt_tokens,
        "p_plan_max_tokens": None if plan is None else plan.max_tokens,
        "p_plan_reserve": None if plan is None else plan.reserve_usd,
        "p_plan_model": None if plan is None else plan.model,
        "p_plan_price_known": None if plan is None else plan.price_known,
        "p_attempt": claim.attempt,
    }
    return p


def _choices(q: ParsedQuestion) -> str:
    import json

    return json.dumps(list(q.choices), ensure_ascii=False)


def committed(url: str, claim: Claimed, p: Prepared, row: Any, questions_n: int,
              steer: Steer | None, call_id: int) -> Committed:
    """The result of an `ok` commit, and the process's index brought up to it."""
    ids = list(row.ids or ())
    texts = [q.question for q, _ in p.kept]
    if p.scope is not None and row.stored < row.target:
        # (A slice now done commits no more: its index would not be read again.)
        neardup.add_own(url, claim.exam, claim.chapter_id, p.scope, claim.index_epoch,
                        p.max_id, ids, p.signed_kept, texts)
    newest = list(zip(row.newest_ids or (), row.newest_texts or ()))
    recent: tuple[str, ...] = ()
    if p.params["p_recent"] == "newest":
        recent = tuple(t for _, t in reversed(newest))
    elif p.params["p_recent"] == "steer":
        assert steer is not None
        recent = neardup.steering_of(
            steer.avoid, (1, claim.chapter_target), call_id,
            list(zip(row.repeated_ids or (), row.repeated_texts or ())), newest,
            list(zip(row.sample_ids or (), row.sample_texts or (), row.sample_numbers or ())))
    return Committed(stored=row.stored, target=row.target,
                     duplicates=questions_n - len(p.kept) - p.surplus, recent=recent,
                     kept=tuple(texts), near_duplicates=p.near, surplus=p.surplus,
                     next_call=row.next_call)


def claim_steering(steer: Steer, chapter_target: int, seed: int, ids: list[int],
                   numbers: list[int], texts: list[str],
                   repeated: list[tuple[int, str]]) -> tuple[str, ...]:
    """What the first prompt lists (storage.neardup `steered`), from the rows the claim read:
    every question of the chapter in id order, and the most repeated ones."""
    if steer.mode == "recent":
        return tuple(texts[-steer.avoid:]) if steer.avoid > 0 else ()
    limit = steer.avoid
    if limit <= 0:
        return neardup.Steering()
    rows = list(zip(ids, texts))
    newest = list(reversed(rows[-max(1, limit // 4):]))
    wanted = set(neardup.sample_numbers((1, chapter_target), limit, seed))
    sampled = [(i, t, n) for i, t, n in zip(ids, texts, numbers) if n in wanted]
    return neardup.steering_of(limit, (1, chapter_target), seed, repeated, newest, sampled)


# SQLite: the same steps as the functions, as a few SQL texts run in the caller's one write
# transaction (BEGIN IMMEDIATE: the writers are serialised, so the checks need no lock).
# sqlite3 prepares each text once per connection (its statement cache).
_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
_INSERTS: dict[int, str] = {}
_QUESTION_COLUMNS = ("exam, chapter_id, number, question, choices, answer_index, explanation, "
                     "norm_hash, difficulty, bloom, model, call_id, created_at")


def _insert_questions(n: int) -> str:
    sql = _INSERTS.get(n)
    if sql is None:
        sql = _INSERTS[n] = (f"INSERT INTO question ({_QUESTION_COLUMNS}) VALUES "
                             + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * n)
                             + " RETURNING id, number")
    return sql


def sqlite_commit(conn: Any, p: dict[str, Any]) -> Any:
    """ef_commit (migration 0021) on SQLite, in the caller's write transaction: the same
    checks, statuses and writes."""
    from types import SimpleNamespace

    x = conn.exec_driver_sql
    out = SimpleNamespace(status="", stored=0, target=0, ids=None, next_call=None,
                          newest_ids=None, newest_texts=None, repeated_ids=None,
                          repeated_texts=None, sample_ids=None, sample_texts=None,
                          sample_numbers=None)
    exam, chapter, slice_no = p["p_exam"], p["p_chapter"], p["p_slice"]
    budget, epoch = x("SELECT budget_usd, index_epoch FROM exam WHERE slug = ?",
                      (exam,)).one()
    held = x(f"UPDATE slice SET lease_expires_at = {_NOW} + ?, updated_at = {_NOW} "
             "WHERE exam = ? AND chapter_id = ? AND slice_no = ? AND lease_owner = ? "
             f"AND lease_expires_at > {_NOW} AND state IN ('running', 'cancelled') "
             "RETURNING target, first_number, state, updated_at",
             (p["p_lease"], exam, chapter, slice_no, p["p_owner"])).first()
    if held is None:
        out.status = "lost"
        return out
    out.target, first, state, now = held
    out.stored = x("SELECT count(*) FROM question WHERE exam = ? AND chapter_id = ? "
                   "AND number >= ? AND number < ? + ?",
                   (exam, chapter, first, first, out.target)).scalar_one()
    kept = len(p["p_numbers"])
    if (state != "running" or first != p["p_first"] or out.stored != p["p_stored"]
            or out.target != p["p_target"] or kept == 0 or kept > out.target - out.stored):
        out.status = "changed"
        return out
    import json

    if x("SELECT 1 FROM question WHERE exam = ? AND chapter_id = ? AND norm_hash IN "
         "(SELECT value FROM json_each(?)) LIMIT 1",
         (exam, chapter, json.dumps(p["p_hashes"]))).first() is not None:
        out.status = "duplicate"
        return out
    scope = p["p_dedup_scope"]
    if scope is not None and (epoch != p["p_epoch"] or x(
            "SELECT 1 FROM question_sig WHERE exam = ? AND (? = '' OR chapter_id = ?) "
            "AND question_id > ? LIMIT 1", (exam, scope, chapter, p["p_max_id"])
    ).first() is not None):
        out.status = "stale"
        return out
    reserved = x("SELECT reserved_usd FROM call WHERE id = ? AND outcome = 'in_flight'",
                 (p["p_call"],)).scalar_one_or_none()
    if reserved is None:
        out.status = "settled"
        return out
    cost = p["p_cost"]
    planned = p["p_plan_requested"] is not None and out.stored + kept < out.target
    if budget is not None and planned and not x(
            "SELECT (spent_usd + ?) + (reserved_usd - ?) + ? <= budget_usd + 1e-12 FROM exam "
            "WHERE slug = ?", (cost, reserved, p["p_plan_reserve"], exam)).scalar_one():
        out.status = "noroom"
        return out
    values: list[Any] = []
    for row in zip(p["p_numbers"], p["p_questions"], p["p_choices"], p["p_answers"],
                   p["p_explanations"], p["p_hashes"], p["p_difficulties"], p["p_blooms"]):
        values += [exam, chapter, *row, p["p_model"], p["p_call"], now]
    by_number = dict((n, i) for i, n in x(_insert_questions(kept), tuple(values)).all())
    out.ids = [by_number[n] for n in p["p_numbers"]]
    if scope is not None:
        x("INSERT INTO question_sig (question_id, exam, chapter_id, tokens, key_terms, "
          "repeats, bands) VALUES (?, ?, ?, ?, ?, 0, ?)",
          [(i, exam, chapter, t, k, b) for i, t, k, b in zip(
              out.ids, p["p_tokens"], p["p_key_terms"], p["p_bands"])])
        for qid in p["p_repeated"]:
            x("UPDATE question_sig SET repeats = repeats + 1 WHERE question_id = ?", (qid,))
    key = (exam, chapter, slice_no)
    x("UPDATE slice SET attempts_since_progress = 0, last_error = NULL "
      "WHERE exam = ? AND chapter_id = ? AND slice_no = ?", key)
    x("UPDATE call SET outcome = 'used', reason = NULL, detail = ?, status_code = NULL, "
      "questions_stored = ?, prompt_tokens = ?, completion_tokens = ?, cost_usd = ?, "
      "endpoint = ?, usage_estimated = ?, cached_tokens = ?, service_tier = ?, "
      f"finished_at = {_NOW} WHERE id = ?",
      (p["p_detail"], kept, p["p_prompt_tokens"], p["p_completion_tokens"], cost,
       p["p_endpoint"], p["p_estimated"], p["p_cached"], p["p_tier"], p["p_call"]))
    if budget is not None:
        _sqlite_settle(x, exam, reserved, cost, p["p_budget_reason"])
    x("UPDATE exam SET auth_failures = 0 WHERE slug = ? AND auth_failures > 0", (exam,))
    out.stored += kept
    if p["p_recent"] is not None:
        rows = x("SELECT id, question FROM question WHERE exam = ? AND chapter_id = ? "
                 "ORDER BY id DESC LIMIT ?", (exam, chapter, p["p_newest"])).all()
        out.newest_ids, out.newest_texts = [r[0] for r in rows], [r[1] for r in rows]
    if p["p_recent"] == "steer":
        rows = _sqlite_repeated(x, exam, chapter, p["p_repeated_n"])
        out.repeated_ids, out.repeated_texts = [r[0] for r in rows], [r[1] for r in rows]
        if p["p_sample"] is not None:
            rows = x("SELECT id, question, number FROM question WHERE exam = ? "
                     "AND chapter_id = ? AND number IN (SELECT value FROM json_each(?))",
                     (exam, chapter, json.dumps(p["p_sample"]))).all()
            out.sample_ids = [r[0] for r in rows]
            out.sample_texts = [r[1] for r in rows]
            out.sample_numbers = [r[2] for r in rows]
    if out.stored >= out.target:
        x("UPDATE slice SET state = 'done', lease_owner = NULL, lease_expires_at = NULL "
          "WHERE exam = ? AND chapter_id = ? AND slice_no = ?", key)
    elif planned and out.stored == p["p_plan_stored"]:
        out.next_call = _sqlite_record(
            x, budget, exam, chapter, slice_no, p["p_owner"], p["p_attempt"],
            p["p_plan_first"], p["p_plan_requested"], p["p_plan_prompt_tokens"],
            p["p_plan_max_tokens"], p["p_plan_reserve"], p["p_plan_model"],
            p["p_plan_price_known"])
    out.status = "ok"
    return out


def _sqlite_settle(x: Any, exam: str, reserved: float, cost: float, reason: str) -> None:
    over = "(state = 'active' AND spent_usd + ? >= budget_usd - 1e-12)"
    x(f"UPDATE exam SET reserved_usd = reserved_usd - ?, spent_usd = spent_usd + ?, "
      f"state = CASE WHEN {over} THEN 'paused' ELSE state END, "
      f"pause_reason = CASE WHEN {over} THEN ? ELSE pause_reason END, "
      f"pause_code = CASE WHEN {over} THEN 'budget' ELSE pause_code END WHERE slug = ?",
      (reserved, cost, cost, cost, reason, cost, exam))


def _sqlite_repeated(x: Any, exam: str, chapter: str, n: int) -> list[Any]:
    return list(x("SELECT q.id, q.question FROM question q JOIN question_sig g "
                  "ON g.question_id = q.id WHERE g.exam = ? AND g.chapter_id = ? "
                  "AND g.repeats > 0 ORDER BY g.repeats DESC, q.id LIMIT ?",
                  (exam, chapter, n)).all())


def _sqlite_record(x: Any, budget: float | None, exam: str, chapter: str, slice_no: int,
                   owner: str, attempt: int, first: int, requested: int, prompt_tokens: int,
                   max_tokens: int | None, reserve: float, model: str | None,
                   price_known: bool) -> int | None:
    """Ledger._start_planned's reservation and record; None when the budget has no room."""
    if budget is not None and x(
            "UPDATE exam SET reserved_usd = reserved_usd + ? WHERE slug = ? "
            "AND spent_usd + reserved_usd + ? <= budget_usd + 1e-12",
            (reserve, exam, reserve)).rowcount != 1:
        return None
    return int(x(
        "INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number, requested, "
        "worker, outcome, prompt_tokens, completion_tokens, cached_tokens, cost_usd, "
        "questions_stored, started_at, max_tokens, reserved_usd, model, price_known, "
        f"usage_estimated) VALUES (?, ?, ?, ?, ?, ?, ?, 'in_flight', ?, 0, 0, 0, 0, {_NOW}, "
        "?, ?, ?, ?, 0) RETURNING id",
        (exam, chapter, slice_no, attempt, first, requested, owner, prompt_tokens,
         max_tokens, reserve, model, price_known)).scalar_one())


def sqlite_claim(conn: Any, exam: str, chapter: str, slice_no: int, owner: str,
                 lease_s: float, max_attempts: int, crash_reason: str, crash_detail: str,
                 budget_reason: str, repeated_n: int | None) -> Any:
    """ef_claim (migration 0021) on SQLite, in the caller's write transaction."""
    from types import SimpleNamespace

    x = conn.exec_driver_sql
    row = x(f"UPDATE slice SET lease_owner = ?, lease_expires_at = {_NOW} + ?, "
            "state = 'running', attempts = attempts + 1, "
            "attempts_since_progress = attempts_since_progress + 1, not_before_at = NULL, "
            f"picked_at = {_NOW}, updated_at = {_NOW} "
            "WHERE exam = ? AND chapter_id = ? AND slice_no = ? "
            "AND (state = 'pending' OR state = 'running') "
            f"AND (lease_owner IS NULL OR lease_expires_at <= {_NOW}) "
            f"AND (not_before_at IS NULL OR not_before_at <= {_NOW}) "
            "AND attempts_since_progress < ? "
            "AND EXISTS (SELECT 1 FROM exam WHERE slug = ? AND state = 'active') "
            "RETURNING attempts, attempts_since_progress, target, first_number, title, prompt, "
            "difficulty, bloom",
            (owner, lease_s, exam, chapter, slice_no, max_attempts, exam)).first()
    if row is None:
        return SimpleNamespace(status="not")
    out = SimpleNamespace(status="ok", **row._asdict())
    wasted = x(f"UPDATE call SET outcome = 'wasted', finished_at = {_NOW}, reason = ?, "
               "detail = ?, completion_tokens = coalesce(max_tokens, 0), "
               "cost_usd = reserved_usd, usage_estimated = 1 "
               "WHERE exam = ? AND chapter_id = ? AND slice_no = ? AND outcome = 'in_flight' "
               "RETURNING reserved_usd",
               (crash_reason, crash_detail, exam, chapter, slice_no)).scalars().all()
    out.took_over = len(wasted)
    out.exam_title, out.index_epoch, budget = x(
        "SELECT title, index_epoch, budget_usd FROM exam WHERE slug = ?", (exam,)).one()
    if wasted and budget is not None:
        _sqlite_settle(x, exam, sum(wasted), sum(wasted), budget_reason)
    out.chapter_target = x("SELECT max(first_number + target - 1) FROM slice "
                           "WHERE exam = ? AND chapter_id = ?", (exam, chapter)).scalar_one()
    rows = x("SELECT id, number, question, difficulty FROM question "
             "WHERE exam = ? AND chapter_id = ? ORDER BY id", (exam, chapter)).all()
    out.ids = [r[0] for r in rows]
    out.numbers = [r[1] for r in rows]
    out.texts = [r[2] for r in rows]
    out.difficulties = [r[3] for r in rows]
    out.repeated_ids = out.repeated_texts = None
    if repeated_n is not None and rows:
        repeated = _sqlite_repeated(x, exam, chapter, repeated_n)
        out.repeated_ids = [r[0] for r in repeated]
        out.repeated_texts = [r[1] for r in repeated]
    out.budget = budget
    return out


def sqlite_record(conn: Any, claim: Claimed, budget: float | None,
                  plan: CallPlan) -> int | None:
    """The first call's record in the claim's transaction (SQLite); None: no room."""
    return _sqlite_record(conn.exec_driver_sql, budget, claim.exam, claim.chapter_id,
                          claim.slice_no, claim.owner, claim.attempt, plan.first_number,
                          plan.requested, plan.prompt_tokens, plan.max_tokens,
                          plan.reserve_usd, plan.model, plan.price_known)
