"""`enqueue --regenerate CHAPTER`: what a chapter cut afresh keeps, deletes and generates.

A reviewer's work survives a regeneration (issue 27): the chapter's approved and edited
questions stay in the bank with their numbers, marked `stale` (ReviewState.stale) with the
change that made them so named in `question.stale`, for the reviewer to approve, edit or
reject again; its rejected questions stay out of the bank, for the record (their texts are
still the chapter's, so a regenerated repeat of one is dropped as a duplicate). The rest
(unreviewed questions, those the blind solve disputed) is deleted, and the slices generate
the numbers left free. With `--discard-reviewed` everything is deleted, as before.

The same `plan_chapter` answers the dry run and the real command, so both print the same
list; the real one runs it in the transaction that acts on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from storage import neardup
from storage.base import QE, Q
from storage.models import ReviewState, Withdrawn

# Who marks a question stale, in its history (question_edit.client).
REGENERATE_CLIENT = "enqueue --regenerate"
# The states a regeneration reports, in the order it prints them.
KEPT_STATES = ("approved", "edited", "stale", "rejected")
DELETED_STATES = ("unreviewed", "disputed", *KEPT_STATES)


@dataclass
class ChapterRegeneration:
    """One chapter's regeneration: the question numbers it keeps and deletes, by state, and
    the numbers it generates. A withdrawn question is listed by the number it had."""

    chapter_id: str
    change: str  # why the kept questions are stale
    keeps: dict[str, list[int]] = field(default_factory=dict)
    deletes: dict[str, list[int]] = field(default_factory=dict)
    generates: list[int] = field(default_factory=list)
    kept_ids: list[int] = field(default_factory=list)  # in the bank, marked stale
    kept_texts: list[str] = field(default_factory=list)  # theirs, for the dry run's estimate
    # A kept question numbered past a lowered target: moved to a free number of the range
    # (question id -> new number), so it stays in the bank, in view.
    renumbered: dict[int, int] = field(default_factory=dict)
    deleted_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"chapter_id": self.chapter_id, "change": self.change, "keeps": self.keeps,
                "deletes": self.deletes, "generates": self.generates}

    def lines(self, slug: str) -> list[str]:
        """What `enqueue --regenerate` (and its dry run) prints for the chapter."""
        def listed(by_state: dict[str, list[int]]) -> str:
            parts = [f"{len(ns)} {state} ({_numbers(ns)})" for state, ns in by_state.items()
                     if ns]
            return ", ".join(parts) if parts else "nothing"

        return [f"regenerate {slug}/{self.chapter_id}: {self.change}",
                f"  keeps:     {listed(self.keeps)}",
                f"  deletes:   {listed(self.deletes)}",
                f"  generates: {len(self.generates)}"
                + (f" ({_numbers(self.generates)})" if self.generates else "")]


def _numbers(numbers: Sequence[int]) -> str:
    """1-3, 5, 9-10: a list of question numbers in ranges."""
    out: list[str] = []
    ordered = sorted(numbers)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def _state(row: Any) -> str:
    """A question's state as a regeneration sorts it."""
    if row.review == ReviewState.rejected.value:
        return "rejected"
    if row.withdrawn == Withdrawn.disputed.value:
        return "disputed"
    if row.edits:
        return "edited"
    if row.review in (ReviewState.approved.value, ReviewState.stale.value):
        return row.review
    return "unreviewed"


def plan_chapter(conn: Connection, slug: str, chapter_id: str, questions: int, change: str,
                 discard_reviewed: bool) -> ChapterRegeneration:
    """What regenerating the chapter (to `questions` questions) keeps, deletes and
    generates; nothing is written."""
    edits = (select(func.count()).select_from(QE)
             .where(QE.c.question_id == Q.c.id, QE.c.action == "edit")
             .correlate(Q).scalar_subquery().label("edits"))
    rows = conn.execute(select(Q.c.id, Q.c.number, Q.c.withdrawn_number, Q.c.withdrawn,
                               Q.c.review, Q.c.question, edits)
                        .where(Q.c.exam == slug, Q.c.chapter_id == chapter_id)
                        .order_by(func.coalesce(Q.c.number, Q.c.withdrawn_number), Q.c.id)
                        ).all()
    plan = ChapterRegeneration(chapter_id, change)
    taken: set[int] = set()
    for r in rows:
        state = _state(r)
        number = r.number if r.number is not None else r.withdrawn_number
        if state in KEPT_STATES and not discard_reviewed:
            plan.keeps.setdefault(state, []).append(number)
            if r.number is not None:
                taken.add(r.number)
                plan.kept_ids.append(r.id)
                plan.kept_texts.append(r.question)
        else:
            plan.deletes.setdefault(state, []).append(number)
            plan.deleted_ids.append(r.id)
    plan.keeps = {s: plan.keeps[s] for s in KEPT_STATES if s in plan.keeps}
    plan.deletes = {s: plan.deletes[s] for s in DELETED_STATES if s in plan.deletes}
    free = [n for n in range(1, questions + 1) if n not in taken]
    numbers = {r.id: r.number for r in rows}
    for qid in plan.kept_ids:
        if numbers[qid] > questions and free:
            plan.renumbered[qid] = free.pop(0)
    plan.generates = free
    return plan


def apply_chapter(conn: Connection, slug: str, plan: ChapterRegeneration, now: float) -> None:
    """Delete what the plan deletes (with its history and near-duplicate signatures) and mark
    what it keeps in the bank `stale`, each with a history row naming the change. The
    chapter's slices and passages are the caller's (cut afresh)."""
    ids = plan.deleted_ids
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        conn.execute(delete(QE).where(QE.c.exam == slug, QE.c.question_id.in_(chunk)))
        conn.execute(delete(Q).where(Q.c.exam == slug, Q.c.id.in_(chunk)))
    neardup.forget_questions(conn, slug, ids)
    for qid, number in plan.renumbered.items():
        conn.execute(update(Q).where(Q.c.id == qid).values(number=number))
    for qid in plan.kept_ids:
        row = conn.execute(select(Q.c.number, Q.c.review, Q.c.version).where(
            Q.c.id == qid)).one()
        # The passages are cut afresh: the number it cited means another text now (its
        # `source` still says which file, page and passage it was written from).
        conn.execute(update(Q).where(Q.c.id == qid).values(
            review=ReviewState.stale.value, stale=plan.change, passage=None,
            version=Q.c.version + 1, reviewed_by=REGENERATE_CLIENT, reviewed_at=now))
        conn.execute(insert(QE).values(
            question_id=qid, exam=slug, chapter_id=plan.chapter_id, number=row.number,
            action="stale", version=row.version + 1, client=REGENERATE_CLIENT, at=now,
            note=plan.change, changes=json.dumps({"review": [row.review, "stale"]})))
