"""Reports: what an exam's database rows say, read in one snapshot that blocks no writer."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator, Sequence

from sqlalchemy import and_, case, func, literal, or_, select, tuple_, union_all
from sqlalchemy.engine import Connection

from examforge.errors import BadCursor
from storage.base import (ACTIVE_SLICE, ACTIVE_STATES, IN_FLIGHT_CALL, E, K, Q, S, StoreBase,
                          last_error_text, requeue_text)
from storage.batches import B
from storage.db import READ_ONLY
from storage.grounding import coverage as material_coverage
from storage.types import BatchRow, submission_of
from storage.models import CallOutcome, ChapterState, ReviewState, Verdict


RECENT_ERRORS = 5  # the failed and wasted calls a report lists
EXAM_PAGE = 100  # exams on a page of `exams` and GET /exams, unless asked otherwise


def encode_cursor(created_at: float, slug: str) -> str:
    """An exam's place in the keyset order, opaque to clients: URL-safe, no padding."""
    raw = json.dumps([created_at, slug], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, slug = json.loads(raw)
        if not isinstance(slug, str) or isinstance(created_at, bool):
            raise ValueError
        return float(created_at), slug
    except (ValueError, TypeError, binascii.Error):
        raise BadCursor(f"after: {cursor[:80]!r} is not a cursor a page of exams gave "
                        "(use its `next`)") from None


@dataclass
class Progress:
    target: int
    done: int


@dataclass
class ChapterCounts:
    """Chapters by state (a running chapter whose lease expired counts as pending)."""

    total: int = 0
    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0

    def count(self, state: ChapterState) -> None:
        setattr(self, state.value, getattr(self, state.value) + 1)


@dataclass
class UsageTotals:
    """Every call of the exam, by outcome, with its tokens and money. `calls` counts requests
    sent to the provider; imported batches (`producer import`: no request, no cost) are
    counted apart, in `calls_imported` and `questions_imported`."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those read from the provider's prompt cache (at its cached price).
    cached_tokens: int = 0
    calls_in_flight: int = 0
    calls_used: int = 0
    calls_wasted: int = 0
    calls_failed: int = 0
    calls_estimated: int = 0  # booked at our own token count (no usage from the provider)
    calls_imported: int = 0  # ledger rows of imports, one per slice filled
    questions_imported: int = 0
    estimated_cost_usd: float = 0.0
    cost_usd: float = field(default=0.0, repr=False)
    reserved_usd: float = field(default=0.0, repr=False)

    def add(self, outcome: CallOutcome, n: int, prompt: int, completion: int, cost: float,
            reserved: float, estimated: bool, stored: int = 0, cached: int = 0) -> None:
        if outcome is CallOutcome.imported:
            self.calls_imported += n
            self.questions_imported += stored
            return
        self.calls += n
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += cached
        setattr(self, f"calls_{outcome.value}", getattr(self, f"calls_{outcome.value}") + n)
        self.cost_usd += cost
        if outcome is CallOutcome.in_flight:
            self.reserved_usd += reserved
        if estimated:
            self.calls_estimated += n
            self.estimated_cost_usd += cost

    def rounded(self) -> "UsageTotals":
        return dataclasses.replace(self, estimated_cost_usd=round(self.estimated_cost_usd, 6))


@dataclass
class EndpointUsage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cached_tokens: int = 0

    def add(self, n: int, prompt: int, completion: int, cost: float, cached: int = 0) -> None:
        self.calls += n
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cost_usd += cost
        self.cached_tokens += cached

    def rounded(self) -> "EndpointUsage":
        return dataclasses.replace(self, cost_usd=round(self.cost_usd, 6))


@dataclass
class SliceReport:
    """One slice: numbers `first` to `last` of its chapter."""

    slice: int
    first: int
    last: int
    state: str
    stored: int
    attempts: int
    lease_owner: str | None
    last_error: str | None  # as people read it: the code's label and the detail
    requeues: int
    last_error_code: str | None = None  # examforge.errors.SliceReason: what code compares


@dataclass
class ChapterReport:
    """A chapter, summed over its slices: running while any slice runs, pending while any
    waits, then failed, cancelled, and done when all of them are. The last error and the
    last requeue are the latest of any slice."""

    id: str
    title: str
    state: str
    questions: Progress
    attempts: int
    attempts_since_progress: int
    calls: int
    last_error: str | None  # as people read it: the code's label and the detail
    last_error_at: float | None
    lease_owner: str | None
    requeues: int
    requeued_at: float | None
    requeue_reason: str | None  # as people read it: "message_lost: the queue held ..."
    slices: list[SliceReport] = field(default_factory=list)
    # The codes of the two above (examforge.errors.SliceReason, storage.models.RequeueReason):
    # what code compares, never the text.
    last_error_code: str | None = None
    requeue_code: str | None = None
    # Set while a slice of it is held by a live provider batch (batch mode): what it waits
    # on, e.g. "waiting on the provider's batch batch_abc (in_progress, 40/120 done)". Its
    # state stays `running` (the batch holds its lease), but it is not stuck.
    waiting_on: str | None = None
    batch: str | None = None  # that batch's submission id
    # For a chapter with sources (examforge.sources): how many of its passages its stored
    # questions cite, of how many, and that share.
    material: "MaterialCoverage | None" = None
    # Under VERIFY (any of its questions has a verdict): what the blind solve said.
    verification: "VerificationCounts | None" = None

    @property
    def slices_done(self) -> int:
        return sum(1 for s in self.slices if s.state == ChapterState.done.value)


@dataclass
class MaterialCoverage:
    """The share of a chapter's passages that its stored questions cite."""

    cited: int
    passages: int
    share: float


@dataclass
class VerificationCounts:
    """What the blind solve (VERIFY) said of a chapter's or an exam's questions: `agreed`
    and `pending` count the questions in the bank (numbered); `disputed` every question
    whose key the solver contradicted, of which `withdrawn` left the numbering (VERIFY=replace:
    replaced) and the rest stay flagged (VERIFY=flag)."""

    agreed: int = 0
    disputed: int = 0
    pending: int = 0
    withdrawn: int = 0
    # In the bank with no verdict at all (never solved: stored in batch mode, imported, or
    # by a worker without VERIFY) in an exam whose questions are verified (issue 27).
    unverified: int = 0

    def add(self, other: "VerificationCounts") -> None:
        self.agreed += other.agreed
        self.disputed += other.disputed
        self.pending += other.pending
        self.withdrawn += other.withdrawn
        self.unverified += other.unverified


def verification_counts(conn: Connection, slug: str) -> dict[str, VerificationCounts]:
    """{chapter id: its VerificationCounts} for the chapters with a verified question, or,
    in an exam with one, a question of the bank never verified."""
    counts: dict[str, VerificationCounts] = {}
    for chapter_id, verdict, withdrawn, n in conn.execute(
            select(Q.c.chapter_id, Q.c.verdict, Q.c.withdrawn.is_not(None), func.count())
            .where(Q.c.exam == slug, Q.c.verdict.is_not(None))
            .group_by(Q.c.chapter_id, Q.c.verdict, Q.c.withdrawn.is_not(None))):
        c = counts.setdefault(chapter_id, VerificationCounts())
        if verdict == Verdict.disputed.value:
            c.disputed += n
            if withdrawn:
                c.withdrawn += n
        elif withdrawn:
            continue  # agreed, then rejected by a reviewer: out of the bank
        elif verdict == Verdict.agreed.value:
            c.agreed += n
        elif verdict == Verdict.pending.value:
            c.pending += n
    if counts:  # a verified exam: the questions of its bank never solved count too
        for chapter_id, n in conn.execute(
                select(Q.c.chapter_id, func.count()).where(
                    Q.c.exam == slug, Q.c.number.is_not(None), Q.c.verdict.is_(None))
                .group_by(Q.c.chapter_id)):
            counts.setdefault(chapter_id, VerificationCounts()).unverified += n
    return counts


_CHAPTER_STATE_ORDER = (ChapterState.running, ChapterState.pending, ChapterState.failed,
                        ChapterState.cancelled, ChapterState.done)


def chapter_state(slice_states: list[ChapterState]) -> ChapterState:
    """A chapter's state from its slices' (see ChapterReport)."""
    for state in _CHAPTER_STATE_ORDER:
        if state in slice_states:
            return state
    return ChapterState.done


@dataclass
class RecentError:
    """A call that failed or was wasted: when, where and why."""

    at: float | None
    chapter: str
    slice: int
    outcome: str
    reason: str | None
    detail: str | None


class ExamStatus(str, Enum):
    """What `status` says of an exam (see exam_state)."""

    active = "active"
    paused = "paused"
    done = "done"  # every chapter done
    failed = "failed"  # finished with failures: no work left, some chapter failed
    cancelled = "cancelled"  # no work left, some chapter cancelled, none failed


def batch_counts(row: BatchRow) -> tuple[int, int, int]:
    """(total, completed, failed) requests of a submission: the provider's counts once it
    gave any, else the lines of its file."""
    total = row.request_total or row.requests
    return total, row.request_completed, row.request_failed


def batch_status(row: BatchRow) -> str:
    """What a submission is doing, in one word: the provider's status while it has the batch
    (validating, in_progress, finalizing, cancelling, ...), else our step (preparing,
    uploaded, creating, done, abandoned)."""
    if row.state == "submitted" and row.provider_status:
        return row.provider_status
    if row.state == "done" and row.provider_status:
        return row.provider_status  # completed, expired, cancelled, failed
    return row.state


def waiting_text(row: BatchRow) -> str:
    """A live submission as the slices it holds wait on it."""
    total, completed, failed = batch_counts(row)
    if row.provider_batch_id:
        counts = f"{completed}/{total} done" + (f", {failed} failed" if failed else "")
        return (f"waiting on the provider's batch {row.provider_batch_id} "
                f"({batch_status(row)}, {counts})")
    return f"waiting on batch submission {row.id} ({row.state}, {total} requests)"


def exam_state(stored: str, counts: "ChapterCounts") -> str:
    """Done when every chapter is; paused while a pause waits for a person; then active
    while work is left, or how it ended."""
    if counts.done == counts.total:
        return ExamStatus.done.value
    if stored == ExamStatus.paused.value or counts.pending + counts.running:
        return stored
    if counts.failed:
        return ExamStatus.failed.value
    return ExamStatus.cancelled.value


@dataclass
class ExamSummary:
    """One line of `exams`."""

    exam: str
    title: str
    state: str
    chapters: Progress  # done of total
    questions: Progress
    cost_usd: float
    updated_at: float | None


@dataclass
class ExamPage:
    """A page of `exams`: its summaries and the cursor of the next page (None: the last)."""

    items: list[ExamSummary]
    next: str | None


@dataclass
class ExamReport:
    """`status`: what the database says of one exam. `as_dict()` is the `status --json`
    contract."""

    exam: str
    title: str
    state: str
    pause_reason: str | None
    chapters: ChapterCounts
    questions: Progress
    usage: UsageTotals
    cost_usd: float
    usage_by_endpoint: dict[str, EndpointUsage]
    unpriced_calls: dict[str, int]  # calls booked at $0 (no price known), by model
    budget_usd: float | None
    spent_usd: float
    reserved_usd: float  # the worst cases of the calls in flight
    chapter_list: list[ChapterReport]
    # When the first call started, when the last slice finished (None while work is left),
    # and the time between (up to now while it runs); the last change of any row.
    started_at: float | None = None
    finished_at: float | None = None
    elapsed_s: float | None = None
    updated_at: float | None = None
    questions_last_minute: int = 0  # stored in the last 60 s (the rate of a live view)
    recent_errors: list[RecentError] = field(default_factory=list)  # newest first
    # The calls whose replies named the tier that served them (LLM_SERVICE_TIER), by tier:
    # what each tier cost. Calls with no tier reported are not in it.
    usage_by_tier: dict[str, EndpointUsage] = field(default_factory=dict)
    mode: str = "sync"  # how the exam is generated: sync, or batch (the provider's Batch API)
    # Its submissions to the provider's Batch API, newest first (storage.batches).
    batches: list[BatchRow] = field(default_factory=list)
    # Why it is paused, as examforge.errors.PauseCode (pause_reason is its human text).
    pause_code: str | None = None
    # The chapters' VerificationCounts summed; None when no question was verified.
    verification: VerificationCounts | None = None
    # Its blind-solve policy (storage.models.VerifyPolicy: off, flag, replace), which every
    # worker follows.
    verify: str = "off"

    @property
    def finished(self) -> bool:
        """No slice is pending or running (whatever the pause)."""
        return self.chapters.pending + self.chapters.running == 0

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for hidden in ("cost_usd", "reserved_usd"):
            data["usage"].pop(hidden)
        return data


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
        real usage, newest first, or of the model's (any exam) while the exam has fewer than
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
            theirs = newest(K.c.model == model, "model").subquery()
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
            counts = ChapterCounts(total=total, done=finished)
            if agg is not None and agg.active:
                counts.pending = 1  # work left: exam_state needs no more than that
            elif agg is not None and agg.failed:
                counts.failed = 1
            else:
                counts.cancelled = total - finished
            cost = ledger.get(exam.slug)
            out.append(ExamSummary(
                exam=exam.slug, title=exam.title, state=exam_state(exam.state, counts),
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
                                       "requeue_code", "requeue_reason")))
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
            batches = [BatchRow.from_row(r) for r in conn.execute(
                select(B).where(B.c.exam == slug).order_by(B.c.created_at.desc(), B.c.id))]
        usage = UsageTotals()
        calls_by_chapter: dict[str, int] = {}
        by_endpoint: dict[str, EndpointUsage] = {}
        by_tier: dict[str, EndpointUsage] = {}
        unpriced: dict[str, int] = {}
        for (chapter_id, outcome, endpoint, estimated, priced, model, tier, n, p, c, cost,
             reserved, stored, cached) in usage_rows:
            usage.add(CallOutcome(outcome), n, int(p), int(c), float(cost), float(reserved),
                      bool(estimated), int(stored), int(cached))
            if outcome == CallOutcome.imported.value:
                continue  # no request: not a call of any chapter or endpoint
            if not priced:
                unpriced[model or "unknown"] = unpriced.get(model or "unknown", 0) + n
            calls_by_chapter[chapter_id] = calls_by_chapter.get(chapter_id, 0) + n
            by_endpoint.setdefault(endpoint or "unknown", EndpointUsage()).add(
                n, int(p), int(c), float(cost), int(cached))
            if tier is not None:
                by_tier.setdefault(tier, EndpointUsage()).add(
                    n, int(p), int(c), float(cost), int(cached))
        by_chapter: dict[str, list[Any]] = {}
        for sl in slices:
            by_chapter.setdefault(sl.chapter_id, []).append(sl)
        counts = ChapterCounts(total=len(by_chapter))
        listed = [self._chapter_report(chapter_id, rows, exam.now,
                                       calls_by_chapter.get(chapter_id, 0))
                  for chapter_id, rows in by_chapter.items()]
        by_submission = {b.id: b for b in batches}
        for chapter in listed:
            counts.count(ChapterState(chapter.state))
            held = by_submission.get(submission_of(chapter.lease_owner) or "")
            if held is not None and held.live:
                chapter.batch, chapter.waiting_on = held.id, waiting_text(held)
        for chapter in listed:
            covered = coverage.get(chapter.id)
            if covered is not None:
                cited, passages = covered
                chapter.material = MaterialCoverage(cited, passages,
                                                    round(cited / passages, 4) if passages else 0.0)
        verification = VerificationCounts() if verified else None
        for chapter in listed:
            chapter.verification = verified.get(chapter.id)
            if chapter.verification is not None and verification is not None:
                verification.add(chapter.verification)
        finished = counts.pending + counts.running == 0
        started_at, finished_at = times.first, times.last if finished else None
        return ExamReport(
            exam=slug, title=exam.title, state=exam_state(exam.state, counts),
            pause_reason=exam.pause_reason, pause_code=exam.pause_code, chapters=counts,
            questions=Progress(sum(c.questions.target for c in listed),
                               sum(c.questions.done for c in listed)),
            usage=usage.rounded(), cost_usd=round(usage.cost_usd, 6),
            usage_by_endpoint={k: v.rounded() for k, v in by_endpoint.items()},
            usage_by_tier={k: v.rounded() for k, v in by_tier.items()},
            unpriced_calls=unpriced, budget_usd=exam.budget_usd,
            spent_usd=round(usage.cost_usd, 6), reserved_usd=round(usage.reserved_usd, 6),
            chapter_list=listed, started_at=started_at, finished_at=finished_at,
            elapsed_s=None if started_at is None else round(
                (finished_at or exam.now) - started_at, 3),
            updated_at=max(filter(None, (exam.updated_at, times.changed, times.last)),
                           default=None),
            questions_last_minute=times.last_minute,
            recent_errors=[RecentError(r.finished_at, r.chapter_id, r.slice_no, r.outcome,
                                       r.reason, r.detail) for r in errors],
            mode=getattr(exam, "mode", None) or "sync", batches=batches,
            verification=verification, verify=getattr(exam, "verify", None) or "off")

    @staticmethod
    def _chapter_report(chapter_id: str, rows: list[Any], now: float,
                        calls: int) -> ChapterReport:
        reports = []
        # A slice a lowered target trimmed to nothing covers no number: not shown.
        rows = [r for r in rows if r.target > 0] or rows
        for sl in rows:
            state = ChapterState(sl.state)
            live = sl.lease_owner and (sl.lease_expires_at or 0) > now
            if state is ChapterState.running and not live:
                state = ChapterState.pending
            reports.append(SliceReport(
                slice=sl.slice_no, first=sl.first_number,
                last=sl.first_number + sl.target - 1, state=state.value,
                stored=min(sl.stored, sl.target), attempts=sl.attempts,
                lease_owner=sl.lease_owner if state is ChapterState.running else None,
                last_error=last_error_text(sl.last_error_code, sl.last_error),
                last_error_code=sl.last_error_code, requeues=sl.requeues))
        state = chapter_state([ChapterState(r.state) for r in reports])
        erred = max(rows, key=lambda r: r.last_error_at or 0.0)
        requeued = max(rows, key=lambda r: r.requeued_at or 0.0)
        target = sum(r.target for r in rows)
        return ChapterReport(
            id=chapter_id, title=rows[0].title, state=state.value,
            questions=Progress(target, sum(r.stored for r in reports)),
            attempts=sum(r.attempts for r in rows),
            attempts_since_progress=max(r.attempts_since_progress for r in rows),
            calls=calls, last_error=last_error_text(erred.last_error_code, erred.last_error),
            last_error_code=erred.last_error_code, last_error_at=erred.last_error_at,
            lease_owner=next((r.lease_owner for r in reports if r.lease_owner), None),
            requeues=sum(r.requeues for r in rows), requeued_at=requeued.requeued_at,
            requeue_code=requeued.requeue_code,
            requeue_reason=requeue_text(requeued.requeue_code, requeued.requeue_reason),
            slices=reports)

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
                       Q.c.source, Q.c.verdict, Q.c.model, Q.c.created_at)
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
                       "verdict": r.verdict, "model": r.model, "created_at": r.created_at}

    def outline(self, slug: str) -> tuple[str, list[tuple[str, str, int]]]:
        """The exam's title and its chapters as (id, title, position), in the order
        `iter_questions` gives their questions: what a question bank's categories are."""
        with self._read() as conn:
            self._require_exam(conn, slug)
            title = conn.execute(select(E.c.title).where(E.c.slug == slug)).scalar_one()
            chapters = conn.execute(
                select(S.c.chapter_id, S.c.title, S.c.position).where(S.c.exam == slug)
                .distinct().order_by(S.c.position, S.c.chapter_id)).all()
        return title, [(c.chapter_id, c.title, c.position) for c in chapters]
