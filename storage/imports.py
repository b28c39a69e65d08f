"""Imports: questions paid for elsewhere (the naive script's checkpoint file, another
database's export) stored as a chapter's own, so that the next `enqueue` asks the provider
only for the rest.

Imported questions fill each slice's free numbers in slice order, from the slice's next
number (its first number plus what its range holds): the numbers of a range stay contiguous,
which is what a commit relies on when it numbers a batch from the stored count. A slice whose
range is full becomes done. The whole import is one transaction under the slices' row locks,
refused while a worker holds a live lease on any slice of a chapter it writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from examforge.balance import balanced
from examforge.errors import ChapterBusy, UnknownChapter
from examforge.levels import known_levels
from examforge.languages import DEFAULT_LANGUAGE
from examforge.neardup import Checker
from examforge.output import Question as ParsedQuestion
from examforge.output import text_hash
from storage import neardup
from storage.base import E, K, Q, S
from storage.ledger import Ledger, question_row
from storage.models import CallOutcome, ChapterState, Verdict, VerifyPolicy

# What an imported question says of its origin (Question.model, Call.model, Call.worker).
IMPORT_MODEL = "import"


@dataclass(frozen=True)
class FilledSlice:
    """What an import stored in one slice: numbers `first` to `first + count - 1`."""

    slice_no: int
    first: int
    count: int
    done: bool  # its range is full now
    call_id: int


@dataclass
class ChapterImport:
    """One chapter's part of an import: what was stored, and what was skipped and why."""

    chapter_id: str
    imported: int = 0
    already_stored: int = 0  # the chapter already had the same normalised text
    repeated: int = 0  # the same normalised text came earlier in the file
    near_duplicates: int = 0  # a near-duplicate of a stored question or of one earlier in it
    past_target: int = 0  # the chapter's ranges were full
    slices: list[FilledSlice] = field(default_factory=list)


@dataclass
class ImportResult:
    exam: str
    chapters: list[ChapterImport]

    @property
    def imported(self) -> int:
        return sum(c.imported for c in self.chapters)

    @property
    def already_stored(self) -> int:
        return sum(c.already_stored for c in self.chapters)

    @property
    def repeated(self) -> int:
        return sum(c.repeated for c in self.chapters)

    @property
    def near_duplicates(self) -> int:
        return sum(c.near_duplicates for c in self.chapters)

    @property
    def past_target(self) -> int:
        return sum(c.past_target for c in self.chapters)


@dataclass
class _Range:
    slice_no: int
    next_number: int
    room: int
    end: int  # the range's last number
    target: int = 0  # the range's size


class Imports(Ledger):
    """Store questions that were paid for elsewhere as an exam's own."""

    def chapter_ids(self, slug: str) -> list[str] | None:
        """The exam's chapters in syllabus order, or None when the exam is not recorded."""
        with self._read() as conn:
            if conn.execute(select(E.c.slug).where(E.c.slug == slug)).first() is None:
                return None
            rows = conn.execute(select(S.c.chapter_id, S.c.position).where(S.c.exam == slug)
                                .distinct().order_by(S.c.position, S.c.chapter_id)).all()
        return [r.chapter_id for r in rows]

    def import_questions(self, slug: str, questions: Mapping[str, Sequence[ParsedQuestion]],
                         source: str, near_dup: Checker | None = None) -> ImportResult:
        """Store `questions` (by chapter, in file order) as the exam's, after what is stored
        and up to each chapter's target, in one transaction. Questions whose normalised text
        the chapter already has, or that repeat one earlier in `questions`, are skipped and
        counted; so are those past the target. Each slice filled gets one ledger row of its
        own (outcome `imported`, cost 0, `detail` naming `source`) that its questions point
        to. With `near_dup`, near-duplicates (of a stored question of the scope, or of one
        earlier in `questions`) are skipped and counted too, as a commit rejects them.
        Raises UnknownChapter, or ChapterBusy (nothing stored) while a worker holds a live
        lease on a slice of one of these chapters."""
        wanted = [c for c in questions if questions[c]]
        # A first look without locks: refusing here saves taking locks a heartbeat may want.
        with self._read() as conn:
            self._require_exam(conn, slug)
            self._refuse_busy(conn, slug, wanted)
        with self._write() as conn:
            self._require_exam(conn, slug)
            self._exam_first(conn, slug)  # lock order: settling dead calls updates the exam
            # Every slice of the exam, in the order enqueue locks them: a claim or a commit
            # of one of these chapters waits for this import and then sees its questions.
            conn.execute(select(S.c.slice_no).where(S.c.exam == slug)
                         .order_by(S.c.chapter_id, S.c.slice_no).with_for_update()).all()
            self._refuse_busy(conn, slug, wanted)
            now = conn.execute(select(self._now)).scalar_one()
            ranges = self._free_ranges(conn, slug)
            missing = [c for c in wanted if c not in ranges]
            if missing:
                raise UnknownChapter(f"chapter {missing[0]!r} is not a chapter of exam {slug}")
            # No live lease on these chapters (refused above): a call still in flight on one
            # of them belongs to a dead holder. Settled now, before the slices it was for are
            # filled and done (Ledger._settle_orphans).
            self._settle_orphans(conn, slug, wanted)
            # Under a policy that verifies, a question bought elsewhere never had a blind
            # solve: it is owed one (a pending verdict is work: the next run of its slice
            # solves it once), as a question stored before the policy was raised is.
            verifying = conn.execute(select(E.c.verify).where(E.c.slug == slug)
                                     ).scalar_one() != VerifyPolicy.off.value
            result = ImportResult(slug, [])
            for chapter_id in wanted:
                result.chapters.append(self._import_chapter(
                    conn, slug, chapter_id, questions[chapter_id], ranges[chapter_id],
                    source, now, near_dup, verifying))
        return result

    def _refuse_busy(self, conn: Connection, slug: str, chapter_ids: Sequence[str]) -> None:
        if not chapter_ids:
            return
        held = conn.execute(
            select(S.c.chapter_id, S.c.slice_no, S.c.lease_owner, S.c.lease_expires_at)
            .where(S.c.exam == slug, S.c.chapter_id.in_(list(chapter_ids)),
                   S.c.lease_owner.is_not(None), S.c.lease_expires_at > self._now)
            .order_by(S.c.chapter_id, S.c.slice_no)).all()
        if not held:
            return
        first = held[0]
        until = datetime.fromtimestamp(first.lease_expires_at, timezone.utc)
        others = f" (and {len(held) - 1} more slices)" if len(held) > 1 else ""
        raise ChapterBusy(
            f"{slug}/{first.chapter_id} is being generated: slice {first.slice_no} is held by "
            f"worker {first.lease_owner} until {until:%H:%M:%S} UTC{others}; nothing was "
            f"imported. Import when it is done, or cancel it first "
            f"(python -m producer cancel {slug} --chapter {first.chapter_id})")

    def _free_ranges(self, conn: Connection, slug: str) -> dict[str, list[_Range]]:
        """Each chapter's slices in number order, with where each range goes on."""
        out: dict[str, list[_Range]] = {}
        rows = self._slice_rows(conn, slug, S.c.first_number, S.c.target)
        for r in sorted(rows, key=lambda r: (r.chapter_id, r.first_number)):
            stored = min(r.stored, r.target)
            out.setdefault(r.chapter_id, []).append(_Range(
                r.slice_no, r.first_number + stored, r.target - stored,
                r.first_number + r.target - 1, r.target))
        return out

    def _import_chapter(self, conn: Connection, slug: str, chapter_id: str,
                        questions: Sequence[ParsedQuestion], ranges: list[_Range],
                        source: str, now: float, near_dup: Checker | None,
                        verifying: bool = False) -> ChapterImport:
        report = ChapterImport(chapter_id)
        # Rows stored before norm_hash existed have none: compare their text instead.
        stored = {h or text_hash(text) for h, text in conn.execute(
            select(Q.c.norm_hash, Q.c.question).where(Q.c.exam == slug,
                                                      Q.c.chapter_id == chapter_id))}
        seen: set[str] = set()
        fresh: list[tuple[ParsedQuestion, str]] = []
        for q in questions:
            h = text_hash(q.question)
            if h in stored:
                report.already_stored += 1
                continue
            if h in seen:
                report.repeated += 1
                continue
            seen.add(h)
            fresh.append((q, h))
        head = conn.execute(select(S.c.title, S.c.language).where(
            S.c.exam == slug, S.c.chapter_id == chapter_id).limit(1)).first()
        title = (head.title if head else None) or ""
        language = (head.language if head else None) or DEFAULT_LANGUAGE
        signed = dict(zip((h for _, h in fresh),
                          neardup.Signed.many([q.question for q, _ in fresh], title, language)))
        if near_dup is not None and fresh:
            verdict = neardup.check(conn, slug, chapter_id, near_dup,
                                    [signed[h] for _, h in fresh])
            report.near_duplicates = verdict.rejected
            fresh = [f for f, ok in zip(fresh, verdict.keep) if ok]
        batches: dict[int, list[tuple[ParsedQuestion, str]]] = {}
        free = iter(r for r in ranges if r.room > 0)
        current = next(free, None)
        for q, h in fresh:
            while current is not None and current.room == 0:
                current = next(free, None)
            if current is None:
                report.past_target += 1
                continue
            batches.setdefault(current.slice_no, []).append((q, h))
            current.room -= 1
        by_no = {r.slice_no: r for r in ranges}
        for slice_no, batch in batches.items():
            r = by_no[slice_no]
            # The range's free numbers, lowest first (a withdrawn question's is one of them).
            numbers = self._free_numbers(conn, slug, chapter_id, r.end - r.target + 1,
                                         r.target)[:len(batch)]
            first = numbers[0]
            call_id = conn.execute(insert(K).values(
                exam=slug, chapter_id=chapter_id, slice_no=slice_no, attempt=0,
                first_number=first, requested=len(batch), worker=IMPORT_MODEL,
                outcome=CallOutcome.imported.value, reason=None,
                detail=f"import from {source}"[:1000], status_code=None, prompt_tokens=0,
                completion_tokens=0, cost_usd=0.0, questions_stored=len(batch),
                endpoint=None, model=IMPORT_MODEL, reserved_usd=0.0, usage_estimated=False,
                price_known=True, started_at=now, finished_at=now).returning(K.c.id)
            ).scalar_one()
            # Balanced like generated questions (examforge.balance: idempotent, so a bank
            # exported by examforge comes back in its own order), with the levels a file
            # names only when they are known ones.
            self._questions_in_order(conn, slug)
            ids = conn.execute(insert(Q).returning(Q.c.id, sort_by_parameter_order=True), [
                {"exam": slug, "chapter_id": chapter_id, "number": n,
                 "norm_hash": h, "model": IMPORT_MODEL, "call_id": call_id, "created_at": now,
                 **question_row(known_levels(balanced(q, slug, chapter_id, n))),
                 **({"verdict": Verdict.pending.value} if verifying else {})}
                for n, (q, h) in zip(numbers, batch)]).scalars().all()
            # Indexed like generated questions, so that the model's repeats of them are caught.
            neardup.index(conn, slug, chapter_id, ids, [signed[h] for _, h in batch])
            done = r.room == 0
            values: dict[str, Any] = {"updated_at": now}
            if done:
                values.update(state=ChapterState.done.value, lease_owner=None,
                              lease_expires_at=None)
            conn.execute(update(S).where(S.c.exam == slug, S.c.chapter_id == chapter_id,
                                         S.c.slice_no == slice_no).values(**values))
            report.imported += len(batch)
            report.slices.append(FilledSlice(slice_no, first, len(batch), done, call_id))
        report.slices.sort(key=lambda s: s.first)
        return report
