"""Reports: what an exam's database rows say, read in one snapshot that blocks no writer."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any, Iterator, Sequence

from sqlalchemy import and_, case, func, literal, or_, select, tuple_, union_all
from sqlalchemy.engine import Connection

from examforge import item_types
from examforge.errors import BadCursor
from storage.base import ACTIVE_SLICE, ACTIVE_STATES, IN_FLIGHT_CALL, E, K, Q, S, StoreBase
from storage.batches import B
from storage.db import READ_ONLY
from storage.grounding import coverage as material_coverage
from storage.models import CallOutcome, ChapterState, ReviewState, Verdict
# The reports' values and the arithmetic that makes them from the rows read here: in
# storage.report_types, which imports no SQLAlchemy (the plain-driver reads of
# producer/read_sqlite.py build the same reports with it).
from storage.report_types import (BatchRow, ExamPage, ExamReport, ExamSummary, Progress,
                                  StatusRows, VerificationCounts, exam_report, summary_state,
                                  tally_verdicts)


RECENT_ERRORS = 5  # the failed and wasted calls a report lists
EXAM_PAGE = 100  # exams on a page of `exams` and GET /exams, unless asked otherwise


# An exam's place in the keyset order, `CREATED_SLUG`: its created_at (epoch seconds, in
# plain decimals) and its slug. Readable, not base64 of JSON, so that the API's document can
# say exactly what a cursor is (EXAM_CURSOR_PATTERN, issue 30): every string of that form is
# a place in the order (a page from there), every other one is refused (BadCursor, 422).
EXAM_CURSOR_PATTERN = r"^[0-9]{1,20}(\.[0-9]{1,20})?_[a-z0-9][a-z0-9-]{0,63}$"
_EXAM_CURSOR_RE = re.compile(EXAM_CURSOR_PATTERN)


def encode_cursor(created_at: float, slug: str) -> str:
    """An exam's place in the keyset order, opaque to clients (EXAM_CURSOR_PATTERN)."""
    # The shortest decimals that read back as the same float, never in exponent form (at
    # most 17 digits for epoch seconds; a time below 1 s past 1970 may take more).
    number = format(Decimal(repr(float(created_at))), "f")
    return f"{number}_{slug}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    if not isinstance(cursor, str) or not _EXAM_CURSOR_RE.fullmatch(cursor):
        raise BadCursor(f"after: {str(cursor)[:80]!r} is not a cursor a page of exams gave "
                        "(use its `next`)")
    number, _, slug = cursor.partition("_")
    return float(number), slug


def verification_counts(conn: Connection, slug: str) -> dict[str, VerificationCounts]:
    """{chapter id: its VerificationCounts} for the chapters with a verified question, or,
    in an exam with one, a question of the bank never verified (tally_verdicts)."""
    verdicts = conn.execute(
        select(Q.c.chapter_id, Q.c.verdict, Q.c.withdrawn.is_not(None), func.count())
        .where(Q.c.exam == slug, Q.c.verdict.is_not(None))
        .group_by(Q.c.chapter_id, Q.c.verdict, Q.c.withdrawn.is_not(None))).all()
    unverified = conn.execute(
        select(Q.c.chapter_id, func.count()).where(
            Q.c.exam == slug, Q.c.number.is_not(None), Q.c.verdict.is_(None))
        .group_by(Q.c.chapter_id)).all() if verdicts else []
    return tally_verdicts(verdicts, unverified)


class Reports(StoreBase):
    """Status, exports and the figures estimates use."""

    def questions_done(self, slug: str) -> int:
        """Stored questions of the exam, up to each chapter's target: a cheap progress figure."""
        with self._read() as conn:
            return conn.execute(select(func.count()).select_from(Q).join(S, self._in_range())
                                .where(Q.c.exam == slug)).scalar_one()

    def stored_texts(self, slug: str) -> dict[str, list[str]]:
        """The text of every question in the exam's bank, by chapter (empty if unknown); a
        question withdrawn from its chapter (disputed, rejected) holds no number and is not."""
        with self._read() as conn:
            rows = conn.execute(select(Q.c.chapter_id, Q.c.question).where(
                Q.c.exam == slug, Q.c.number.is_not(None))
                .order_by(Q.c.chapter_id, Q.c.number)).all()
        out: dict[str, list[str]] = {}
        for chapter_id, text in rows:
            out.setdefault(chapter_id, []).append(text)
        return out

    def verification_owed(self, slug: str) -> tuple[str | None, dict[str, int], dict[str, int]]:
        """The exam's recorded blind-solve policy (None: not in the database) and, by
        chapter, the questions in its bank whose verdict is pending and those stored
        unverified (verdict NULL): what a dry run prices as solves still owed."""
        with self._read() as conn:
            policy = conn.execute(select(E.c.verify).where(E.c.slug == slug)).scalar_one_or_none()
            rows = conn.execute(select(Q.c.chapter_id, Q.c.verdict, func.count()).where(
                Q.c.exam == slug, Q.c.number.is_not(None),
                or_(Q.c.verdict.is_(None), Q.c.verdict == Verdict.pending.value))
                .group_by(Q.c.chapter_id, Q.c.verdict)).all()
        pending = {c: n for c, v, n in rows if v is not None}
        unverified = {c: n for c, v, n in rows if v is None}
        return policy, pending, unverified

    def completion_tokens_per_question(self) -> float | None:
        """What this database's calls have really used per question stored (None before any
        call with real usage), for estimates."""
        with self._read() as conn:
            tokens, questions = conn.execute(
                select(func.coalesce(func.sum(K.c.completion_tokens), 0),
                       func.coalesce(func.sum(K.c.questions_stored), 0))
                .where(K.c.outcome == CallOutcome.used.value, K.c.kind.is_(None),
                       K.c.usage_estimated.is_(False))).one()
        return tokens / questions if questions else None

    def completion_history(self, slug: str, model: str | None, limit: int,
                           enough: int) -> tuple[list[float], str]:
        """Completion tokens per question asked of the exam's last `limit` used calls with
        real usage, newest first, or of the model's (any exam in the exam's language) while
        the exam has fewer than
        `enough`; and which it is ("exam" or "model"). For sizing max_tokens
        (examforge.sizing): two short indexed reads, run once per process and exam every so
        many calls, never per call."""
        def newest(where: Any, source: str) -> Any:
            return (select(literal(source).label("source"), K.c.completion_tokens,
                           K.c.requested)
                    .where(where, K.c.outcome == CallOutcome.used.value, K.c.kind.is_(None),
                           K.c.usage_estimated.is_(False), K.c.requested > 0)
                    .order_by(K.c.id.desc()).limit(limit))

        mine = newest(K.c.exam == slug, "exam").subquery()
        parts = [select(mine)]
        if model is not None:
            # The model's calls only while the exam has fewer than `enough`: a condition
            # on the exam's count, which the database evaluates once, before that scan.
            # Of exams in the same language only: Persian, Arabic or Russian replies take
            # more tokens a question than English ones (tests/unit/test_budget_languages.py),
            # so an English history would size a Persian exam's first calls too small.
            mine_language = select(E.c.language).where(E.c.slug == slug).scalar_subquery()
            other_languages = select(E.c.slug).where(E.c.language != mine_language)
            theirs = newest(and_(K.c.model == model, K.c.exam.not_in(other_languages)),
                            "model").subquery()
            parts.append(select(theirs).where(
                select(func.count()).select_from(mine).scalar_subquery() < enough))
        # One statement (one round trip on PostgreSQL, in autocommit: no BEGIN, no COMMIT).
        conn = self.engine.connect()
        conn = (conn.execution_options(isolation_level="AUTOCOMMIT")
                if self.engine.dialect.name == "postgresql"
                else conn.execution_options(**{READ_ONLY: True}))
        with conn:
            rows = conn.execute(parts[0] if len(parts) == 1 else union_all(*parts)).all()
        found: dict[str, list[float]] = {"exam": [], "model": []}
        for source, tokens, requested in rows:
            found[source].append(tokens / requested)
        exam, other = found["exam"], found["model"]
        if len(exam) >= enough or model is None:
            return exam, "exam"
        return (other, "model") if len(other) > len(exam) else (exam, "exam")

    def exams(self) -> list[ExamSummary]:
        """Every exam in the database, newest first (`exam_page` without a limit)."""
        return self.exam_page(limit=None).items

    def exam_page(self, limit: int | None = EXAM_PAGE, after: str | None = None,
                  only: Sequence[str] | None = None) -> ExamPage:
        """The exams after the cursor `after` (None: from the newest), at most `limit` (None:
        all), newest first, with the cursor of the next page (None on the last); `only`:
        those of these slugs (a token's exam scope), filtered in the query, so pages stay
        full.

        Keyset pages by (created_at, slug), from `ix_exam_created`: an exam recorded while a
        client pages comes before its first page, so no exam is skipped or listed twice. The
        figures of a page are aggregated in SQL over that page's exams alone, so a page costs
        the same at 100 exams and at 10,000 (issue 19)."""
        with self._read() as conn:
            query = (select(E, self._now.label("now"))
                     .order_by(E.c.created_at.desc(), E.c.slug.desc()))
            if after is not None:
                created, slug = decode_cursor(after)
                query = query.where(tuple_(E.c.created_at, E.c.slug) < (created, slug))
            if only is not None:
                query = query.where(E.c.slug.in_(list(only)))
            if limit is not None:
                query = query.limit(limit + 1)
            exams = conn.execute(query).all()
            more = limit is not None and len(exams) > limit
            exams = exams[:limit] if limit is not None else exams
            items = self._summaries(conn, exams,
                                    whole=limit is None and after is None and only is None)
        return ExamPage(items, encode_cursor(exams[-1].created_at, exams[-1].slug)
                        if more else None)

    def exam_figures(self, slugs: Sequence[str] | None = None
                     ) -> tuple[list[ExamSummary], list[Any]]:
        """What GET /metrics shows of the exams `slugs` (None: every exam): their summaries
        without cost, and their ledger by outcome (exam, outcome, calls, prompt, completion,
        cost), aggregated in SQL. With `slugs`, each read is an index range per exam."""
        with self._read() as conn:
            query = select(E, self._now.label("now")).order_by(E.c.created_at.desc(),
                                                               E.c.slug.desc())
            totals = select(K.c.exam, K.c.outcome, func.count().label("calls"),
                            func.coalesce(func.sum(K.c.prompt_tokens), 0).label("prompt"),
                            func.coalesce(func.sum(K.c.completion_tokens), 0)
                            .label("completion"),
                            func.coalesce(func.sum(K.c.cost_usd), 0.0).label("cost"))
            if slugs is not None:
                if not slugs:
                    return [], []
                query = query.where(E.c.slug.in_(list(slugs)))
                totals = totals.where(K.c.exam.in_(list(slugs)))
            exams = conn.execute(query).all()
            return (self._summaries(conn, exams, whole=slugs is None, costs=False),
                    list(conn.execute(totals.group_by(K.c.exam, K.c.outcome))))

    def exam_marks(self) -> tuple[dict[str, float], set[str]]:
        """Every exam's last change of its own row (slug -> updated_at), and the exams with
        work left or a call in flight (read through the partial indexes): what GET /metrics
        reads at each scrape to know which exams' figures may have moved."""
        with self._read() as conn:
            marks: dict[str, float] = dict(conn.execute(  # type: ignore[arg-type]
                select(E.c.slug, E.c.updated_at)).all())
            live = set(conn.execute(select(S.c.exam).where(ACTIVE_SLICE).distinct()).scalars())
            live.update(conn.execute(select(K.c.exam).where(IN_FLIGHT_CALL).distinct()).scalars())
        return marks, live

    def _summaries(self, conn: Connection, exams: Sequence[Any], *, whole: bool,
                   costs: bool = True) -> list[ExamSummary]:
        """The summaries of `exams` (rows of the exam table with `now`), in their order, in
        two grouped queries: the slices by chapter then by exam, and the ledger by exam
        (`whole`: every exam of the database, read without a list of slugs).

        A done slice counts its target as stored: its range is full by construction (a slice
        is set done only when its range holds its target, and nothing deletes a question
        without deleting its slice too: --regenerate, prune; withdrawing one from a done
        slice sets it pending again, Store.withdraw), so only the questions of the
        slices still open are counted, each from the unique index on its range. That keeps
        a finished exam's questions out of every read here."""
        if not exams:
            return []
        slugs = [e.slug for e in exams]
        done = S.c.state == ChapterState.done.value
        in_range = and_(Q.c.exam == S.c.exam, Q.c.chapter_id == S.c.chapter_id,
                        Q.c.number >= S.c.first_number,
                        Q.c.number < S.c.first_number + S.c.target)
        open_stored = (select(func.count()).select_from(Q).where(in_range)
                       .correlate(S).scalar_subquery())
        # A slice running under a lapsed lease reads as pending: both are work left.
        active = S.c.state.in_(ACTIVE_STATES)
        flag = (lambda cond: func.max(case((cond, 1), else_=0)))
        chapters = select(
            S.c.exam, S.c.chapter_id,
            func.min(case((done, 1), else_=0)).label("done"),
            flag(active).label("active"),
            flag(S.c.state == ChapterState.failed.value).label("failed"),
            func.sum(S.c.target).label("target"),
            func.sum(case((done, S.c.target), else_=open_stored)).label("stored"),
            func.max(S.c.updated_at).label("changed"))
        if not whole:
            chapters = chapters.where(S.c.exam.in_(slugs))
        ch = chapters.group_by(S.c.exam, S.c.chapter_id).subquery()
        per_exam = {r.exam: r for r in conn.execute(select(
            ch.c.exam, func.count().label("chapters"), func.sum(ch.c.done).label("done"),
            func.max(ch.c.active).label("active"), func.max(ch.c.failed).label("failed"),
            func.sum(ch.c.target).label("target"), func.sum(ch.c.stored).label("stored"),
            func.max(ch.c.changed).label("changed")).group_by(ch.c.exam))}
        ledger: dict[str, Any] = {}
        if costs:
            spent = select(K.c.exam, func.coalesce(func.sum(K.c.cost_usd), 0.0).label("cost"),
                           func.max(K.c.finished_at).label("last"))
            if not whole:
                spent = spent.where(K.c.exam.in_(slugs))
            ledger = {r.exam: r for r in conn.execute(spent.group_by(K.c.exam))}
        out = []
        for exam in exams:
            agg = per_exam.get(exam.slug)
            total = int(agg.chapters) if agg else 0
            finished = int(agg.done) if agg else 0
            cost = ledger.get(exam.slug)
            out.append(ExamSummary(
                exam=exam.slug, title=exam.title,
                state=summary_state(exam.state, total, finished, bool(agg and agg.active),
                                    bool(agg and agg.failed)),
                chapters=Progress(total, finished),
                questions=Progress(int(agg.target) if agg else 0,
                                   int(agg.stored) if agg else 0),
                cost_usd=round(float(cost.cost) if cost else 0.0, 6),
                updated_at=max(filter(None, (exam.updated_at, agg.changed if agg else None,
                                             cost.last if cost else None)), default=None)))
        return out

    def recorded(self, slugs: list[str]) -> set[str]:
        """Which of `slugs` are exams in the database."""
        with self._read() as conn:
            return {slug for chunk in range(0, len(slugs), 500)
                    for slug in conn.execute(select(E.c.slug).where(
                        E.c.slug.in_(slugs[chunk:chunk + 500]))).scalars()}

    def exam_exists(self, slug: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(E.c.slug).where(E.c.slug == slug)).first() is not None

    def status(self, slug: str) -> ExamReport:
        """The whole picture of one exam, from the database alone."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            exam = conn.execute(select(E, self._now.label("now")).where(E.c.slug == slug)).one()
            coverage = material_coverage(conn, slug)
            verified = verification_counts(conn, slug)
            usage_rows = conn.execute(
                select(K.c.chapter_id, K.c.outcome, K.c.endpoint, K.c.usage_estimated,
                       K.c.price_known, K.c.model, K.c.service_tier, func.count(),
                       func.coalesce(func.sum(K.c.prompt_tokens), 0),
                       func.coalesce(func.sum(K.c.completion_tokens), 0),
                       func.coalesce(func.sum(K.c.cost_usd), 0.0),
                       func.coalesce(func.sum(K.c.reserved_usd), 0.0),
                       func.coalesce(func.sum(K.c.questions_stored), 0),
                       func.coalesce(func.sum(K.c.cached_tokens), 0))
                .where(K.c.exam == slug)
                .group_by(K.c.chapter_id, K.c.outcome, K.c.endpoint, K.c.usage_estimated,
                          K.c.price_known, K.c.model, K.c.service_tier)).all()
            slices = self._slice_rows(conn, slug, *(
                S.c[name] for name in ("title", "first_number", "target", "state", "attempts",
                                       "attempts_since_progress", "lease_owner",
                                       "lease_expires_at", "last_error_code", "last_error",
                                       "last_error_at", "requeues", "requeued_at",
                                       "requeue_code", "requeue_reason", "language")))
            times = conn.execute(select(
                select(func.min(K.c.started_at)).where(K.c.exam == slug)
                .scalar_subquery().label("first"),
                select(func.max(K.c.finished_at)).where(K.c.exam == slug)
                .scalar_subquery().label("last"),
                select(func.max(S.c.updated_at)).where(S.c.exam == slug)
                .scalar_subquery().label("changed"),
                select(func.count()).select_from(Q).where(
                    Q.c.exam == slug, Q.c.created_at >= exam.now - 60)
                .scalar_subquery().label("last_minute"))).one()
            errors = conn.execute(
                select(K.c.finished_at, K.c.chapter_id, K.c.slice_no, K.c.outcome, K.c.reason,
                       K.c.detail)
                .where(K.c.exam == slug, K.c.outcome.in_((CallOutcome.failed.value,
                                                          CallOutcome.wasted.value)))
                .order_by(K.c.finished_at.desc()).limit(RECENT_ERRORS)).all()
            batches = [BatchRow.from_row(r._mapping) for r in conn.execute(
                select(B).where(B.c.exam == slug).order_by(B.c.created_at.desc(), B.c.id))]
        return exam_report(slug, StatusRows(exam, coverage, verified, usage_rows, slices, times,
                                            errors, batches))

    @staticmethod
    def _in_range() -> Any:
        """A question joined to the slice whose range holds its number."""
        return and_(S.c.exam == Q.c.exam, S.c.chapter_id == Q.c.chapter_id,
                    Q.c.number >= S.c.first_number, Q.c.number < S.c.first_number + S.c.target)

    def questions(self, slug: str) -> list[dict[str, object]]:
        """Every stored question of the exam, in syllabus order, up to each chapter's target."""
        return list(self.iter_questions(slug))

    def iter_questions(self, slug: str, *, batch: int = 1000,
                       approved_only: bool = False) -> Iterator[dict[str, object]]:
        """`questions` as a stream, for exports of any size: one snapshot, read `batch` rows at
        a time (a server-side cursor on PostgreSQL, a stepping cursor on SQLite), so memory
        stays flat however many questions there are. A question a reviewer rejected is never
        in it; with `approved_only`, only those a reviewer approved (storage.review)."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            rows = conn.execution_options(stream_results=True, yield_per=batch).execute(
                select(Q.c.exam, Q.c.chapter_id, Q.c.number, Q.c.question, Q.c.choices,
                       Q.c.answer_index, Q.c.explanation, Q.c.difficulty, Q.c.bloom,
                       Q.c.source, Q.c.verdict, Q.c.model, Q.c.created_at, Q.c.type,
                       Q.c.answer)
                .join(S, self._in_range())
                .where(Q.c.exam == slug, Q.c.review == ReviewState.approved.value
                       if approved_only else Q.c.review != ReviewState.rejected.value)
                # The chapter id too: a chapter dropped from the syllabus keeps its old
                # position, which a new chapter may share; exports group by chapter.
                .order_by(S.c.position, S.c.chapter_id, Q.c.number))
            loads = json.loads
            for r in rows:
                yield {"exam": r.exam, "chapter_id": r.chapter_id, "number": r.number,
                       "question": r.question, "choices": loads(r.choices),
                       "answer_index": r.answer_index, "explanation": r.explanation,
                       "difficulty": r.difficulty, "bloom": r.bloom, "source": r.source,
                       "verdict": r.verdict, "model": r.model, "created_at": r.created_at,
                       # Its item type and that type's answer fields (examforge.item_types).
                       "type": r.type or "mcq",
                       **item_types.reply_fields(r.type or "mcq", item_types.load(r.answer))}

    def outline(self, slug: str) -> tuple[str, list[tuple[str, str, int, str]]]:
        """The exam's title and its chapters as (id, title, position, language), in the
        order `iter_questions` gives their questions: what a question bank's categories
        are."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            title = conn.execute(select(E.c.title).where(E.c.slug == slug)).scalar_one()
            chapters = conn.execute(
                select(S.c.chapter_id, S.c.title, S.c.position, S.c.language)
                .where(S.c.exam == slug)
                .distinct().order_by(S.c.position, S.c.chapter_id)).all()
        return title, [(c.chapter_id, c.title, c.position, c.language or "en")
                       for c in chapters]
