"""Questions leaving their chapter's numbering, and the blind solve's verdicts (VERIFY).

A withdrawn question (`Store.withdraw`: disputed by the blind solve under VERIFY=replace, or
rejected by a reviewer) stays in the database with `number` NULL, `withdrawn` saying why and
`withdrawn_number` the number it had. It is out of its slice's count (every count and export
selects by number within the slice's range) and its number is free: the next commit of the
slice takes the lowest free numbers of its range (Ledger._free_numbers), so only the missing
numbers are generated, once each."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, bindparam, func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from examforge import item_types
from examforge.errors import LeaseLost
from examforge.output import normalise
from examforge.verify import agrees, stored_answer
from storage.base import SLICE_KEY, E, K, Q, S, lease_fence
from storage.ledger import Ledger
from storage.models import (CallOutcome, CallReason, ChapterState, PassageRow, Verdict,
                            Withdrawn)
from storage.types import Claimed, Usage

P = PassageRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Pending:
    """A stored question of a slice awaiting its blind solve (verdict `pending`)."""

    id: int
    number: int
    question: str
    choices: tuple[str, ...]
    answer_index: int
    # The text of the passage it cites (a chapter with sources), which the solver is shown
    # with it; None without one.
    passage: str | None = None
    # Its item type (examforge.item_types) and, for a type other than mcq, its answer.
    type: str = "mcq"
    answer: str | None = None


@dataclass(frozen=True)
class Judged:
    """What `Store.commit_verdicts` did, and the slice as it now stands."""

    stored: int  # in the slice's range (withdrawn questions are not)
    target: int
    agreed: int = 0
    disputed: int = 0
    withdrawn: int = 0  # of `disputed`, those withdrawn (VERIFY=replace)
    pending: int = 0  # verdicts of the slice's range still pending
    done: bool = False  # the slice is complete and let go
    cancelled: bool = False  # cancelled meanwhile: the lease is let go
    # With `withdraw_disputed`: the slice's keys solved since its disputes were last counted
    # afresh (slice.disputes_from), those disputed, and the disputed ones at the end, in a row
    # (newest first): what bounds a solver that keeps disputing (runner.verify).
    solved_keys: int = 0
    disputed_keys: int = 0
    disputed_in_row: int = 0


@dataclass(frozen=True)
class Withdrawal:
    """What `Store.withdraw` did: the questions it withdrew (ids already withdrawn, or not of
    the exam, are left out) and the done slices it reopened (pending again, to be generated
    by the next `enqueue`)."""

    withdrawn: tuple[int, ...] = ()
    reopened: tuple[tuple[str, int], ...] = field(default_factory=tuple)


class Verdicts(Ledger):
    """Withdrawing questions from the numbering; the verdicts of their blind solves."""

    def pending_verdicts(self, claim: Claimed) -> list[Pending]:
        """The questions of the claimed slice's range whose blind solve is still to be booked
        (stored by a commit under VERIFY; after a crash, the takeover finds them here), in
        number order."""
        with self._read() as conn:
            rows = conn.execute(select(
                Q.c.id, Q.c.number, Q.c.question, Q.c.choices, Q.c.answer_index,
                P.c.text.label("passage"), Q.c.type, Q.c.answer).join(S, and_(
                    S.c.exam == Q.c.exam, S.c.chapter_id == Q.c.chapter_id,
                    Q.c.number >= S.c.first_number, Q.c.number < S.c.first_number + S.c.target))
                .outerjoin(P, and_(P.c.exam == Q.c.exam, P.c.chapter_id == Q.c.chapter_id,
                                   P.c.seq == Q.c.passage))
                .where(Q.c.exam == claim.exam, Q.c.chapter_id == claim.chapter_id,
                       S.c.slice_no == claim.slice_no, Q.c.verdict == Verdict.pending.value)
                .order_by(Q.c.number)).all()
        return [Pending(r.id, r.number, r.question, tuple(json.loads(r.choices)),
                        r.answer_index, r.passage, r.type, r.answer) for r in rows]

    def commit_verdicts(self, claim: Claimed, lease_s: float, call_id: int | None,
                        solved: Sequence[tuple[int, Any]], *, usage: Usage = Usage(),
                        withdraw_disputed: bool = False, note: str = "") -> Judged:
        """Book a blind solve: `solved` is (question id, the choice the solver picked, as an
        index into the stored choices, or None when it gave none), the call `call_id` and its
        usage, in one transaction, only while the lease is held (the same fence as the
        commit: a holder that lost its lease books its call as wasted and raises LeaseLost;
        the takeover solves the questions again). A question whose key the solver chose is
        `agreed`, any other is `disputed`; with `withdraw_disputed` (VERIFY=replace) the
        disputed ones are withdrawn from the numbering, so the slice generates their
        replacements. Only `pending` verdicts change: booking one twice is impossible.

        With no call (`call_id` None, nothing solved) it only checks whether the slice is
        complete. The slice is done, and let go, when its range is full and no verdict of
        it is pending."""
        try:
            with self._write() as conn:
                return self._commit_verdicts(conn, claim, lease_s, call_id, solved, usage,
                                             withdraw_disputed, note)
        except LeaseLost:
            if call_id is not None:
                self.finish_call(call_id, CallOutcome.wasted, CallReason.lease_lost,
                                 "the lease expired or was taken before the verdicts were "
                                 "booked", usage=usage)
            raise
        except SQLAlchemyError as exc:
            if call_id is not None:
                try:
                    self.finish_call(call_id, CallOutcome.wasted, CallReason.commit_failed,
                                     str(exc).splitlines()[0][:300], usage=usage)
                except SQLAlchemyError:
                    pass  # still down: the takeover will mark it wasted
            raise

    def _commit_verdicts(self, conn: Connection, claim: Claimed, lease_s: float,
                         call_id: int | None, solved: Sequence[tuple[int, Any]],
                         usage: Usage, withdraw_disputed: bool, note: str) -> Judged:
        self._exam_first(conn, claim.exam)
        key = {"k_exam": claim.exam, "k_chapter": claim.chapter_id, "k_slice": claim.slice_no}
        held = conn.execute(self._stmt("verdict_fence", lambda: (
            update(S).where(*SLICE_KEY, lease_fence(self._now))
            .values(lease_expires_at=self._now + bindparam("p_lease"), updated_at=self._now)
            .returning(S.c.target, S.c.first_number, S.c.state))),
            {**claim.fence_params(), "p_lease": lease_s}).one_or_none()
        if held is None:
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id}/{claim.slice_no} "
                            "lost before the verdicts were booked")
        target, first, state = held
        agreed = disputed = 0
        to_withdraw: list[int] = []
        if solved:
            keys = {r.id: r for r in conn.execute(
                select(Q.c.id, Q.c.answer_index, Q.c.type, Q.c.answer).where(
                    Q.c.exam == claim.exam, Q.c.id.in_([i for i, _ in solved]),
                    Q.c.verdict == Verdict.pending.value))}
            for qid, pick in solved:
                if qid not in keys:
                    continue  # booked already, or not this exam's
                row = keys[qid]
                # Each item type's agreement (examforge.verify.agrees): an mcq's the choice.
                agreed_ = agrees(row.type or "mcq", row.answer_index,
                                 item_types.load(row.answer), pick, normalise)
                verdict = Verdict.agreed if agreed_ else Verdict.disputed
                typed = (row.type or "mcq") != "mcq"
                conn.execute(update(Q).where(Q.c.id == qid,
                                             Q.c.verdict == Verdict.pending.value).values(
                    verdict=verdict.value, solved_index=None if typed else pick,
                    solved_answer=stored_answer(row.type, pick) if typed else None,
                    verify_call_id=call_id))
                if verdict is Verdict.agreed:
                    agreed += 1
                else:
                    disputed += 1
                    to_withdraw.append(qid)
        withdrawn = 0
        if withdraw_disputed and to_withdraw:
            withdrawn = len(self._withdraw(conn, claim.exam, to_withdraw, Withdrawn.disputed,
                                           reopen=False).withdrawn)
        if call_id is not None:
            detail = ", ".join(filter(None, [
                f"blind solve: {agreed} agreed, {disputed} disputed"
                + (f" ({withdrawn} withdrawn)" if withdrawn else ""), note]))
            if not self._finish(conn, call_id, {"outcome": CallOutcome.used.value,
                                                "reason": None, "detail": detail}, usage):
                raise LeaseLost(f"call {call_id} was already settled")
        free = self._free_numbers(conn, claim.exam, claim.chapter_id, first, target)
        stored = target - len(free)
        pending = conn.execute(select(func.count()).select_from(Q).where(
            Q.c.exam == claim.exam, Q.c.chapter_id == claim.chapter_id,
            Q.c.number >= first, Q.c.number < first + target,
            Q.c.verdict == Verdict.pending.value)).scalar_one()
        result = Judged(stored, target, agreed, disputed, withdrawn, pending)
        if withdraw_disputed and disputed:
            result = self._dispute_window(conn, claim, first, target, result)
        if stored >= target and not pending:
            conn.execute(update(S).where(*SLICE_KEY).values(
                state=ChapterState.done.value, lease_owner=None, lease_expires_at=None), key)
            return dataclasses.replace(result, done=True)
        if state == ChapterState.cancelled.value:
            conn.execute(update(S).where(*SLICE_KEY).values(
                lease_owner=None, lease_expires_at=None), key)
            return dataclasses.replace(result, cancelled=True)
        return result

    @staticmethod
    def _dispute_window(conn: Connection, claim: Claimed, first: int, target: int,
                        judged: Judged) -> Judged:
        """The slice's solved keys since slice.disputes_from: how many, how many disputed,
        and how many disputed in a row at the newest end (by question id: the order they
        were generated and solved in). Its questions are those numbered in its range and
        those withdrawn from it (withdrawn_number in its range)."""
        start = select(func.coalesce(S.c.disputes_from, 0)).where(
            S.c.exam == claim.exam, S.c.chapter_id == claim.chapter_id,
            S.c.slice_no == claim.slice_no).scalar_subquery()
        number = func.coalesce(Q.c.number, Q.c.withdrawn_number)
        verdicts = conn.execute(select(Q.c.verdict).where(
            Q.c.exam == claim.exam, Q.c.chapter_id == claim.chapter_id,
            number >= first, number < first + target, Q.c.id > start,
            Q.c.verdict.in_([Verdict.agreed.value, Verdict.disputed.value]))
            .order_by(Q.c.id.desc())).scalars().all()
        in_row = next((i for i, v in enumerate(verdicts) if v != Verdict.disputed.value),
                      len(verdicts))
        return dataclasses.replace(
            judged, solved_keys=len(verdicts),
            disputed_keys=sum(1 for v in verdicts if v == Verdict.disputed.value),
            disputed_in_row=in_row)

    def withdraw(self, exam: str, question_ids: Iterable[int],
                 reason: Withdrawn | str) -> Withdrawal:
        """Withdraw the exam's questions `question_ids` from their chapters' numbering, for
        `reason` (Withdrawn: disputed or rejected), in one transaction. Their rows stay (for
        review); their numbers are free for replacements. A done slice whose range loses a
        question goes back to pending with no enqueue recorded, so that the next `enqueue`
        generates its missing numbers (the reconciler leaves a slice never enqueued alone);
        a running slice's holder sees the lower count at its next commit and goes on. Ids
        already withdrawn, or not the exam's, are ignored (withdrawing is idempotent)."""
        reason = Withdrawn(reason)
        with self._write() as conn:
            # The exam row first (the lock order of enqueue's transactions): it says the
            # exam changed, for GET /metrics (producer.api.metrics) among others.
            conn.execute(update(E).where(E.c.slug == exam).values(updated_at=self._now))
            ids = list(question_ids)
            if ids and self.engine.dialect.name == "postgresql":
                # Their chapters' slices before the questions, as a review action takes them
                # (storage.review): a final commit in progress is waited for, and its `done`
                # seen and reopened, never missed (issue 27, defect 9).
                chapters = sorted(set(conn.execute(select(Q.c.chapter_id).where(
                    Q.c.exam == exam, Q.c.id.in_(ids))).scalars()))
                conn.execute(select(S.c.slice_no).where(S.c.exam == exam,
                                                        S.c.chapter_id.in_(chapters))
                             .order_by(S.c.chapter_id, S.c.slice_no).with_for_update()).all()
            return self._withdraw(conn, exam, ids, reason)

    def _withdraw(self, conn: Connection, exam: str, question_ids: Sequence[int],
                  reason: Withdrawn, *, reopen: bool = True) -> Withdrawal:
        """`withdraw` in the caller's transaction. With `reopen` False the slices are left as
        they are (their holder, under its lease, decides)."""
        if not question_ids:
            return Withdrawal()
        rows: list[Any] = []
        ids = sorted(set(int(i) for i in question_ids))
        for i in range(0, len(ids), 500):
            rows += conn.execute(update(Q).where(
                Q.c.exam == exam, Q.c.id.in_(ids[i:i + 500]), Q.c.number.is_not(None))
                .values(withdrawn=reason.value, withdrawn_number=Q.c.number, number=None)
                .returning(Q.c.id, Q.c.chapter_id, Q.c.withdrawn_number)).all()
        if not rows:
            return Withdrawal()
        reopened: list[tuple[str, int]] = []
        if reopen:
            for chapter_id in sorted({r.chapter_id for r in rows}):
                numbers = [r.withdrawn_number for r in rows if r.chapter_id == chapter_id]
                for s in conn.execute(select(S.c.slice_no, S.c.first_number, S.c.target).where(
                        S.c.exam == exam, S.c.chapter_id == chapter_id,
                        S.c.state == ChapterState.done.value)).all():
                    if any(s.first_number <= n < s.first_number + s.target for n in numbers):
                        reopened.append((chapter_id, s.slice_no))
            for chapter_id, slice_no in reopened:
                conn.execute(update(S).where(
                    S.c.exam == exam, S.c.chapter_id == chapter_id, S.c.slice_no == slice_no,
                    S.c.state == ChapterState.done.value).values(
                    state=ChapterState.pending.value, attempts_since_progress=0,
                    not_before_at=None, enqueued_at=None, enqueue_epoch=None,
                    updated_at=self._now))
        return Withdrawal(tuple(sorted(r.id for r in rows)), tuple(reopened))

    def withdrawn_questions(self, exam: str) -> list[tuple[int, str, str, int]]:
        """The exam's withdrawn questions: (id, chapter_id, reason, the number it had), in
        chapter and number order."""
        with self._read() as conn:
            return [tuple(r) for r in conn.execute(  # type: ignore[misc]
                select(Q.c.id, Q.c.chapter_id, Q.c.withdrawn, Q.c.withdrawn_number)
                .where(Q.c.exam == exam, and_(Q.c.number.is_(None)))
                .order_by(Q.c.chapter_id, Q.c.withdrawn_number, Q.c.id)).all()]
