"""Leases: who may work on a chapter, and until when (on the database's clock). Claims are
conditional UPDATEs, so two workers can never both win; one heartbeat renews a process's
leases in one statement; a lost lease is noticed before the next call and at the commit."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Any, Sequence

from sqlalchemy import and_, bindparam, case, func, or_, select, tuple_, update
from sqlalchemy.engine import Connection, Engine

from examforge import item_types
from examforge.errors import LeaseLost, PauseCode, SliceReason
from examforge.languages import DEFAULT_LANGUAGE
from examforge.output import normalise
from examforge.sources import Passage
from storage import fastpath, neardup
from storage.grounding import read_passages
from storage.base import (ACTIVE_STATES, BUDGET_SPENT_REASON, HELD_STATES, IN_FLIGHT_CALL,
                          SLICE_KEY, E, K, Q, S, capped_detail, lease_fence, slice_where)
from storage.ledger import CRASH_DETAIL, RECENT_QUESTIONS, Ledger, once
from storage.types import (CallPlan, ChapterLevels, ChapterView, Claimed, FirstCall, NoRoom,
                           NotClaimed, NotClaimedReason, Planner, Steer, count_types)
from storage.models import CallReason, ChapterState, ExamState, VerifyPolicy


S2 = S.alias("other_slice")
# Leases.fresh_view: the most open slices of an exam read at once, and how soon a slice not
# among them makes a new read.
FRESH_MAX_SLICES = 20_000
FRESH_REREAD_S = 5.0
# A view not read again for this long is dropped at the next read of any exam's, so a worker
# that serves exam after exam for months keeps only the recent ones' (an active exam's view
# is then read again: one statement every FRESH_FORGET_S).
FRESH_FORGET_S = 300.0
# A claim stamps its lease again at its end when reading the slice and planning the first call
# took more than this fraction of the lease (Leases._claim).
RESTAMP_AFTER = 0.02


def _claim_reads(of_exam: Any) -> list[Any]:
    """What a claim reads beside the slice's row (Leases._claimed_row, and the SQLite claim's
    RETURNING): its exam's fields, each as `of_exam` gives it, and the chapter's target over
    all its slices."""
    return [of_exam(E.c.title).label("exam_title"),
            of_exam(E.c.index_epoch).label("index_epoch"),
            of_exam(E.c.verify).label("exam_verify"),
            of_exam(E.c.budget_usd).label("budget_usd"),
            select(func.max(S2.c.first_number + S2.c.target - 1))
            .where(S2.c.exam == bindparam("k_exam"), S2.c.chapter_id == bindparam("k_chapter"))
            .scalar_subquery().label("chapter_target")]


def spec_fingerprint(view: ChapterView) -> str:
    """What a first call is planned from, of a slice with nothing stored in its chapter (SQLite;
    PostgreSQL's is `ef_spec_fp`): the exam's and the slice's titles, its prompt, its range,
    the chapter's size, its levels and item types, and its language."""
    levels = view.levels
    spec = (view.exam_title, view.title, view.prompt, view.target, view.first_number,
            view.chapter_target, levels.difficulty, levels.bloom, levels.types, view.language)
    return hashlib.blake2b(repr(spec).encode(), digest_size=16).hexdigest()


def _as_planned(claimed: Claimed, view: ChapterView, first: FirstCall) -> bool:
    """Whether `first` was planned for the slice as the claim found it (SQLite): nothing
    stored in the chapter, no course material, and the same spec (what ef_claim checks), and
    is still wanted (the worker did not start stopping since it was planned)."""
    return (not claimed.known and not claimed.passages and claimed.stored == 0
            and spec_fingerprint(view) == first.fingerprint and _wanted(first))


def _wanted(first: FirstCall) -> bool:
    return first.wanted is None or first.wanted()


def _solves_first(claimed: Claimed) -> bool:
    """Whether the holder's blind solves may come before its first call: under a verifying
    policy, a slice with questions in its range may have verdicts pending (a dead holder's),
    which are solved first; a call recorded now would wait, unsent, behind them. (A slice
    with nothing stored has none: its first call is planned in the claim, as under `off`.)"""
    return claimed.verify != VerifyPolicy.off.value and claimed.stored > 0


class Leases(Ledger):
    """Claim, renew, release and fail chapters."""

    def mark_picked(self, slug: str, chapter_id: str, slice_no: int = 0) -> None:
        """A worker received this slice's message. `claim` notes it itself, in its own
        transaction; this is for tests that play a worker dying before it claims."""
        with self._write() as conn:
            conn.execute(update(S).where(*slice_where(slug, chapter_id, slice_no))
                         .values(picked_at=self._now))

    def fresh_view(self, slug: str, chapter_id: str, slice_no: int = 0
                   ) -> tuple[ChapterView, str] | None:
        """What the slice's first call would be planned from if the claim finds nothing
        stored in its chapter, and the fingerprint of that spec; None for a slice this
        process does not know (with sources, finished, or new since its last read).

        PostgreSQL: a one-call chapter took a round trip for the claim and one more to record
        its call, planned from what the claim read. With this view the call is planned
        before the claim and recorded by ef_claim in the claim's own statement, when the
        slice is as the view says (migration 0026). SQLite: the call was planned inside the
        claim's write transaction, its prompt, token count and the rate limiter's Redis round
        trip holding the one writer; planned before, the claim records it when the slice is
        as the view says (`_as_planned`). The open slices of an exam are read once per
        process, and again at most every FRESH_REREAD_S for a slice not among them: a stale
        view costs only the planning it was meant to move."""
        if not self._fast_commit and self._raw is None:
            return None
        now = time.monotonic()
        with self._fresh_lock:
            known = self._fresh.get(slug)
            if known is None or ((chapter_id, slice_no) not in known[1]
                                 and now - known[0] >= FRESH_REREAD_S):
                for stale in [s for s, (at, _) in self._fresh.items()
                              if now - at >= FRESH_FORGET_S]:
                    del self._fresh[stale]
                known = self._fresh[slug] = (now, self._read_fresh(slug))
            found = known[1].get((chapter_id, slice_no))
            if found is not None and not found[1]:  # SQLite's, computed once a slice
                found = known[1][(chapter_id, slice_no)] = (found[0],
                                                            spec_fingerprint(found[0]))
            return found

    def _read_fresh(self, slug: str) -> dict[tuple[str, int], tuple[ChapterView, str] | None]:
        """The exam's open slices; None for one with sources (its first prompt carries the
        material the claim reads), known so that its claims do not read again."""
        params = {"exam": slug, "limit": FRESH_MAX_SLICES}
        rows: Sequence[Any]
        if self._fast_commit:
            rows = self._auto(self.engine, fastpath.FRESH_SQL, params).all()
        else:
            with self._read() as conn:
                rows = conn.exec_driver_sql(fastpath.FRESH_SQLITE_SQL, params).all()
        views: dict[tuple[str, int], tuple[ChapterView, str] | None] = {}
        for r in rows:
            if r.sourced:
                views[(r.chapter_id, r.slice_no)] = None
                continue
            view = ChapterView(
                slug, r.chapter_id, r.exam_title, r.title, r.prompt, 0, r.target, r.slice_no,
                r.first_number, r.chapter_target or r.target, (),
                ChapterLevels.from_row(r.difficulty, r.bloom, r.types),
                language=r.language if self._fast_commit else r.language or DEFAULT_LANGUAGE)
            # SQLite's fingerprint is computed when the view is asked for (`fresh_view`).
            views[(r.chapter_id, r.slice_no)] = (view, r.fp if self._fast_commit else "")
        return views

    def claim(self, slug: str, chapter_id: str, owner: str, lease_s: float,
              max_attempts: int, *, slice_no: int = 0,
              plan_first: Planner | None = None,
              steer: Steer | None = None,
              first: FirstCall | None = None) -> Claimed | NotClaimed:
        """Take the slice's lease if nobody holds a live one and it still needs work, and
        note that a worker received its message (picked_at: the reconciler's evidence of
        delivery), in one transaction. With `plan_first`, the first call is recorded in the
        same transaction too (see Ledger.start_planned). With `steer`, `recent` is what the
        first prompt lists of the chapter's questions (Steer.select). `first`: a first call
        planned before the claim from `fresh_view` (PostgreSQL), recorded by the claim's
        statement if the slice is as planned; if not, `plan_first` plans from what the claim
        read (and must let go of what `first` planned)."""
        if self._fast_commit:
            fast = self._claim_fast(slug, chapter_id, owner, lease_s, max_attempts,
                                    slice_no=slice_no, plan_first=plan_first, steer=steer,
                                    first=first)
            if fast is not None:
                return fast
        key = {"k_exam": slug, "k_chapter": chapter_id, "k_slice": slice_no}
        # In the process's group commit (storage.group), which may run it again after a
        # rollback: the first call is planned once (planning admits it at the rate limiter).
        planned_once = once(plan_first)
        # SQLite: a first call planned before the claim (fresh_view) is recorded by the claim
        # if the slice is as planned; PostgreSQL's general path, reached when its one-statement
        # claim was not won or did not fit, plans again from what it read. Once planned
        # again (which lets go of `first`), a run again of the claim never takes `first`.
        planned: list[FirstCall | None] = [first if self._raw is not None else None]

        def plan_again(view: ChapterView) -> CallPlan | None:
            planned[0] = None
            assert planned_once is not None
            return planned_once(view)

        def claim(conn: Connection) -> Claimed | NotClaimed:
            return self._claim(conn, key, slug, chapter_id, owner, lease_s, max_attempts,
                               slice_no, None if planned_once is None else plan_again, steer,
                               planned[0])
        return self.group.run((slug, chapter_id, slice_no), claim, kind="claim")

    def _claim(self, conn: Connection, key: dict[str, Any], slug: str, chapter_id: str,
               owner: str, lease_s: float, max_attempts: int, slice_no: int,
               plan_first: Planner | None, steer: Steer | None,
               first: FirstCall | None = None) -> Claimed | NotClaimed:
        self._exam_first(conn, slug)
        params = {**key, "p_owner": owner, "p_lease": lease_s, "p_max": max_attempts}
        leased_at = time.monotonic()
        if self._raw is not None:
            # SQLite: the claim's UPDATE returns the slice's row with what the claim reads of
            # its exam and chapter, and the count of its calls still in flight; one writer at
            # a time, so nothing changes between them (PostgreSQL, whose READ COMMITTED
            # subqueries would read the statement's snapshot from before a wait for the
            # row's lock, reads both after it, as before).
            row = self._run(conn, "claim_returning", self._claim_returning_stmt,
                            params).one_or_none()
            won = 0 if row is None else 1
        else:
            won = self._run(conn, "claim", self._claim_stmt, params).rowcount
        if won != 1:
            conn.execute(update(S).where(*slice_where(slug, chapter_id, slice_no))
                         .values(picked_at=self._now))
            return self._why_not(conn, slug, chapter_id, slice_no, max_attempts)
        if self._raw is None:
            took_over = self._waste_orphaned_calls(conn, slug, chapter_id, slice_no)
            row = self._claimed_row(conn, key)
        else:
            took_over = (self._waste_orphaned_calls(
                conn, slug, chapter_id, slice_no, budgeted=row.budget_usd is not None)
                if row.in_flight else 0)
        claimed = self._read_claimed(conn, slug, chapter_id, slice_no, owner, steer,
                                     took_over, row)
        if plan_first is None or _solves_first(claimed):
            return claimed
        # SQLite: whether the exam has a budget, as read with the slice (one writer at a
        # time: it cannot change before this transaction ends). PostgreSQL reads it again,
        # which locks the exam row (Ledger._budgeted).
        budgeted = None if self._raw is None else row.budget_usd is not None
        view = claimed.view()
        plan: CallPlan | None
        if first is not None and _as_planned(claimed, view, first):
            # Planned before the claim (its prompt, its tokens, the rate limiter's admission)
            # for exactly this slice: the write transaction, SQLite's one writer at a time,
            # is not held while a call is planned.
            plan = first.plan
        else:
            plan = plan_first(view)
        recorded = self._start_planned(conn, claimed, plan, budgeted=budgeted)
        # The lease again from now, the transaction's last step, when reading and planning
        # took long enough to matter: planning the first call (its prompt, its tokens, the
        # rate limiter) can take a second or more in a worker that has just started, and
        # the lease taken at the top of this transaction would then be that much shorter by
        # the time it is seen. Usually they take a millisecond, and the statement is
        # skipped: the lease is then at most RESTAMP_AFTER of itself shorter.
        if time.monotonic() - leased_at > RESTAMP_AFTER * lease_s:
            self._run(conn, "claim_restamp", lambda: update(S).where(*SLICE_KEY).values(
                lease_expires_at=self._now + bindparam("p_lease")), {**key, "p_lease": lease_s})
        return dataclasses.replace(claimed, first_call=recorded)

    def _claim_fast(self, slug: str, chapter_id: str, owner: str, lease_s: float,
                    max_attempts: int, *, slice_no: int, plan_first: Planner | None,
                    steer: Steer | None, first: FirstCall | None = None) -> Claimed | None:
        """The claim in one round trip, with its first call when `first` fits what it finds,
        else the first call in another (PostgreSQL, storage.fastpath): None when the claim
        was not won (the general path says why)."""
        limit = steer.avoid if steer is not None and steer.mode != "recent" else 0
        plan = (None if first is None or plan_first is None or not _wanted(first)
                else first.plan)
        args = (slug, chapter_id, slice_no, owner, lease_s, max_attempts,
                CallReason.crash_before_commit.value, CRASH_DETAIL, BUDGET_SPENT_REASON,
                limit // 2 if limit > 0 else None,
                None if plan is None else first.fingerprint,  # type: ignore[union-attr]
                None if plan is None else plan.first_number,
                None if plan is None else plan.requested,
                None if plan is None else plan.prompt_tokens,
                None if plan is None else plan.max_tokens,
                None if plan is None else plan.reserve_usd,
                None if plan is None else plan.model,
                None if plan is None else plan.price_known)
        row = self._auto(self.engine, fastpath.CLAIM_SQL,
                         dict(zip(fastpath.CLAIM_PARAMS, args))).one()
        if row.status != "ok":
            return None
        claimed = self._claimed_of(row, slug, chapter_id, slice_no, owner, steer)
        if plan_first is None or (_solves_first(claimed) and row.first_status is None):
            return claimed
        if plan is not None and row.first_status is not None:
            # Recorded in the claim's statement (ok), or not: the lease is gone, or the
            # budget has no room (the general path settles dead holders' calls, says why).
            if row.first_status == "ok":
                return dataclasses.replace(claimed, first_call=int(row.first_call))
            if row.first_status == "lost":
                return claimed
            return dataclasses.replace(claimed, first_call=self._start_general(
                claimed, lease_s, plan))
        plan = plan_first(claimed.view())
        if plan is None:
            return claimed
        return dataclasses.replace(claimed, first_call=self._start_fast(claimed, lease_s, plan))

    @staticmethod
    def _claimed_of(row: Any, slug: str, chapter_id: str, slice_no: int, owner: str,
                    steer: Steer | None) -> Claimed:
        """The Claimed of ef_claim's row, as _read_claimed makes it."""
        ids, numbers, texts = row.ids or [], row.numbers or [], row.texts or []
        last = row.first_number + row.target
        chapter_target = row.chapter_target or row.target
        if steer is not None and texts:
            recent: tuple[str, ...] = fastpath.claim_steering(
                steer, chapter_target, row.attempts, ids, numbers, texts,
                list(zip(row.repeated_ids or (), row.repeated_texts or ())))
        else:
            recent = tuple(texts[-RECENT_QUESTIONS:])
        levels = ChapterLevels.from_row(row.difficulty, row.bloom, row.chapter_types)
        if levels.difficulty is not None:
            counts: dict[str, int] = {}
            for n, d in zip(numbers, row.difficulties or ()):
                if d is not None and n is not None and row.first_number <= n < last:
                    counts[d] = counts.get(d, 0) + 1
            levels = dataclasses.replace(levels, stored=counts)
        if levels.types is not None:
            levels = dataclasses.replace(levels, stored_types=count_types(
                (kind, answer) for n, kind, answer in zip(numbers, row.types or (),
                                                          row.answers or ())
                if n is not None and row.first_number <= n < last))
        return Claimed(
            exam=slug, chapter_id=chapter_id, owner=owner, attempt=row.attempts,
            # A withdrawn question (storage.verdicts) has no number: not in the count.
            target=row.target,
            stored=sum(1 for n in numbers if n is not None and row.first_number <= n < last),
            known=frozenset(normalise(t) for t in texts), exam_title=row.exam_title,
            title=row.title, prompt=row.prompt,
            attempts_since_progress=row.attempts_since_progress,
            took_over_calls=row.took_over, slice_no=slice_no,
            first_number=row.first_number, chapter_target=chapter_target, recent=recent,
            levels=levels, index_epoch=row.index_epoch,
            passages=tuple(Passage(*p) for p in zip(
                row.passage_seqs or (), row.passage_sources or (),
                row.passage_locations or (), row.passage_texts or ())),
            verify=row.exam_verify or "off", language=row.chapter_language or DEFAULT_LANGUAGE)

    def _start_fast(self, claim: Claimed, lease_s: float, plan: CallPlan) -> int | NoRoom | None:
        """Record a planned call in one round trip (ef_start_call); the general path when the
        budget has no room (it settles dead holders' calls first and says why); None when
        the lease is gone (the caller's slow path finds that out and stops)."""
        row = self._auto(self.engine, fastpath.START_CALL_SQL, {
            "p_exam": claim.exam, "p_chapter": claim.chapter_id,
            "p_slice": claim.slice_no, "p_owner": claim.owner, "p_lease": lease_s,
            "p_attempt": claim.attempt, "p_first": plan.first_number,
            "p_requested": plan.requested, "p_prompt_tokens": plan.prompt_tokens,
            "p_max_tokens": plan.max_tokens, "p_reserve": plan.reserve_usd,
            "p_model": plan.model, "p_price_known": plan.price_known}).one()
        if row.status == "ok":
            return int(row.call_id)
        if row.status == "lost":
            return None
        return self._start_general(claim, lease_s, plan)

    def _start_general(self, claim: Claimed, lease_s: float, plan: CallPlan
                       ) -> int | NoRoom | None:
        try:
            return self.start_call(claim, plan.first_number, plan.requested, lease_s=lease_s,
                                   prompt_tokens=plan.prompt_tokens,
                                   max_tokens=plan.max_tokens, reserve_usd=plan.reserve_usd,
                                   model=plan.model, price_known=plan.price_known)
        except LeaseLost:
            return None

    def held_claim(self, slug: str, chapter_id: str, slice_no: int, owner: str, *,
                   steer: Steer | None = None) -> Claimed | None:
        """The slice as a Claimed for `owner`, which already holds its lease (a provider
        batch's submission, runner.batching), read without changing the lease; None when
        `owner` does not hold it (any more). Commits through it are fenced as usual."""
        key = {"k_exam": slug, "k_chapter": chapter_id, "k_slice": slice_no}
        with self._read() as conn:
            held = conn.execute(select(S.c.lease_owner).where(*SLICE_KEY), key
                                ).scalar_one_or_none()
            if held != owner:
                return None
            return self._read_claimed(conn, slug, chapter_id, slice_no, owner, steer, 0)

    def _claimed_row(self, conn: Connection, key: dict[str, Any]) -> Any:
        """The slice's row with what a claim needs of its exam and chapter."""
        return self._run(conn, "claimed_row", lambda: (
            select(S, *_claim_reads(lambda column: column))
            .join(E, E.c.slug == S.c.exam).where(*SLICE_KEY)), key).one()

    def _read_claimed(self, conn: Connection, slug: str, chapter_id: str, slice_no: int,
                      owner: str, steer: Steer | None, took_over: int,
                      row: Any = None) -> Claimed:
        """The Claimed of the slice (`row`: its `_claimed_row`, if read already)."""
        key = {"k_exam": slug, "k_chapter": chapter_id, "k_slice": slice_no}
        if row is None:
            row = self._claimed_row(conn, key)
        numbers_texts = self._run(conn, "chapter_texts", lambda: (
            select(Q.c.number, Q.c.question)
            .where(Q.c.exam == bindparam("k_exam"), Q.c.chapter_id == bindparam("k_chapter"))
            .order_by(Q.c.id)), key).all()
        last = row.first_number + row.target
        chapter_target = row.chapter_target
        claimed = Claimed(
            exam=slug, chapter_id=chapter_id, owner=owner, attempt=row.attempts,
            target=row.target,
            stored=sum(1 for n, _ in numbers_texts
                       if n is not None and row.first_number <= n < last),
            known=frozenset(normalise(t) for _, t in numbers_texts),
            exam_title=row.exam_title, title=row.title, prompt=row.prompt,
            attempts_since_progress=row.attempts_since_progress, took_over_calls=took_over,
            slice_no=slice_no, first_number=row.first_number,
            chapter_target=chapter_target or row.target,
            recent=(neardup.steered(conn, steer, slug, chapter_id,
                                    chapter_target or row.target, seed=row.attempts) if steer is not None and numbers_texts
                    else tuple(t for _, t in numbers_texts[-RECENT_QUESTIONS:])),
            levels=self._levels(conn, row), index_epoch=row.index_epoch,
            # The course material its prompts carry, in the claim's own transaction.
            passages=(read_passages(conn, slug, chapter_id) if row.sources is not None
                      else ()),
            verify=row.exam_verify or "off", language=row.language or DEFAULT_LANGUAGE,
        )
        return claimed

    def _levels(self, conn: Connection, row: Any) -> ChapterLevels:
        """The chapter's difficulty and Bloom levels from its slice row, with the slice's
        stored questions per difficulty (read only for a chapter that sets one)."""
        levels = ChapterLevels.from_row(row.difficulty, row.bloom, row.types)
        if levels.types is not None:
            levels = dataclasses.replace(levels, stored_types=self._stored_types(
                conn, row.exam, row.chapter_id, row.first_number, row.target))
        if levels.difficulty is None:
            return levels
        counts = self._run(conn, "slice_levels", lambda: (
            select(Q.c.difficulty, func.count()).where(
                Q.c.exam == bindparam("k_exam"), Q.c.chapter_id == bindparam("k_chapter"),
                Q.c.number >= bindparam("k_first"),
                Q.c.number < bindparam("k_first") + bindparam("k_target"),
                Q.c.difficulty.is_not(None)).group_by(Q.c.difficulty)), {
            "k_exam": row.exam, "k_chapter": row.chapter_id, "k_first": row.first_number,
            "k_target": row.target}).all()
        return dataclasses.replace(levels, stored={d: n for d, n in counts})

    def _stored_types(self, conn: Connection, exam: str, chapter_id: str, first: int,
                      target: int) -> dict[str, int]:
        return count_types(self._run(
            conn, "slice_types", lambda: select(Q.c.type, Q.c.answer).where(
                Q.c.exam == bindparam("k_exam"), Q.c.chapter_id == bindparam("k_chapter"),
                Q.c.number >= bindparam("k_first"),
                Q.c.number < bindparam("k_first") + bindparam("k_target")), {
                "k_exam": exam, "k_chapter": chapter_id, "k_first": first,
                "k_target": target}).all())

    def stored_types(self, claim: Claimed) -> dict[str, int]:
        """The claimed slice's stored questions per item type, as its claim reads them
        (storage.types.count_types): read again after a blind solve withdrew some."""
        with self._read() as conn:
            return self._stored_types(conn, claim.exam, claim.chapter_id, claim.first_number,
                                      claim.target)

    def keyed_texts(self, exam: str, chapter_id: str) -> list[tuple[str, str]]:
        """The chapter's numbered questions as (type, text with its key): what a new item of
        another type is compared with (examforge.item_types.with_key)."""
        with self._read() as conn:
            rows = conn.execute(select(Q.c.type, Q.c.question, Q.c.choices, Q.c.answer_index,
                                       Q.c.answer).where(
                Q.c.exam == exam, Q.c.chapter_id == chapter_id, Q.c.number.is_not(None))
                .order_by(Q.c.id)).all()
        return [(r.type or "mcq", item_types.with_key(
            r.type or "mcq", r.question, json.loads(r.choices), r.answer_index,
            item_types.load(r.answer))) for r in rows]

    def _claim_returning_stmt(self) -> Any:
        """`_claim_stmt` returning what `_claimed_row` reads, and `in_flight`: the slice's
        calls still in flight (a dead holder's, for `_waste_orphaned_calls`). SQLite only:
        its RETURNING may name the updated table's columns and scalar subqueries, not join.
        The subqueries take the slice's key as parameters, not from the updated row:
        SQLAlchemy renders RETURNING's columns without their table, and an `exam` inside a
        subquery on `call` would be the call's own."""
        def of_exam(column: Any) -> Any:
            return select(column).where(E.c.slug == bindparam("k_exam")).scalar_subquery()

        return self._claim_stmt().returning(
            *S.c, *_claim_reads(of_exam),
            select(func.count()).where(
                K.c.exam == bindparam("k_exam"), K.c.chapter_id == bindparam("k_chapter"),
                K.c.slice_no == bindparam("k_slice"), IN_FLIGHT_CALL)
            .scalar_subquery().label("in_flight"))

    def _claim_stmt(self) -> Any:
        exam_active = select(E.c.slug).where(
            E.c.slug == bindparam("k_exam"), E.c.state == ExamState.active.value).exists()
        return (
            update(S)
            .where(
                *SLICE_KEY,
                # Two equalities, not IN: a list IN is re-expanded at every execution.
                or_(*(S.c.state == state for state in ACTIVE_STATES)),
                or_(S.c.lease_owner.is_(None), S.c.lease_expires_at <= self._now),
                or_(S.c.not_before_at.is_(None), S.c.not_before_at <= self._now),
                S.c.attempts_since_progress < bindparam("p_max"),
                exam_active,
            )
            .values(lease_owner=bindparam("p_owner"),
                    lease_expires_at=self._now + bindparam("p_lease"),
                    state=ChapterState.running.value, attempts=S.c.attempts + 1,
                    attempts_since_progress=S.c.attempts_since_progress + 1,
                    not_before_at=None, picked_at=self._now, updated_at=self._now))

    def _why_not(self, conn: Connection, slug: str, chapter_id: str, slice_no: int,
                 max_attempts: int) -> NotClaimed:
        key = slice_where(slug, chapter_id, slice_no)
        row = conn.execute(
            select(S, E.c.state.label("exam_state"), E.c.pause_reason, self._now.label("now"))
            .join(E, E.c.slug == S.c.exam)
            .where(*key)).one_or_none()
        if row is None:
            return NotClaimed(NotClaimedReason.missing,
                              detail=f"no slice {slug}/{chapter_id}/{slice_no} in the database")
        if row.state in (ChapterState.done.value, ChapterState.failed.value,
                         ChapterState.cancelled.value):
            return NotClaimed(NotClaimedReason(row.state))
        if row.exam_state == ExamState.paused.value:
            return NotClaimed(NotClaimedReason.paused, detail=row.pause_reason or "")
        if row.lease_owner is not None and (row.lease_expires_at or 0) > row.now:
            return NotClaimed(NotClaimedReason.busy, retry_in_s=row.lease_expires_at - row.now,
                              detail=f"held by {row.lease_owner}", holder=row.lease_owner)
        if row.not_before_at is not None and row.not_before_at > row.now:
            return NotClaimed(NotClaimedReason.backoff, retry_in_s=row.not_before_at - row.now)
        if row.attempts_since_progress >= max_attempts:
            error = capped_detail(row.attempts_since_progress, row.last_error_code,
                                  row.last_error)
            conn.execute(update(S).where(*key).values(
                state=ChapterState.failed.value, lease_owner=None, lease_expires_at=None,
                last_error_code=SliceReason.attempt_cap.value, last_error=error,
                last_error_at=self._now, updated_at=self._now))
            self._waste_orphaned_calls(conn, slug, chapter_id, slice_no)
            return NotClaimed(NotClaimedReason.cap, detail=SliceReason.attempt_cap.describe(error))
        return NotClaimed(NotClaimedReason.busy, retry_in_s=0.5,
                          detail="changed under us; check back")

    def renew(self, owners: Sequence[str], lease_s: float) -> set[str]:
        """Extend the live leases of `owners`; returns the owners that still hold theirs.

        The heartbeat has a connection of its own, so it never waits behind the workers'
        queries for one. On PostgreSQL it never waits behind their row locks either: a slice
        whose row is locked is skipped (SKIP LOCKED) and counted as held, whatever its
        timestamp says. The lock is almost always its holder's commit, whose fence extended
        the lease itself and which may be waiting behind another commit of the exam (a frozen
        worker's); and one renewal covers every lease of the worker, so waiting for one
        commit would hold up all of them (128 threads committing near-duplicate indexes kept
        it waiting past the TTL). On SQLite, where writers take turns, its turn comes
        right after the current writer's (WriterLock). A slice cancelled while its call runs
        keeps its holder's lease until that call's reply is committed (Planning.cancel)."""
        if not owners:
            return set()
        if self._fast_pg:
            # One statement in autocommit: one round trip (storage.fastpath.RENEW_SQL).
            return set(self._auto(self._heartbeat_engine(), fastpath.RENEW_SQL, {
                "owners": list(owners), "lease": lease_s}).scalars().all())
        live = lease_fence(self._now, owner=S.c.lease_owner.in_(owners))
        with self._write(self._heartbeat_engine(), urgent=True) as conn:
            if conn.dialect.name != "postgresql":  # one writer at a time: nothing to skip
                return set(conn.execute(
                    update(S).where(live).values(lease_expires_at=self._now + lease_s)
                    .returning(S.c.lease_owner)).scalars().all())
            held = lease_fence(self._now, owner=S.c.lease_owner.in_(owners), states=HELD_STATES)
            mine = and_(S.c.lease_owner.in_(owners), S.c.state.in_(HELD_STATES))
            # Every row of ours that no one has locked, locked now (SKIP LOCKED: never wait).
            free = conn.execute(select(S.c.exam, S.c.chapter_id, S.c.slice_no,
                                       S.c.lease_owner, held.label("live"))
                                .where(mine).with_for_update(skip_locked=True)).all()
            renew = [(r.exam, r.chapter_id, r.slice_no) for r in free if r.live]
            if renew:
                key = tuple_(S.c.exam, S.c.chapter_id, S.c.slice_no)
                conn.execute(update(S).where(key.in_(renew))
                             .values(lease_expires_at=self._now + lease_s))
            # Held: ours and renewed, or ours and locked. A locked row is almost always its
            # holder's commit in progress (the fence locked it and extended the lease), whose
            # timestamp may pass while that commit waits behind another: still ours, since
            # nobody can take a locked row. If someone else had it locked to take it over,
            # the next beat finds its new owner.
            unlocked = {(r.exam, r.chapter_id, r.slice_no) for r in free}
            locked = {r.lease_owner for r in conn.execute(
                select(S.c.exam, S.c.chapter_id, S.c.slice_no, S.c.lease_owner).where(mine))
                if (r.exam, r.chapter_id, r.slice_no) not in unlocked}
            return {r.lease_owner for r in free if r.live} | locked

    def _heartbeat_engine(self) -> Engine:
        with self._beat_lock:
            if self._beat is None:
                from storage.db import checkpoints_in_background, connect

                # As the store's: in a process that checkpoints SQLite in the background, a
                # renewal must not be the commit that runs SQLite's own checkpoint.
                self._beat = connect(self.engine.url.render_as_string(hide_password=False),
                                     pool_size=1, background_checkpoint=checkpoints_in_background(
                                         self.engine))
            return self._beat

    def release(self, claim: Claimed, *, retry_in_s: float, code: SliceReason, detail: str,
                count_attempt: bool = True) -> bool:
        """Give the lease back after a transient failure; nobody may claim before `retry_in_s`.
        `code` and `detail` are why (slice.last_error_code and last_error).
        With `count_attempt` false (a rate limit, a budget wait, a shutdown) this attempt is
        taken back from the chapter's streak without progress: it cannot bring it nearer its
        attempt cap."""
        values: dict[str, Any] = {}
        if not count_attempt:
            values["attempts_since_progress"] = case(
                (S.c.attempts_since_progress > 0, S.c.attempts_since_progress - 1), else_=0)
        with self._write() as conn:
            return conn.execute(
                update(S).where(*claim.where(),
                                S.c.lease_owner == claim.owner,
                                S.c.state == ChapterState.running.value)
                .values(state=ChapterState.pending.value, lease_owner=None,
                        lease_expires_at=None, not_before_at=self._now + retry_in_s,
                        last_error_code=code.value, last_error=detail[:1000],
                        last_error_at=self._now, updated_at=self._now, **values)
            ).rowcount == 1

    def fail(self, claim: Claimed, code: SliceReason, detail: str, *,
             pause_exam_after: int | None = None) -> None:
        """Fail the chapter now, for `code` (slice.last_error_code) with `detail` beside it.
        With `pause_exam_after`, count an auth failure against the exam and pause it when that
        many happened in a row."""
        reason = code.describe(detail)
        with self._write() as conn:
            conn.execute(
                update(S).where(*claim.where(), S.c.lease_owner == claim.owner)
                .values(state=ChapterState.failed.value, lease_owner=None,
                        lease_expires_at=None, last_error_code=code.value,
                        last_error=detail[:1000], last_error_at=self._now,
                        updated_at=self._now))
            if pause_exam_after is not None:
                failures = E.c.auth_failures + 1
                conn.execute(update(E).where(E.c.slug == claim.exam).values(
                    auth_failures=failures,
                    state=case((failures >= pause_exam_after, ExamState.paused.value),
                               else_=E.c.state),
                    pause_reason=case((failures >= pause_exam_after, reason[:500]),
                                      else_=E.c.pause_reason),
                    pause_code=case((failures >= pause_exam_after, PauseCode.auth.value),
                                    else_=E.c.pause_code),
                    updated_at=self._now))
