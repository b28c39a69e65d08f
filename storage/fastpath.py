"""A paid call's commit in one round trip (PostgreSQL): SQL text for the function `ef_commit`
(migration 0025), prepared once per connection by psycopg, run in autocommit, so that the
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
from storage.base import BUDGET_SPENT_REASON
from storage.types import CallPlan, Claimed, Committed, Planner, Steer, Usage

# The parameters of ef_commit, in order, with their SQL types (cast in the text: psycopg
# sends a Python list or None without a type the server could choose a function by).
_PARAMS = (
    ("p_exam", "varchar"), ("p_chapter", "varchar"), ("p_slice", "integer"),
    ("p_owner", "varchar"), ("p_lease", "double precision"), ("p_call", "integer"),
    ("p_first", "integer"), ("p_stored", "integer"), ("p_target", "integer"),
    ("p_numbers", "integer[]"), ("p_questions", "text[]"), ("p_choices", "text[]"),
    ("p_answers", "integer[]"), ("p_explanations", "text[]"), ("p_hashes", "varchar[]"),
    ("p_difficulties", "varchar[]"), ("p_blooms", "varchar[]"), ("p_sources", "text[]"),
    ("p_passages", "integer[]"), ("p_model", "varchar"),
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
# What every commit passes the same, as a literal in the text: psycopg caches a query's
# parsing (placeholders) only for at most 50 parameters, and parsed this one's 51 again at
# every commit (4% of a PostgreSQL worker's GIL samples, py-spy).
_LITERALS = {"p_budget_reason": BUDGET_SPENT_REASON}
COMMIT_SQL = "SELECT * FROM ef_commit({})".format(", ".join(
    "'{}'::{}".format(_LITERALS[name].replace("'", "''").replace("%", "%%"), kind)
    if name in _LITERALS else f"%({name})s::{kind}" for name, kind in _PARAMS))
CLAIM_PARAMS = ("p_exam", "p_chapter", "p_slice", "p_owner", "p_lease", "p_max",
                "p_crash_reason", "p_crash_detail", "p_budget_reason", "p_repeated_n",
                "p_spec_fp", "p_first", "p_requested", "p_prompt_tokens", "p_max_tokens",
                "p_reserve", "p_model", "p_price_known")
# (migration 0026: with a first call planned before the claim, see Leases.fresh_view; 0031:
# the slice's language, and the fingerprint counts it.)
CLAIM_SQL = ("SELECT * FROM ef_claim(%(p_exam)s::varchar, %(p_chapter)s::varchar, "
             "%(p_slice)s::integer, %(p_owner)s::varchar, %(p_lease)s::double precision, "
             "%(p_max)s::integer, %(p_crash_reason)s::varchar, %(p_crash_detail)s::text, "
             "%(p_budget_reason)s::text, %(p_repeated_n)s::integer, %(p_spec_fp)s::text, "
             "%(p_first)s::integer, %(p_requested)s::integer, %(p_prompt_tokens)s::integer, "
             "%(p_max_tokens)s::integer, %(p_reserve)s::double precision, "
             "%(p_model)s::varchar, %(p_price_known)s::boolean)")
# The open slices of an exam as a worker plans their first call before claiming them
# (Leases.fresh_view), one text for both databases: on PostgreSQL with the fingerprint
# ef_claim checks that plan against (ef_spec_fp), in psycopg's parameter style; on SQLite in
# SQLAlchemy's, without it (storage.leases.spec_fingerprint computes it in Python).
_FRESH = """
SELECT s.chapter_id, s.slice_no, s.target, s.first_number, s.title, s.prompt, s.difficulty,
       s.bloom, s.language, s.types, c.chapter_target, e.title AS exam_title,
       s.sources IS NOT NULL AS sourced{fingerprint}
  FROM slice s
  JOIN exam e ON e.slug = s.exam
  JOIN (SELECT o.chapter_id, max(o.first_number + o.target - 1) AS chapter_target
          FROM slice o WHERE o.exam = {exam} GROUP BY o.chapter_id) c
    ON c.chapter_id = s.chapter_id
 WHERE s.exam = {exam} AND s.state IN ('pending', 'running')
 LIMIT {limit}
"""
FRESH_SQL = _FRESH.format(fingerprint=""",
       ef_spec_fp(e.title, s.title, s.prompt, s.target, s.first_number, c.chapter_target,
                  CASE WHEN s.types IS NULL THEN s.difficulty
                       ELSE concat(s.difficulty, chr(29), s.types) END,
                  s.bloom, s.language) AS fp""", exam="%(exam)s", limit="%(limit)s")
FRESH_SQLITE_SQL = _FRESH.format(fingerprint="", exam=":exam", limit=":limit")
START_CALL_SQL = (
    "SELECT * FROM ef_start_call(%(p_exam)s::varchar, %(p_chapter)s::varchar, "
    "%(p_slice)s::integer, %(p_owner)s::varchar, %(p_lease)s::double precision, "
    "%(p_attempt)s::integer, %(p_first)s::integer, %(p_requested)s::integer, "
    "%(p_prompt_tokens)s::integer, %(p_max_tokens)s::integer, "
    "%(p_reserve)s::double precision, %(p_model)s::varchar, %(p_price_known)s::boolean)")
# The heartbeat (Leases.renew) as one statement: the live leases of the owners whose rows are
# not locked are extended (SKIP LOCKED, never waiting); the owners returned are those renewed,
# and those whose row someone has locked, whatever its timestamp says: a locked row is almost
# always its holder's commit, waiting behind another commit of the exam with its lease
# extended at its fence, and nobody can take it from it meanwhile.
RENEW_SQL = """
WITH now AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS t),
mine AS (
    SELECT s.exam, s.chapter_id, s.slice_no, s.lease_owner FROM slice s
     WHERE s.lease_owner = ANY (%(owners)s::varchar[]) AND s.state IN ('running', 'cancelled')),
free AS (
    SELECT s.exam, s.chapter_id, s.slice_no, s.lease_owner, s.lease_expires_at > now.t AS live
      FROM slice s, now
     WHERE s.lease_owner = ANY (%(owners)s::varchar[]) AND s.state IN ('running', 'cancelled')
       FOR UPDATE OF s SKIP LOCKED),
renewed AS (
    UPDATE slice s SET lease_expires_at = now.t + %(lease)s::double precision
      FROM free, now
     WHERE free.live AND s.exam = free.exam AND s.chapter_id = free.chapter_id
       AND s.slice_no = free.slice_no
    RETURNING s.lease_owner)
SELECT lease_owner FROM renewed
UNION
SELECT m.lease_owner FROM mine m
 WHERE NOT EXISTS (SELECT 1 FROM free f WHERE f.exam = m.exam AND f.chapter_id = m.chapter_id
                     AND f.slice_no = m.slice_no)
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
            steer: Steer | None, recent_default: int) -> Prepared | None:
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
        "p_numbers": _int_array([first + stored + i for i in range(len(rows))]),
        "p_questions": _text_array([q.question for q in rows]),
        "p_choices": _text_array([_choices(q) for q in rows]),
        "p_answers": _int_array([q.answer_index for q in rows]),
        "p_explanations": _text_array([q.explanation for q in rows]),
        "p_hashes": _text_array([h for _, h in p.kept]),
        "p_difficulties": _text_array([q.difficulty for q in rows]),
        "p_blooms": _text_array([q.bloom for q in rows]),
        # The course material each cites (storage.ledger.question_row's rule).
        "p_sources": _text_array([q.source if q.passage is not None else None for q in rows]),
        "p_passages": _int_array([q.passage for q in rows]),
        "p_model": model,
        "p_dedup_scope": None if p.scope is None else (
            "" if p.scope is Scope.exam else claim.chapter_id),
        "p_dedup_lock": p.scope is not None and (shared or p.scope is Scope.exam),
        "p_epoch": epoch, "p_max_id": p.max_id,
        "p_tokens": _text_array([t for t, _ in encoded]),
        "p_key_terms": _text_array([k for _, k in encoded]),
        "p_bands": _bytea_array([s.blob() for s in p.signed_kept]),
        "p_repeated": _int_array(repeated),
        "p_detail": note or None, "p_prompt_tokens": usage.prompt_tokens,
        "p_completion_tokens": usage.completion_tokens, "p_cost": usage.cost_usd,
        "p_endpoint": usage.endpoint, "p_estimated": usage.estimated,
        "p_cached": usage.cached_tokens, "p_tier": usage.service_tier,
        "p_recent": recent, "p_newest": newest, "p_repeated_n": repeated_n,
        "p_sample": _int_array(sample), "p_order_key": order_key(claim.exam),
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


# The commit's arrays as PostgreSQL array literals in one text parameter each, cast in the
# statement (`::text[]`): psycopg dumps a Python list element by element in Python
# (ListDumper, 4% of a PostgreSQL worker's GIL samples, with its query conversion 11%),
# and a string at once; the server parses the literal. By hand because psycopg has no
# faster list dumper; the escaping is the array literal's own: inside double quotes, a
# backslash and a double quote take a backslash; NULL unquoted.
def _text_array(items: Sequence[str | None]) -> str:
    return "{" + ",".join(
        "NULL" if x is None else '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for x in items) + "}"


def _int_array(items: Sequence[int | None] | None) -> str | None:
    if items is None:
        return None
    return "{" + ",".join("NULL" if x is None else str(int(x)) for x in items) + "}"


def _bytea_array(items: Sequence[bytes]) -> str:
    return "{" + ",".join('"\\\\x' + x.hex() + '"' for x in items) + "}"


def _choices(q: ParsedQuestion) -> str:
    """A question's p_choices element: its choices as JSON; for an item of another type than
    mcq, its type and answer before them, each followed by a unit separator (0x1f, which
    JSON escapes, so it is never part of one), which ef_commit splits (migration 0033): one
    parameter more would take the statement past the 50 placeholders psycopg caches."""
    import json

    choices = json.dumps(list(q.choices), ensure_ascii=False)
    if q.type == "mcq":
        return choices
    return f"{q.type}\x1f{q.answer or ''}\x1f{choices}"


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

