"""Review: a person approves, rejects or edits each stored question before export.

Every action is one write transaction that checks the version the reviewer read and bumps it
(optimistic concurrency): the UPDATE's condition is `version = <the version read>`, so of two
reviewers who saved the same question from the same version one changes the row and the
other changes nothing and gets VersionConflict (the API's 409) with the current version,
never a silent overwrite. PostgreSQL re-checks the condition under the row lock; SQLite has
one writer at a time.

An edit changes the question row (exports carry the edited text) and records each changed
field before and after in `question_edit`, with who (the API client) and when: the first
edit's `before` values are the text as generated. An edit of an approved question makes it
unreviewed again: what was approved is not what is stored any more. A rejected question is
final: it is withdrawn from its chapter's numbering (`_withdraw_rejected`), so the next
enqueue generates a replacement for its number, and it is never exported.

An edit of the text, the choices or the key is a new question to the checks (issue 27): it
is refused (DuplicateEdit, 409) when its text is one the bank has, exactly (`norm_hash`) or
nearly (storage.neardup); its hash and near-duplicate signature are replaced; and a verdict
of the blind solve, made for what it was, goes back to `pending`, so the question is solved
again (a done slice holding it is pending again, as after a rejection) and no export shows a
verdict made for another key. A question kept `stale` by `enqueue --regenerate`
(storage.regeneration) is approved again, edited or rejected like any other; an approve or
an edit clears the change it names.

Lock order: the exam row (a budgeted exam's, Ledger._exam_first), then the slices of the
question's chapter (FOR UPDATE, on PostgreSQL), then the question. A worker's commit holds
its slice's row from its fence to its end, so a rejection racing a slice's final commit
either waits for it (and sees the slice done, which it reopens) or goes first (and the
commit counts the withdrawn number as free): never a done slice with a gap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlalchemy import and_, case, exists, func, insert, select, update
from sqlalchemy.engine import Connection

from examforge import item_types
from examforge.errors import (BadEdit, Conflict, DuplicateEdit, UnknownChapter,
                              UnknownQuestion, VersionConflict)
from examforge.languages import DEFAULT_LANGUAGE
from examforge.neardup import Checker
from examforge.output import ItemInvalid, check_item, text_hash
from examforge.syllabus import BLOOM_LEVELS, DIFFICULTIES
from storage import neardup
from storage.base import QE, E, Q, S
from storage.models import ChapterState, ReviewState, Verdict, Withdrawn
# A chapter's review (ChapterReview) and its arithmetic: in storage.report_types, which imports
# no SQLAlchemy (producer/read_sqlite.py reads the same rows from a SQLite file).
from storage.report_types import ChapterReview, chapter_reviews
from storage.states import FILTERS
from storage.verdicts import Verdicts

# The fields an edit may change, in the order they are shown: those of every item, then the
# answer fields of the item types other than mcq (examforge.item_types.reply_fields), each
# editable only on an item of its type. An item's type is not editable: the chapter's counts
# per type are its syllabus's.
COMMON = ("question", "choices", "answer_index", "explanation", "difficulty", "bloom")
TYPED_FIELDS = {"mcq": (), "multi": ("correct",), "truefalse": ("answer",),
                "short": ("accepted",),
                "numeric": ("value", "tolerance", "relative", "unit")}
EDITABLE = COMMON + ("correct", "answer", "accepted", "value", "tolerance", "relative", "unit")
# Those that make it another question to the blind solve: its verdict is void.
SOLVED_FIELDS = ("question", "choices", "answer_index", "correct", "answer", "accepted",
                 "value", "tolerance", "relative", "unit")
# The near-duplicate check of an edit unless the caller passes the settings' own.
DEFAULT_CHECKER = Checker()
# The review actions, as question_edit.action names them.
ACTIONS = ("approve", "reject", "edit")
MAX_NOTE_CHARS = 2000
MAX_TEXT_CHARS = 20_000  # an edited question, choice or explanation


def _in_range() -> Any:
    return and_(S.c.exam == Q.c.exam, S.c.chapter_id == Q.c.chapter_id,
                Q.c.number >= S.c.first_number, Q.c.number < S.c.first_number + S.c.target)


def _row_view(r: Any) -> dict[str, Any]:
    """A question as the review shows it."""
    source = r.source
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except ValueError:
            pass
    return {"id": r.id, "exam": r.exam, "chapter_id": r.chapter_id,
            # A withdrawn question has no number any more: the one it had.
            "number": r.number if r.number is not None else r.withdrawn_number,
            "withdrawn": r.withdrawn,
            "question": r.question, "choices": json.loads(r.choices),
            "answer_index": r.answer_index, "explanation": r.explanation,
            "difficulty": r.difficulty, "bloom": r.bloom, "model": r.model,
            "created_at": r.created_at,
            "verdict": r.verdict,
            # The blind solve's choice (an index into `choices`), beside the key; None
            # while no verdict is booked (never verified, or pending).
            "solved_index": (r.solved_index if r.verdict in (Verdict.agreed.value,
                                                             Verdict.disputed.value)
                             else None),
            "source": source,
            # Its item type, that type's answer fields (null for the other types'), and what
            # the blind solve answered to an item of another type than mcq.
            "type": r.type or "mcq",
            **dict.fromkeys(EDITABLE[len(COMMON):]),
            **item_types.reply_fields(r.type or "mcq", item_types.load(r.answer)),
            "solved_answer": (item_types.load(r.solved_answer).get("given")
                              if r.verdict in (Verdict.agreed.value, Verdict.disputed.value)
                              else None),
            "review": r.review, "version": r.version, "reviewed_by": r.reviewed_by,
            "reviewed_at": r.reviewed_at, "edited": bool(r.edits), "stale": r.stale,
            "language": r.language or DEFAULT_LANGUAGE}


def _bank_filter(name: str) -> Any:
    """The condition a question of the bank meets to be shown by the filter `name` (FILTERS
    but `rejected`, which shows rejected questions, out of the bank). A question withdrawn
    as disputed (VERIFY=replace) is history, no reviewer's work: no filter shows it."""
    if name == "disputed":
        return Q.c.verdict == Verdict.disputed.value
    if name == "edited":
        return exists().where(QE.c.question_id == Q.c.id, QE.c.action == "edit")
    return Q.c.review == ReviewState(name).value  # unreviewed, approved, stale


@dataclass(frozen=True)
class Approval:
    """What a bulk approve did to one question: `status` 200 (approved, or already so),
    404 (no such question in the exam) or 409 (changed since `version`, or out of the bank);
    `question` as it is now (None for a 404)."""

    id: int
    version: int
    status: int
    detail: str | None = None
    question: dict[str, Any] | None = None


class Review(Verdicts):
    """Review states, versions and the edit history of questions."""

    def _columns(self) -> list[Any]:
        edits = (select(func.count()).select_from(QE)
                 .where(QE.c.question_id == Q.c.id, QE.c.action == "edit")
                 .correlate(Q).scalar_subquery().label("edits"))
        cols = [Q.c.id, Q.c.exam, Q.c.chapter_id, Q.c.number, Q.c.question, Q.c.choices,
                Q.c.answer_index, Q.c.explanation, Q.c.difficulty, Q.c.bloom, Q.c.model,
                Q.c.created_at, Q.c.review, Q.c.version, Q.c.reviewed_by, Q.c.reviewed_at,
                Q.c.withdrawn, Q.c.withdrawn_number, edits]
        cols += [Q.c.verdict, Q.c.source, Q.c.solved_index, Q.c.stale, Q.c.type, Q.c.answer,
                 Q.c.solved_answer]
        # Its chapter's language (every slice of a chapter has the same): read by chapter,
        # since a withdrawn question is in no slice's range.
        own = S.alias("own_slice")
        cols.append(select(own.c.language).where(own.c.exam == Q.c.exam,
                                                 own.c.chapter_id == Q.c.chapter_id)
                    .limit(1).correlate(Q).scalar_subquery().label("language"))
        return cols

    def review_summary(self, slug: str) -> list[ChapterReview]:
        """Each chapter of the exam, in syllabus order, with its questions by review state."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            chapters = conn.execute(
                select(S.c.chapter_id, func.min(S.c.title).label("title"),
                       func.min(S.c.position).label("position"),
                       func.sum(S.c.target).label("target"))
                .where(S.c.exam == slug).group_by(S.c.chapter_id)
                .order_by(func.min(S.c.position), S.c.chapter_id)).all()
            counts: dict[tuple[str, str], int] = {}
            for chapter_id, review, n in conn.execute(
                    select(Q.c.chapter_id, Q.c.review, func.count())
                    .select_from(Q.join(S, _in_range())).where(Q.c.exam == slug)
                    .group_by(Q.c.chapter_id, Q.c.review)):
                counts[(chapter_id, review)] = int(n)
            rejected = {c: int(n) for c, n in conn.execute(
                select(Q.c.chapter_id, func.count()).where(
                    Q.c.exam == slug, Q.c.review == ReviewState.rejected.value)
                .group_by(Q.c.chapter_id))}
            disputed: dict[str, int] | None = {c: int(n) for c, n in conn.execute(
                select(Q.c.chapter_id, func.count()).where(
                    Q.c.exam == slug, Q.c.verdict == Verdict.disputed.value,
                    Q.c.review != ReviewState.rejected.value)
                .group_by(Q.c.chapter_id))}
            verified = conn.execute(select(Q.c.id).where(
                Q.c.exam == slug, Q.c.verdict.is_not(None)).limit(1)).first() is not None
            unverified = {c: int(n) for c, n in conn.execute(
                select(Q.c.chapter_id, func.count()).select_from(Q.join(S, _in_range()))
                .where(Q.c.exam == slug, Q.c.verdict.is_(None)
                       | (Q.c.verdict == Verdict.pending.value))
                .group_by(Q.c.chapter_id))}
        return chapter_reviews(chapters, counts, rejected, disputed, verified, unverified)

    def chapter_questions(self, slug: str, chapter_id: str, only: str | None = None
                          ) -> tuple[str, list[dict[str, Any]]]:
        """The chapter's title and its questions for review, by number: those in the bank
        (up to its target), then those withdrawn from it (rejected by a reviewer, or disputed
        by the blind solve under VERIFY=replace), kept for the record, by the number they
        had. With `only` (FILTERS), the questions that filter shows."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            title = conn.execute(select(S.c.title).where(
                S.c.exam == slug, S.c.chapter_id == chapter_id).limit(1)).scalar()
            if title is None:
                raise UnknownChapter(f"chapter {chapter_id!r} is not a chapter of exam {slug}")
            rejected = Q.c.review == ReviewState.rejected.value
            in_bank = [] if only == "rejected" else conn.execute(
                select(*self._columns()).select_from(Q.join(S, _in_range()))
                .where(Q.c.exam == slug, Q.c.chapter_id == chapter_id, ~rejected,
                       *([_bank_filter(only)] if only else []))
                .order_by(Q.c.number)).all()
            gone = [] if only not in (None, "rejected") else conn.execute(
                select(*self._columns()).where(
                    Q.c.exam == slug, Q.c.chapter_id == chapter_id,
                    rejected if only else Q.c.number.is_(None) | rejected)
                .order_by(Q.c.withdrawn_number, Q.c.id)).all()
        return title, [_row_view(r) for r in (*in_bank, *gone)]

    def filter_counts(self, slug: str, chapter_id: str | None = None
                      ) -> dict[str, dict[str, int]]:
        """{chapter id: {filter: how many questions it shows}} for every chapter of the exam
        (or the one named) that has questions, in one query: what `chapter_questions(only=)`
        would list, counted."""
        in_bank = S.c.slice_no.is_not(None) & (Q.c.review != ReviewState.rejected.value)
        conditions = [in_bank & _bank_filter(name) if name != "rejected"
                      else Q.c.review == ReviewState.rejected.value for name in FILTERS]
        query = (select(Q.c.chapter_id,
                        *(func.sum(case((cond, 1), else_=0)) for cond in conditions))
                 .select_from(Q.outerjoin(S, _in_range())).where(Q.c.exam == slug)
                 .group_by(Q.c.chapter_id))
        if chapter_id is not None:
            query = query.where(Q.c.chapter_id == chapter_id)
        with self._read() as conn:
            self._require_exam(conn, slug)
            rows = conn.execute(query).all()
        return {r[0]: {name: int(n or 0) for name, n in zip(FILTERS, r[1:])} for r in rows}

    def approved_in_bank(self, slug: str) -> int:
        """How many of the exam's questions in the bank a reviewer approved: what `export
        --approved-only` writes."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            return int(conn.execute(select(func.count()).select_from(Q.join(S, _in_range()))
                                    .where(Q.c.exam == slug,
                                           Q.c.review == ReviewState.approved.value)
                                    ).scalar_one())

    def review_question(self, slug: str, question_id: int) -> dict[str, Any]:
        with self._read() as conn:
            return self._current(conn, slug, question_id)

    def question_history(self, slug: str, question_id: int) -> list[dict[str, Any]]:
        """Every review action on the question, oldest first."""
        with self._read() as conn:
            self._current(conn, slug, question_id)
            rows = conn.execute(select(QE).where(QE.c.question_id == question_id,
                                                 QE.c.exam == slug).order_by(QE.c.id)).all()
        return [{"action": r.action, "version": r.version, "client": r.client, "at": r.at,
                 "changes": json.loads(r.changes) if r.changes else None, "note": r.note}
                for r in rows]

    def _current(self, conn: Connection, slug: str, question_id: int) -> dict[str, Any]:
        row = conn.execute(select(*self._columns()).where(
            Q.c.id == question_id, Q.c.exam == slug)).first()
        if row is None:
            raise UnknownQuestion(f"exam {slug} has no question {question_id}")
        return _row_view(row)

    # ---- actions ----------------------------------------------------------------------

    def approve(self, slug: str, question_id: int, version: int,
                client: str) -> dict[str, Any]:
        """Approve the question as it is at `version`. Approving an approved question
        changes nothing; a rejected one cannot be approved (it is out of its chapter)."""
        return self._act(slug, question_id, version, client, "approve")

    def reject(self, slug: str, question_id: int, version: int, client: str,
               note: str | None = None) -> dict[str, Any]:
        """Reject the question as it is at `version`: it leaves the bank (never exported)
        and its number is generated again by the next enqueue."""
        return self._act(slug, question_id, version, client, "reject", note=note)

    def edit(self, slug: str, question_id: int, version: int, client: str,
             changes: Mapping[str, Any], *,
             near_dup: Checker | None = DEFAULT_CHECKER) -> dict[str, Any]:
        """Change the fields in `changes` (EDITABLE) of the question as it is at `version`,
        validated as a generated question is (four distinct choices, an answer 0-3, known
        levels). Fields given with their current value are no change; no change at all
        changes nothing (not even the version). A new text is refused (DuplicateEdit) when
        the chapter has it already, or a near-duplicate of it (`near_dup`:
        NEAR_DUP_THRESHOLD and NEAR_DUP_SCOPE; None: NEAR_DUP_SCOPE=off, exact repeats
        only). A changed text, choice or key voids the blind solve's verdict: it is
        `pending` again."""
        unknown = sorted(set(changes) - set(EDITABLE))
        if unknown:
            raise BadEdit(f"{unknown[0]}: not a field an edit can change "
                          f"({', '.join(EDITABLE)})")
        return self._act(slug, question_id, version, client, "edit", changes=changes,
                         near_dup=near_dup)

    def _act(self, slug: str, question_id: int, version: int, client: str, action: str,
             *, changes: Mapping[str, Any] | None = None,
             note: str | None = None, near_dup: Checker | None = None) -> dict[str, Any]:
        if note is not None and len(note) > MAX_NOTE_CHARS:
            raise BadEdit(f"note: over {MAX_NOTE_CHARS} characters")
        with self._write() as conn:
            # The lock order of every writer of an exam (Ledger._exam_first): its row first,
            # then the slices (see the module's docstring), then the question.
            self._exam_first(conn, slug)
            return self._act_in(conn, slug, question_id, version, client, action,
                                changes=changes, note=note, near_dup=near_dup)

    def approve_many(self, slug: str, items: Sequence[tuple[int, int]],
                     client: str) -> list[Approval]:
        """Approve each (question id, version read) in one transaction, each as `approve`
        does: one that changed since its version (VersionConflict), is out of the bank
        (Conflict) or is not the exam's (UnknownQuestion) is left as it is and answered so,
        with the question as it is now; the others are approved. One transaction, not one
        per question: a chapter's 500 approvals are one commit, in `approve`'s lock order."""
        out: list[Approval] = []
        with self._write() as conn:
            self._require_exam(conn, slug)
            self._exam_first(conn, slug)
            for question_id, version in items:
                out.append(self._approve_one(conn, slug, question_id, version, client))
        return out

    def _approve_one(self, conn: Connection, slug: str, question_id: int, version: int,
                     client: str) -> Approval:
        # Each refusal below is raised before its question's UPDATE, or after one that
        # changed no row: nothing for the transaction to undo.
        try:
            view = self._act_in(conn, slug, question_id, version, client, "approve")
        except VersionConflict as exc:
            return Approval(question_id, version, 409, str(exc), dict(exc.question))
        except Conflict as exc:
            return Approval(question_id, version, 409, str(exc),
                            self._current(conn, slug, question_id))
        except UnknownQuestion as exc:
            return Approval(question_id, version, 404, str(exc))
        return Approval(question_id, version, 200, None, view)

    def _act_in(self, conn: Connection, slug: str, question_id: int, version: int,
                client: str, action: str, *, changes: Mapping[str, Any] | None = None,
                note: str | None = None, near_dup: Checker | None = None) -> dict[str, Any]:
        """One review action in the caller's transaction, which holds the exam's row."""
        self._lock_chapter_slices(conn, slug, question_id)
        current = self._current(conn, slug, question_id)
        if current["version"] != version:
            raise self._conflict(current, version)
        state = current["review"]
        verb = {"approve": "approved", "reject": "rejected"}.get(action, "edited")
        if state == ReviewState.rejected.value:
            if action == "reject":
                return current  # already so
            raise Conflict(f"question {question_id} of exam {slug} was rejected: it is "
                           f"out of its chapter and cannot be {verb}")
        if current["withdrawn"] is not None:
            # Withdrawn for another reason (disputed by the blind solve): out of the bank
            # already, counted there as that. Rejecting it too would count it twice,
            # disputed in `status` and rejected in `review`.
            raise Conflict(f"question {question_id} of exam {slug} was withdrawn from its "
                           f"chapter ({current['withdrawn']}) and a replacement takes its "
                           f"number: it is out of the bank already and cannot be {verb}")
        values: dict[str, Any] = {}
        diff: dict[str, list[Any]] | None = None
        signed: neardup.Signed | None = None
        if action == "approve":
            if state == ReviewState.approved.value:
                return current
            values["review"] = ReviewState.approved.value
            values["stale"] = None
        elif action == "reject":
            values["review"] = ReviewState.rejected.value
        else:
            diff, values = _edit_values(current, changes or {})
            if not diff:
                return current
            if state in (ReviewState.approved.value, ReviewState.stale.value):
                values["review"] = ReviewState.unreviewed.value
                values["stale"] = None
                diff["review"] = [state, ReviewState.unreviewed.value]
            if "question" in diff:
                signed = self._new_text(conn, current, diff["question"][1], near_dup)
                values["norm_hash"] = text_hash(diff["question"][1])
            if current["verdict"] is not None and set(diff) & set(SOLVED_FIELDS):
                # Made for another question: solved again (a booked call, under the
                # exam's policy); its slice is pending again below.
                values.update(verdict=Verdict.pending.value, solved_index=None,
                              solved_answer=None, verify_call_id=None)
                diff["verdict"] = [current["verdict"], Verdict.pending.value]
        now = conn.execute(select(self._now)).scalar_one()
        done = conn.execute(update(Q).where(
            Q.c.id == question_id, Q.c.exam == slug, Q.c.version == version).values(
                **values, version=Q.c.version + 1, reviewed_by=client,
                reviewed_at=now)).rowcount
        if done != 1:  # another writer's commit got in between our read and this
            raise self._conflict(self._current(conn, slug, question_id), version)
        conn.execute(insert(QE).values(
            question_id=question_id, exam=slug, chapter_id=current["chapter_id"],
            number=current["number"], action=action, version=version + 1,
            client=client, at=now, note=note,
            changes=None if diff is None else json.dumps(diff, ensure_ascii=False)))
        if action == "reject":
            self._withdraw_rejected(conn, slug, [question_id])
        if signed is not None:
            # Its signature is the new text's: the old one would let a repeat of the new
            # text in, and refuse one of the old.
            neardup.forget_questions(conn, slug, [question_id])
            neardup.index(conn, slug, current["chapter_id"], [question_id], [signed])
        if values.get("verdict") == Verdict.pending.value and current["number"] is not None:
            self._reopen_slice_of(conn, slug, current["chapter_id"], current["number"])
        conn.execute(update(E).where(E.c.slug == slug).values(updated_at=now))
        return self._current(conn, slug, question_id)

    def _lock_chapter_slices(self, conn: Connection, slug: str, question_id: int) -> None:
        """Hold the slices of the question's chapter (FOR UPDATE, PostgreSQL) until the
        action commits: a worker's commit holds its slice's row from its fence on, so the
        action waits for a commit in progress and reads the slice as it left it, or the
        commit waits for the action and counts what it changed. Without it, a rejection
        could read a slice as running while its final commit, which had counted the
        rejected question, marked it done: a done slice with a gap (issue 27, defect 9)."""
        chapter_id = conn.execute(select(Q.c.chapter_id).where(
            Q.c.id == question_id, Q.c.exam == slug)).scalar()
        if chapter_id is None or self.engine.dialect.name != "postgresql":
            return
        conn.execute(select(S.c.slice_no).where(S.c.exam == slug, S.c.chapter_id == chapter_id)
                     .order_by(S.c.slice_no).with_for_update()).all()

    def _new_text(self, conn: Connection, current: Mapping[str, Any], text: str,
                  near_dup: Checker | None) -> neardup.Signed:
        """Refuse an edit's text that the bank has (DuplicateEdit, naming the other
        question), exactly (the chapter's `norm_hash`) or nearly (the scope's signatures);
        the new text's signature, to index."""
        slug, chapter_id, qid = current["exam"], current["chapter_id"], current["id"]
        same = conn.execute(select(Q.c.id, Q.c.number, Q.c.withdrawn_number).where(
            Q.c.exam == slug, Q.c.chapter_id == chapter_id, Q.c.norm_hash == text_hash(text),
            Q.c.id != qid).limit(1)).first()
        if same is not None:
            where = (f"number {same.number}" if same.number is not None else
                     f"withdrawn, it had number {same.withdrawn_number}")
            raise DuplicateEdit(f"question {same.id} of chapter {chapter_id} ({where}) has "
                                "this text already: nothing was changed", same.id,
                                same.number if same.number is not None
                                else same.withdrawn_number)
        head = conn.execute(select(S.c.title, S.c.language).where(
            S.c.exam == slug, S.c.chapter_id == chapter_id).limit(1)).first()
        signed = neardup.Signed.of(text, (head.title if head else None) or "",
                                   (head.language if head else None) or DEFAULT_LANGUAGE)
        if near_dup is None:  # NEAR_DUP_SCOPE=off: the signature is kept right all the same
            return signed
        # Lock order as a worker's commit: the exam row, the slices, then the scope's.
        neardup.lock(conn, slug, chapter_id, near_dup.scope)
        hits = neardup.near_of(conn, slug, chapter_id, near_dup, signed, qid)
        if hits:
            other = conn.execute(select(Q.c.id, Q.c.chapter_id, Q.c.number).where(
                Q.c.id.in_(hits), Q.c.number.is_not(None)).order_by(Q.c.id).limit(1)).first()
            if other is not None:
                raise DuplicateEdit(
                    f"question {other.id} of chapter {other.chapter_id} (number "
                    f"{other.number}) is a near-duplicate of this text: nothing was changed",
                    other.id, other.number)
        return signed

    def _reopen_slice_of(self, conn: Connection, slug: str, chapter_id: str,
                         number: int) -> None:
        """The done slice whose range holds `number` is pending again, with no enqueue
        recorded (as a rejection leaves it): a question of it awaits its blind solve."""
        conn.execute(update(S).where(
            S.c.exam == slug, S.c.chapter_id == chapter_id, S.c.first_number <= number,
            S.c.first_number + S.c.target > number, S.c.state == ChapterState.done.value)
            .values(state=ChapterState.pending.value, attempts_since_progress=0,
                    not_before_at=None, enqueued_at=None, enqueue_epoch=None,
                    updated_at=self._now))

    def _withdraw_rejected(self, conn: Connection, slug: str, question_ids: list[int]) -> None:
        """Take rejected questions out of their chapter's numbering in the rejecting
        transaction (Store.withdraw's, reason `rejected`): their numbers are free and a done
        slice that held one is pending again, so the next enqueue generates exactly the
        missing numbers."""
        self._withdraw(conn, slug, question_ids, Withdrawn.rejected)

    @staticmethod
    def _conflict(current: dict[str, Any], version: int) -> VersionConflict:
        return VersionConflict(
            f"question {current['id']} of exam {current['exam']} is at version "
            f"{current['version']}, not {version}: someone saved it since you read it "
            "(nothing was changed; read it again and redo your change)",
            current["version"], current)


def _edit_values(current: Mapping[str, Any],
                 changes: Mapping[str, Any]) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The fields an edit changes as {field: [before, after]}, and the row's new values."""
    kind = current.get("type") or "mcq"
    for name in changes:
        if name in EDITABLE[len(COMMON):] and name not in TYPED_FIELDS[kind]:
            raise BadEdit(f"{name}: not a field of a {kind} item")
    if kind in ("truefalse", "short", "numeric") and changes.get("choices") not in (None, []):
        raise BadEdit(f"choices: a {kind} item has no choices")
    if kind != "mcq" and "answer_index" in changes:
        raise BadEdit(f"answer_index: not a field of a {kind} item")
    merged = {name: changes.get(name, current[name]) for name in EDITABLE}
    for name in ("question", "explanation"):
        if isinstance(merged[name], str) and len(merged[name]) > MAX_TEXT_CHARS:
            raise BadEdit(f"{name}: over {MAX_TEXT_CHARS} characters")
    if isinstance(merged["choices"], list) and any(
            isinstance(c, str) and len(c) > MAX_TEXT_CHARS for c in merged["choices"]):
        raise BadEdit(f"choices: a choice over {MAX_TEXT_CHARS} characters")
    try:
        # Validated as a generated item of its type is (examforge.output.check_item).
        checked = check_item({"type": kind, **{k: merged[k] for k in COMMON[:4]},
                              **{k: merged[k] for k in TYPED_FIELDS[kind]}})
    except ItemInvalid as exc:
        raise BadEdit(str(exc)) from None
    if not checked.explanation:
        raise BadEdit("explanation: must be a non-empty string")
    for name, allowed in (("difficulty", DIFFICULTIES), ("bloom", BLOOM_LEVELS)):
        value = merged[name]
        if value is not None and value not in allowed:
            raise BadEdit(f"{name}: must be one of {', '.join(allowed)}, or null")
    after = {"question": checked.question, "choices": list(checked.choices),
             "answer_index": checked.answer_index, "explanation": checked.explanation,
             "difficulty": merged["difficulty"], "bloom": merged["bloom"],
             **dict.fromkeys(EDITABLE[len(COMMON):]),
             **item_types.reply_fields(kind, item_types.load(checked.answer))}
    diff = {name: [current[name], after[name]] for name in EDITABLE
            if after[name] != current[name]}
    values = {name: after[name] for name in diff if name in COMMON}
    if "choices" in values:
        values["choices"] = json.dumps(values["choices"], ensure_ascii=False)
    if set(diff) - set(COMMON):
        values["answer"] = checked.answer
    return diff, values
