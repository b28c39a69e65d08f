"""Questions leaving their chapter's numbering, and the blind solve's verdicts (VERIFY).

A withdrawn question (`Store.withdraw`: disputed by the blind solve under VERIFY=replace, or
rejected by a reviewer) stays in the database with `number` NULL, `withdrawn` saying why and
`withdrawn_number` the number it had. It is out of its slice's count (every count and export
selects by number within the slice's range) and its number is free: the next commit of the
slice takes the lowest free numbers of its range (Ledger._free_numbers), so only the missing
numbers are generated, once each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection

from storage.base import E, Q, S
from storage.ledger import Ledger
from storage.models import ChapterState, Withdrawn


@dataclass(frozen=True)
class Withdrawal:
    """What `Store.withdraw` did: the questions it withdrew (ids already withdrawn, or not of
    the exam, are left out) and the done slices it reopened (pending again, to be generated
    by the next `enqueue`)."""

    withdrawn: tuple[int, ...] = ()
    reopened: tuple[tuple[str, int], ...] = field(default_factory=tuple)


class Verdicts(Ledger):
    """Withdrawing questions from the numbering; the verdicts of their blind solves."""

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
            self._exam_first(conn, exam)
            return self._withdraw(conn, exam, list(question_ids), reason)

    def _withdraw(self, conn: Connection, exam: str, question_ids: Sequence[int],
                  reason: Withdrawn, *, reopen: bool = True) -> Withdrawal:
        """`withdraw` in the caller's transaction. With `reopen` False the slices are left as
        they are (their holder, under its lease, decides)."""
        if not question_ids:
            return Withdrawal()
        rows = []
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
        conn.execute(update(E).where(E.c.slug == exam).values(updated_at=self._now))
        return Withdrawal(tuple(sorted(r.id for r in rows)), tuple(reopened))

    def withdrawn_questions(self, exam: str) -> list[tuple[int, str, str, int]]:
        """The exam's withdrawn questions: (id, chapter_id, reason, the number it had), in
        chapter and number order."""
        with self._read() as conn:
            return [tuple(r) for r in conn.execute(  # type: ignore[misc]
                select(Q.c.id, Q.c.chapter_id, Q.c.withdrawn, Q.c.withdrawn_number)
                .where(Q.c.exam == exam, and_(Q.c.number.is_(None)))
                .order_by(Q.c.chapter_id, Q.c.withdrawn_number, Q.c.id)).all()]
