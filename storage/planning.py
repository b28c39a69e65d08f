"""Enqueue planning: record an exam and its chapters, decide which chapters need a task, and
the exam-wide switches (budget, pause, resume, cancel)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import bindparam, case, delete, func, select, update
from sqlalchemy.engine import Connection

from examforge.errors import PauseCode, UnknownChapter
from examforge.languages import DEFAULT_LANGUAGE
from examforge.syllabus import Chapter as SyllabusChapter
from examforge.syllabus import Syllabus, slice_ranges
from examforge.sources import ChapterMaterial
from storage.base import ACTIVE_STATES, IN_FLIGHT_CALL, E, K, Q, S
from storage.grounding import forget_passages, write_passages
from storage.ledger import Ledger
from storage.models import ChapterState, ExamState, RequeueReason, Verdict, VerifyPolicy
from storage.regeneration import ChapterRegeneration, apply_chapter, plan_chapter


# A slice as the producer publishes it: (chapter_id, slice_no).
SliceRef = tuple[str, int]

DEFAULT_SLICE_QUESTIONS = 50


@dataclass
class EnqueuePlan:
    to_enqueue: list[str] = field(default_factory=list)  # chapters with work, in order
    slices: list[SliceRef] = field(default_factory=list)  # their slices that need a task
    skipped: dict[str, str] = field(default_factory=dict)  # chapter -> why
    exam_paused: str | None = None
    verify: str = VerifyPolicy.off.value  # the exam's blind-solve policy, as recorded
    language: str = DEFAULT_LANGUAGE  # the exam's language (BCP 47), as recorded
    to_solve: int = 0  # stored questions never solved, made pending by a verifying policy
    # --regenerate: what each chapter cut afresh kept, deleted and generates.
    regenerated: dict[str, ChapterRegeneration] = field(default_factory=dict)


class Planning(Ledger):
    """Exams, chapters and their slices as the producer sees them."""

    def _ensure_exam(self, conn: Connection, slug: str, title: str, now: float,
                     budget_usd: float | None, verify: str = VerifyPolicy.off.value,
                     language: str = DEFAULT_LANGUAGE) -> None:
        """Create the exam's row if it is missing, and hold it (FOR NO KEY UPDATE on
        PostgreSQL) until the transaction ends.

        INSERT .. ON CONFLICT DO NOTHING takes no lock on the row it finds, so a `prune` of a
        finished exam could delete that row between the insert and our first slice: the
        slices' foreign key would then fail. Holding the row makes a concurrent prune see the
        exam as busy; and if a prune deleted it before we could take it (the locking read
        finds nothing), it is simply inserted again."""
        for _ in range(3):
            conn.execute(
                self._insert(E)
                .values(slug=slug, title=title, state=ExamState.active.value,
                        auth_failures=0, created_at=now, updated_at=now, budget_usd=budget_usd,
                        verify=verify, language=language)
                .on_conflict_do_nothing()
            )
            held = conn.execute(select(E.c.slug).where(E.c.slug == slug)
                                .with_for_update(key_share=True)).first()
            if held is not None:
                return
        raise RuntimeError(f"exam {slug}: its row was deleted three times while enqueueing")

    def sync_exam(
        self, slug: str, syllabus: Syllabus, regenerate: Iterable[str] = (), *,
        budget_usd: float | None = None, default_budget_usd: float | None = None,
        slice_questions: int = DEFAULT_SLICE_QUESTIONS,
        material: Mapping[str, ChapterMaterial] | None = None,
        verify: VerifyPolicy | str | None = None,
        default_verify: VerifyPolicy | str = VerifyPolicy.off, batch_mode: bool = False,
        discard_reviewed: bool = False,
    ) -> EnqueuePlan:
        """Record the exam and its chapters' slices; decide which slices need a task.

        A new chapter is cut into slices of `slice_questions` (SLICE_QUESTIONS) questions; a
        chapter's slices keep their ranges for life (their questions are numbered within
        them), so a raised target adds slices for the new numbers and a lowered one trims the
        ranges past it. `--regenerate` cuts a chapter again: its slices and unreviewed
        questions are deleted, its approved and edited ones kept and marked stale (and its
        rejected ones kept out of the bank, for the record), unless `discard_reviewed`
        (storage.regeneration); `plan.regenerated` says what each kept, deleted and
        generates.

        `budget_usd` sets the exam's budget (a raised one resumes an exam its budget paused);
        a new exam given none gets `default_budget_usd` (BUDGET_USD).

        `material` is each chapter's sources as read (examforge.sources; producer.grounding
        reads them): its passages are written with the chapter's slices, and a chapter whose
        source files changed (by hash) since its questions were stored is left as it is,
        like a changed title, until `--regenerate`. None (import) leaves passages alone.

        The syllabus's `language` is recorded on the exam, and each chapter's (its own, else
        the exam's) on its slices, where the workers read it; a chapter whose language
        changed since its questions were stored is left as it is, like a changed title,
        until `--regenerate`.

        `verify` sets the exam's blind-solve policy (storage.models.VerifyPolicy); a new exam
        given none gets `default_verify` (the enqueuing process's VERIFY), and an existing
        one keeps its own. A policy that verifies (given now, or already the exam's) makes
        every stored question never solved (verdict NULL: stored under `off`, or by a
        provider batch) pending: its solve is then work, like every pending verdict
        (`plan.to_solve` counts them). Lowering a policy deletes no verdict; under `off`
        pending verdicts are not work (nothing solves them), nor in `batch_mode` (a provider
        batch sends no blind solve; the exam's questions are stored unverified).

        Safe under concurrent calls: rows are created with INSERT .. ON CONFLICT DO NOTHING and
        changed under the slices' row locks.
        """
        regenerate = set(regenerate)
        plan = EnqueuePlan()
        if verify is None:
            verify = syllabus.verify  # the syllabus's own policy, if it names one
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            self._ensure_exam(conn, slug, syllabus.title, now,
                              budget_usd if budget_usd is not None else default_budget_usd,
                              VerifyPolicy(default_verify).value, syllabus.language)
            if verify is not None:
                conn.execute(update(E).where(E.c.slug == slug,
                                             E.c.verify != VerifyPolicy(verify).value)
                             .values(verify=VerifyPolicy(verify).value, updated_at=now))
            conn.execute(update(E).where(E.c.slug == slug, E.c.title != syllabus.title)
                         .values(title=syllabus.title, updated_at=now))
            conn.execute(update(E).where(E.c.slug == slug, E.c.language != syllabus.language)
                         .values(language=syllabus.language, updated_at=now))
            if budget_usd is not None:
                self._set_budget(conn, slug, budget_usd)
            else:
                # Calls of dead holders (a trimmed, regenerated or any other slice with no
                # live lease) are settled here, not left reserved (`_settle_orphans`).
                self._settle_orphans(conn, slug)
            exam = conn.execute(select(E.c.state, E.c.pause_reason, E.c.verify, E.c.language)
                                .where(E.c.slug == slug)).one()
            if exam.state == ExamState.paused.value:
                plan.exam_paused = exam.pause_reason or "paused"
            plan.verify = exam.verify
            plan.language = exam.language
            verifying = exam.verify != VerifyPolicy.off.value and not batch_mode
            if verifying and verify is not None:
                # The questions stored unverified are owed a solve under this policy: each
                # is solved once, by its slice's holder (runner.verify), as a booked call.
                plan.to_solve = conn.execute(update(Q).where(
                    Q.c.exam == slug, Q.c.number.is_not(None), Q.c.verdict.is_(None))
                    .values(verdict=Verdict.pending.value)).rowcount
            # In bulk: a few reads of the whole exam and the changes grouped into executemany
            # statements (a 10,000-chapter exam is a handful of statements, not 40,000).
            # First the structure: which slices exist, with which ranges and chapter fields.
            rows: dict[str, list[Any]] = defaultdict(list)
            for r in conn.execute(select(S).where(S.c.exam == slug)
                                  .order_by(S.c.chapter_id, S.c.slice_no).with_for_update()):
                rows[r.chapter_id].append(r)
            # The questions in the bank: a withdrawn one (rejected, disputed) is history, not
            # a question a changed title, prompt or source would contradict.
            stored: dict[str, int] = dict(conn.execute(  # type: ignore[arg-type]
                select(Q.c.chapter_id, func.count()).where(Q.c.exam == slug,
                                                           Q.c.number.is_not(None))
                .group_by(Q.c.chapter_id)).all())
            fresh: list[dict[str, Any]] = []
            changes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
            wiped: list[str] = []
            held: dict[str, str] = {}  # chapters left as they are, and why
            grounded: list[tuple[str, ChapterMaterial]] = []  # passages to (re)write
            for position, ch in enumerate(syllabus.chapters):
                chapter_rows = rows.get(ch.id, [])
                known = material.get(ch.id) if material is not None else None
                why, values, cut_from, wipe = _plan_structure(
                    ch, position, chapter_rows, stored.get(ch.id, 0),
                    ch.id in regenerate, now, known)
                if why is not None:
                    held[ch.id] = why
                    continue
                if known is not None and (not chapter_rows or wipe or "sources" in values) \
                        and (known.passages or (chapter_rows and chapter_rows[0].sources)):
                    grounded.append((ch.id, known))
                sources = (known.hashes_json if known is not None
                           else chapter_rows[0].sources if chapter_rows else None)
                if wipe:
                    wiped.append(ch.id)
                    plan.regenerated[ch.id] = plan_chapter(
                        conn, slug, ch.id, ch.questions,
                        _change_of(ch, chapter_rows[0], known), discard_reviewed)
                    rows[ch.id] = []
                next_no = max((r.slice_no for r in rows.get(ch.id, [])), default=-1) + 1
                for i, (first, count) in enumerate(
                        slice_ranges(cut_from, ch.questions, slice_questions)):
                    fresh.append({"exam": slug, "chapter_id": ch.id, "slice_no": next_no + i,
                                  "first_number": first, "target": count,
                                  "position": position, "title": ch.title,
                                  "prompt": ch.prompt, "spec_hash": ch.spec_hash,
                                  "language": _language(ch),
                                  **_levels(ch), "sources": sources,
                                  "state": ChapterState.pending.value, "updated_at": now})
                for r in rows.get(ch.id, []):
                    row_values = dict(values)
                    trimmed = max(0, min(r.target, ch.questions - r.first_number + 1))
                    if trimmed != r.target:
                        row_values["target"] = trimmed
                    if row_values:
                        changes[tuple(sorted(row_values))].append(
                            {"_cid": ch.id, "_sno": r.slice_no, **row_values})
            for chapter_id in wiped:
                apply_chapter(conn, slug, plan.regenerated[chapter_id], now)
            for chunk in _chunks(wiped, 500):
                conn.execute(delete(S).where(S.c.exam == slug, S.c.chapter_id.in_(chunk)))
                forget_passages(conn, slug, chunk)
            for chapter_id, known in grounded:
                write_passages(conn, slug, chapter_id, known.passages)
            for columns, batch in changes.items():
                conn.execute(update(S).where(S.c.exam == slug,
                                             S.c.chapter_id == bindparam("_cid"),
                                             S.c.slice_no == bindparam("_sno"))
                             .values({c: bindparam(c) for c in columns}), batch)
            for chunk in _chunks(fresh, 500):
                conn.execute(self._insert(S).on_conflict_do_nothing(), chunk)
            # Then the work: each slice's state from what its range holds.
            # A slice is done when its range is full and, under a verifying policy, none of
            # its verdicts is pending: a pending verdict is work (its blind solve is owed).
            slices: dict[str, list[Any]] = defaultdict(list)
            for r in self._slice_rows(conn, slug, S.c.target, S.c.state, S.c.lease_owner,
                                      S.c.lease_expires_at, pending=True):
                slices[r.chapter_id].append(r)
            states: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
            for ch in syllabus.chapters:
                if ch.id in held:
                    plan.skipped[ch.id] = held[ch.id]
                    continue
                wanted: list[SliceRef] = []
                reasons: set[str] = set()
                for r in slices.get(ch.id, []):
                    why, values = _plan_slice(r, now, r.pending if verifying else 0)
                    if values:
                        states[tuple(sorted(values))].append(
                            {"_cid": ch.id, "_sno": r.slice_no, "updated_at": now, **values})
                    if why is None:
                        wanted.append((ch.id, r.slice_no))
                    else:
                        reasons.add(why)
                if wanted and plan.exam_paused is None:
                    plan.to_enqueue.append(ch.id)
                    plan.slices.extend(wanted)
                elif wanted:
                    plan.skipped[ch.id] = f"exam paused: {plan.exam_paused}"
                else:
                    plan.skipped[ch.id] = (
                        "cancelled" if "cancelled" in reasons else
                        "running: a worker holds it and finishes it" if "running" in reasons
                        else "done")
            for columns, batch in states.items():
                conn.execute(update(S).where(S.c.exam == slug,
                                             S.c.chapter_id == bindparam("_cid"),
                                             S.c.slice_no == bindparam("_sno"))
                             .values({c: bindparam(c) for c in columns + ("updated_at",)}),
                             batch)
            if wiped or changes or fresh or states:
                # The exam's own row says it changed: GET /metrics re-reads an exam whose row
                # moved (producer.api.metrics), even one reopened and finished between two
                # scrapes.
                conn.execute(update(E).where(E.c.slug == slug).values(updated_at=now))
        return plan

    def regeneration_preview(self, slug: str, syllabus: Syllabus, chapter_ids: Iterable[str],
                             *, discard_reviewed: bool = False,
                             material: Mapping[str, ChapterMaterial] | None = None
                             ) -> dict[str, ChapterRegeneration]:
        """What `--regenerate` of `chapter_ids` would keep, delete and generate (the dry
        run), read as the real command reads it; nothing is written. A chapter with no
        slices yet is generated as a new one and not listed."""
        wanted = set(chapter_ids)
        out: dict[str, ChapterRegeneration] = {}
        with self._read() as conn:
            for ch in syllabus.chapters:
                if ch.id not in wanted:
                    continue
                head = conn.execute(select(S).where(S.c.exam == slug, S.c.chapter_id == ch.id)
                                    .order_by(S.c.slice_no).limit(1)).first()
                if head is None:
                    continue
                known = material.get(ch.id) if material is not None else None
                out[ch.id] = plan_chapter(conn, slug, ch.id, ch.questions,
                                          _change_of(ch, head, known), discard_reviewed)
        return out

    def set_budget(self, slug: str, budget_usd: float) -> None:
        """Set the exam's budget; a raised one resumes an exam that its budget paused."""
        with self._write() as conn:
            self._require_exam(conn, slug)
            self._set_budget(conn, slug, budget_usd)

    def _set_budget(self, conn: Connection, slug: str, budget_usd: float) -> None:
        # FOR UPDATE waits for every call starting or settling (they hold the row in KEY
        # SHARE mode), so the totals computed here from the ledger include all of them.
        conn.execute(select(E.c.slug).where(E.c.slug == slug).with_for_update())
        # No reservation of a dead holder survives the recount: its call is settled first.
        self._settle_orphans(conn, slug)
        spent, reserved = conn.execute(
            select(func.coalesce(func.sum(K.c.cost_usd), 0.0),
                   func.coalesce(func.sum(case((IN_FLIGHT_CALL,
                                                K.c.reserved_usd), else_=0.0)), 0.0))
            .where(K.c.exam == slug)).one()
        conn.execute(update(E).where(E.c.slug == slug).values(
            budget_usd=budget_usd, spent_usd=spent, reserved_usd=reserved, updated_at=self._now))
        # Paused because the budget ran out, and the new one leaves room: carry on.
        conn.execute(update(E).where(
            E.c.slug == slug, E.c.state == ExamState.paused.value,
            E.c.pause_code == PauseCode.budget.value,
            E.c.spent_usd + E.c.reserved_usd < budget_usd)
            .values(state=ExamState.active.value, pause_reason=None, pause_code=None,
                    updated_at=self._now))

    def mark_enqueued(self, slug: str, slices: Sequence[SliceRef], epoch: str | None,
                      requeue: tuple[RequeueReason, str] | None = None) -> None:
        """Record that a message is about to be published for each slice. With `requeue`
        (a code and its detail), the reconciler is re-publishing them: count it and say why."""
        if not slices:
            return
        with self._write() as conn:
            # One moment for the whole enqueue, read once: the clock moves between the rows of
            # one statement (clock_timestamp() on PostgreSQL, 'now' per step on SQLite), and
            # `lost_messages` orders one enqueue's slices by position, not by those drifts.
            now = conn.execute(select(self._now)).scalar_one()
            values: dict[str, Any] = {"enqueued_at": now, "enqueue_epoch": epoch}
            if requeue is not None:
                code, why = requeue
                values.update(requeues=S.c.requeues + 1, requeued_at=now,
                              requeue_code=code.value, requeue_reason=why[:500])
            # One statement run for every slice (executemany: pipelined by psycopg), each a
            # lookup by primary key. A `(chapter_id, slice_no) IN (...)` list of 1,000 was
            # checked against every slice of the exam on PostgreSQL: 14 s at 20,000 slices,
            # growing with their square (issue 16, bench/syllabus_size.py).
            conn.execute(update(S).where(S.c.exam == slug, S.c.chapter_id == bindparam("_cid"),
                                         S.c.slice_no == bindparam("_sno")).values(**values),
                         [{"_cid": c, "_sno": n} for c, n in slices])

    def resume(self, slug: str) -> list[SliceRef]:
        """Clear a pause and reset failed slices to pending; returns the slices to enqueue
        (every unfinished one: a paused exam's messages may have been consumed meanwhile)."""
        with self._write() as conn:
            self._require_exam(conn, slug)
            code = conn.execute(select(E.c.pause_code).where(E.c.slug == slug)
                                .with_for_update()).scalar_one()
            if code == PauseCode.disputes.value:
                # Each slice counts its solver's disputes afresh from here (the person has
                # checked VERIFY_MODEL): past every question stored so far.
                conn.execute(update(S).where(S.c.exam == slug).values(
                    disputes_from=select(func.coalesce(func.max(Q.c.id), 0))
                    .where(Q.c.exam == slug).scalar_subquery()))
            conn.execute(update(E).where(E.c.slug == slug).values(
                state=ExamState.active.value, pause_reason=None, pause_code=None,
                auth_failures=0, updated_at=self._now))
            self._reset_failed(conn, slug, None)
            return [(r.chapter_id, r.slice_no) for r in conn.execute(
                select(S.c.chapter_id, S.c.slice_no)
                .where(S.c.exam == slug, S.c.state.in_(ACTIVE_STATES))
                .order_by(S.c.position, S.c.slice_no))]

    def retry_failed(self, slug: str, chapter_ids: Sequence[str] | None = None
                     ) -> list[SliceRef]:
        """Reset the failed slices (of `chapter_ids`, or all) to pending with fresh attempt
        budgets, leaving a pause as it is; returns them, to enqueue."""
        with self._write() as conn:
            self._require_exam(conn, slug)
            return self._reset_failed(conn, slug, chapter_ids)

    def _reset_failed(self, conn: Connection, slug: str,
                      chapter_ids: Sequence[str] | None) -> list[SliceRef]:
        where = [S.c.exam == slug, S.c.state == ChapterState.failed.value]
        if chapter_ids:
            where.append(S.c.chapter_id.in_(chapter_ids))
        rows = conn.execute(update(S).where(*where).values(
            state=ChapterState.pending.value, attempts_since_progress=0, not_before_at=None,
            updated_at=self._now).returning(S.c.chapter_id, S.c.slice_no, S.c.position)).all()
        return [(r.chapter_id, r.slice_no) for r in sorted(rows, key=lambda r: (
            r.position, r.slice_no))]

    def cancel(self, slug: str, chapter_ids: Sequence[str] | None = None) -> int:
        """Cancel the slices of chapters that are not done. Returns the number of chapters with
        a slice cancelled.

        A slice whose holder is in a call keeps the holder's lease: that call is paid for
        whatever we do, so its reply is committed when it comes (the commit sees the cancel,
        plans no next call and gives the lease up). Nothing more is sent for the slice: a
        call recorded but not sent yet is checked right before its send (Ledger.may_send). A
        holder that dies meanwhile loses nothing more than a crash would: its lease lapses,
        and the reconciler settles its call. Calls in flight whose holder is already dead
        are settled here, in the same transaction (Ledger._settle_orphans).

        Raises UnknownChapter, cancelling nothing, if a chapter id is not one of the exam's: a typo
        must not read as "nothing left to cancel"."""
        with self._write() as conn:
            self._require_exam(conn, slug)
            self._exam_first(conn, slug)
            where = [S.c.exam == slug, S.c.state.in_(ACTIVE_STATES + (ChapterState.failed.value,))]
            if chapter_ids:
                known = set(conn.execute(select(S.c.chapter_id).where(
                    S.c.exam == slug, S.c.chapter_id.in_(chapter_ids)).distinct()).scalars())
                unknown = [c for c in chapter_ids if c not in known]
                if unknown:
                    raise UnknownChapter(f"chapter {unknown[0]!r} is not in exam {slug}")
                where.append(S.c.chapter_id.in_(chapter_ids))
            cancelled = len(set(self._cancel_slices(conn, where)))
            # The calls of dead holders are settled now (a live holder's call settles when
            # its reply comes back), so no reservation outlives them.
            self._settle_orphans(conn, slug, chapter_ids or None)
            return cancelled

    def cancelled_in_flight(self, slug: str, chapter_ids: Sequence[str] | None = None) -> int:
        """How many of the exam's cancelled chapters (of `chapter_ids`, or all) still have a
        call in flight under a live lease: its reply is paid for, kept when it comes, and may
        finish its chapter (`cancel` says so)."""
        where = [K.c.exam == slug, IN_FLIGHT_CALL,
                 S.c.state == ChapterState.cancelled.value]
        if chapter_ids:
            where.append(K.c.chapter_id.in_(list(chapter_ids)))
        with self._read() as conn:
            return int(conn.execute(
                select(func.count(func.distinct(K.c.chapter_id)))
                .select_from(K.join(S, (S.c.exam == K.c.exam) & (S.c.chapter_id == K.c.chapter_id)
                                    & (S.c.slice_no == K.c.slice_no)))
                .where(*where)).scalar_one())

    def pause_exam(self, slug: str, reason: str, code: PauseCode) -> bool:
        """Stop sending anything for the exam until a person acts (`resume`, or a raised budget
        for `PauseCode.budget`). Running calls finish and are kept. False if it was not active
        (already paused)."""
        with self._write() as conn:
            return conn.execute(update(E).where(
                E.c.slug == slug, E.c.state == ExamState.active.value).values(
                state=ExamState.paused.value, pause_reason=reason[:500], pause_code=code.value,
                updated_at=self._now)).rowcount == 1


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _plan_structure(ch: SyllabusChapter, position: int, rows: list[Any], stored: int,
                    regenerate: bool, now: float, material: ChapterMaterial | None = None
                    ) -> tuple[str | None, dict[str, Any], int, bool]:
    """What enqueue does to one chapter's slices: (why it is left as it is, or None; the
    chapter fields that change on every slice; the first number new slices start at, past
    the existing ranges; whether its questions and slices are deleted first, to cut it
    afresh)."""
    # The last number any slice covers (a slice trimmed to nothing by a lowered target covers
    # none: its numbers go to the slices a raise adds).
    end = max((r.first_number + r.target - 1 for r in rows if r.target > 0), default=0)
    if not rows:
        return None, {}, 1, False
    if regenerate:
        if any(r.lease_owner is not None and (r.lease_expires_at or 0) > now for r in rows):
            return ("running: cannot regenerate while a worker holds it; retry later", {}, 0,
                    False)
        return None, {}, 1, True
    values: dict[str, Any] = {}
    head = rows[0]
    if head.spec_hash != ch.spec_hash:
        if stored > 0:
            what = ("title or prompt" if (head.title, head.prompt) != (ch.title, ch.prompt)
                    else f"language ({head.language}, now {_language(ch)})"
                    if head.language != _language(ch)
                    else f"item types ({head.types or 'all mcq'}, now {_types(ch) or 'all mcq'})")
            return (f"changed: {what} differs from the {stored} stored questions; "
                    f"rerun with --regenerate {ch.id}"), {}, 0, False
        values.update(title=ch.title, prompt=ch.prompt, spec_hash=ch.spec_hash,
                      language=_language(ch))
    if material is not None and head.sources != material.hashes_json:
        if stored > 0:
            return (f"changed: {_changed_source(head.sources, material.hashes)} since the "
                    f"{stored} stored questions were written; rerun with --regenerate {ch.id}"
                    ), {}, 0, False
        values["sources"] = material.hashes_json
    if head.position != position:
        values["position"] = position
    # A changed difficulty or Bloom list applies to the questions still to come: each stored
    # one keeps the levels it was written at, so it needs no --regenerate.
    levels = _levels(ch)
    if (head.difficulty, head.bloom, head.types) != (
            levels["difficulty"], levels["bloom"], levels["types"]):
        values.update(levels)
    if values:
        values["updated_at"] = now
    return None, values, end + 1, False


def _change_of(ch: SyllabusChapter, head: Any, material: ChapterMaterial | None) -> str:
    """What changed in a chapter since its slices were cut, in words: why its kept
    questions are stale after a regeneration."""
    changes = []
    if (head.title, head.prompt) != (ch.title, ch.prompt):
        changes.append("its title or prompt changed")
    if head.language != _language(ch):
        changes.append(f"its language changed ({head.language}, now {_language(ch)})")
    if head.types != _types(ch):
        changes.append(f"its item types changed ({head.types or 'all mcq'}, now "
                       f"{_types(ch) or 'all mcq'})")
    if material is not None and head.sources != material.hashes_json:
        changes.append(_changed_source(head.sources, material.hashes))
    return "; ".join(changes) or "regenerated with no change to its title, prompt or sources"


def _changed_source(before: str | None, now: dict[str, str]) -> str:
    """Which source made a chapter's material change, in words."""
    old: dict[str, str] = json.loads(before) if before else {}
    for entry, digest in now.items():
        if entry not in old:
            return f"source {entry} was added"
        if old[entry] != digest:
            return f"source {entry} differs (its file's hash changed)"
    for entry in old:
        if entry not in now:
            return f"source {entry} was removed"
    return "the sources' order changed"


def _language(ch: SyllabusChapter) -> str:
    """The language a chapter's slices record: its own (a Syllabus gives every chapter one:
    its own, else the exam's)."""
    return ch.language or DEFAULT_LANGUAGE


def _levels(ch: SyllabusChapter) -> dict[str, str | None]:
    """The slice columns of a chapter's difficulty and Bloom levels (JSON, NULL for none)."""
    return {"difficulty": None if ch.difficulty is None else json.dumps(ch.difficulty),
            "bloom": None if ch.bloom is None else json.dumps(ch.bloom), "types": _types(ch)}


def _types(ch: SyllabusChapter) -> str | None:
    """The slice column of a chapter's counts per item type (JSON; NULL for all mcq)."""
    types = ch.item_types
    return None if types is None else json.dumps(types)


def _plan_slice(row: Any, now: float, pending: int) -> tuple[str | None, dict[str, Any]]:
    """What enqueue does with one slice: (why it is not enqueued, or None; the columns that
    change). `pending` counts the verdicts of its range still pending (0 when the exam's
    policy verifies nothing).

    A slice is done only when its range is full and none of its verdicts is pending; and a
    live holder's lease is never cleared here (its holder is in a call or a solve that is
    paid for: it books the slice done itself, under its lease)."""
    live = row.lease_owner is not None and (row.lease_expires_at or 0) > now
    if row.state == ChapterState.cancelled.value:
        return "cancelled", {}
    if row.stored >= row.target and not pending:
        if live:
            return "running", {}
        if row.state != ChapterState.done.value or row.lease_owner is not None:
            return "done", {"state": ChapterState.done.value, "lease_owner": None,
                            "lease_expires_at": None}
        return "done", {}
    if row.state in (ChapterState.done.value, ChapterState.failed.value):
        # More questions asked for, a failed slice enqueued again by the user, or (marked
        # done by an older examforge) verdicts still pending.
        return None, {"state": ChapterState.pending.value, "attempts_since_progress": 0}
    return None, {}
