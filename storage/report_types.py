"""The reports' values (`status`, `exams`, `review`) and the arithmetic that makes them from
the rows a report reads, with no SQLAlchemy in it.

Two readers share it: the store (storage.reports, storage.review), which reads the rows
through SQLAlchemy on either database, and the plain-driver path of the commands that only
read (producer/read_sqlite.py), which reads the same rows from a SQLite file as SQL text
with the sqlite3 module, because importing SQLAlchemy, SQLModel and the tables is about 0.7 s
of CPU, more than the rest of such a command (issue 28). So the figures, the states and the
texts of a report are computed here once, whichever way its rows came.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from examforge.errors import SliceReason
from examforge.languages import DEFAULT_LANGUAGE
from storage.states import (LIVE_BATCH_STATES, CallOutcome, ChapterState, RequeueReason,
                            ReviewState, Verdict)


def last_error_text(code: str | None, detail: str | None) -> str | None:
    """A slice's last error as people read it (`status`, the API), from its code and detail
    (slice.last_error_code, slice.last_error); None when it has none."""
    if code is None and detail is None:
        return None
    try:
        return SliceReason(code or SliceReason.legacy.value).describe(detail)
    except ValueError:  # a code of a newer examforge
        return f"{code}: {detail}" if detail else code


def requeue_text(code: str | None, detail: str | None) -> str | None:
    """A slice's last requeue as people read it: "message_lost: the queue held ..."."""
    if code is None or code == RequeueReason.legacy.value:
        return detail
    return f"{code}: {detail}" if detail else code


# The lease owner of a submission's slices and calls.
OWNER_PREFIX = "batch/"


def owner_of(submission: str) -> str:
    return f"{OWNER_PREFIX}{submission}"


def submission_of(owner: str | None) -> str | None:
    """The submission id an owner string names, or None for a synchronous worker."""
    if owner and owner.startswith(OWNER_PREFIX):
        return owner[len(OWNER_PREFIX):]
    return None


@dataclass(frozen=True)
class BatchRow:
    """A submission as status, cancel, the API and the page read it."""

    id: str
    exam: str
    state: str  # storage.models.BatchState
    provider_batch_id: str | None
    provider_status: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    model: str | None
    requests: int
    bytes: int
    request_total: int
    request_completed: int
    request_failed: int
    created_at: float
    submitted_at: float | None
    expires_at: float | None
    finished_at: float | None
    polled_at: float | None
    lease_owner: str | None
    lease_expires_at: float | None
    create_attempts: int
    cancel_requested: bool
    detail: str | None
    usage: dict[str, Any] | None

    @property
    def live(self) -> bool:
        return self.state in LIVE_BATCH_STATES

    @property
    def owner(self) -> str:
        """The lease owner of its slices and calls."""
        return owner_of(self.id)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> "BatchRow":
        """From the batch table's columns by name (a SQLAlchemy row's `_mapping`, a dict)."""
        values = dict(row)
        values["usage"] = json.loads(values["usage"]) if values.get("usage") else None
        values["cancel_requested"] = bool(values["cancel_requested"])
        return cls(**{name: values[name] for name in cls.__dataclass_fields__})


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
    # The language its questions are written in (a BCP 47 tag): its own, else the exam's.
    language: str = DEFAULT_LANGUAGE

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


def tally_verdicts(verdicts: Iterable[Sequence[Any]],
                   unverified: Iterable[Sequence[Any]]) -> dict[str, VerificationCounts]:
    """{chapter id: its VerificationCounts} from the exam's questions with a verdict, counted
    by (chapter_id, verdict, withdrawn: whether it left the numbering), and, when there are
    any, those of its bank with none, counted by chapter_id (an exam none of whose questions
    has a verdict is not verified: it has no counts)."""
    counts: dict[str, VerificationCounts] = {}
    for chapter_id, verdict, withdrawn, n in verdicts:
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
        for chapter_id, n in unverified:
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


def summary_state(stored: str, total: int, done: int, active: bool, failed: bool) -> str:
    """exam_state from what a page of exams reads of each (Reports._summaries): the exam's
    stored state, its chapters and those done, and whether any slice has work left (pending
    or running) or failed."""
    counts = ChapterCounts(total=total, done=done)
    if active:
        counts.pending = 1  # work left: exam_state needs no more than that
    elif failed:
        counts.failed = 1
    else:
        counts.cancelled = total - done
    return exam_state(stored, counts)


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
    # The language the syllabus names for it (a BCP 47 tag, examforge.languages), recorded at
    # every enqueue; a chapter may have its own (ChapterReport.language).
    language: str = DEFAULT_LANGUAGE

    @property
    def finished(self) -> bool:
        """No slice is pending or running (whatever the pause)."""
        return self.chapters.pending + self.chapters.running == 0

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for hidden in ("cost_usd", "reserved_usd"):
            data["usage"].pop(hidden)
        return data


@dataclass
class StatusRows:
    """What `status` reads of one exam, in one snapshot (storage.reports `Reports.status`;
    producer/read_sqlite.py reads the same rows from a SQLite file), and `exam_report` makes
    the report of. Rows are read by attribute, as the columns are named."""

    exam: Any  # the exam's row, with `now`: the database clock
    coverage: dict[str, tuple[int, int]]  # chapter: (passages cited, passages)
    verified: dict[str, VerificationCounts]  # tally_verdicts of the exam's verdicts
    # The ledger grouped by (chapter_id, outcome, endpoint, usage_estimated, price_known,
    # model, service_tier): those seven, then the count of calls and the sums of prompt,
    # completion, cost, reserved, questions stored and cached tokens.
    usage: Sequence[Sequence[Any]]
    slices: Sequence[Any]  # every slice in syllabus order, with `stored` (Reports._slice_rows)
    times: Any  # first (call started), last (call finished), changed (slice), last_minute
    errors: Sequence[Any]  # the RECENT_ERRORS newest failed and wasted calls
    batches: list[BatchRow]  # newest first


def exam_report(slug: str, rows: StatusRows) -> ExamReport:
    """`status`'s report of the exam `slug` from what it read."""
    exam, coverage, verified, times = rows.exam, rows.coverage, rows.verified, rows.times
    usage_rows, slices, errors, batches = rows.usage, rows.slices, rows.errors, rows.batches
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
    listed = [chapter_report(chapter_id, chapter_rows, exam.now,
                             calls_by_chapter.get(chapter_id, 0))
              for chapter_id, chapter_rows in by_chapter.items()]
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
        verification=verification, verify=getattr(exam, "verify", None) or "off",
        language=getattr(exam, "language", None) or DEFAULT_LANGUAGE)


def chapter_report(chapter_id: str, rows: list[Any], now: float, calls: int) -> ChapterReport:
    """A chapter's report from its slices' rows (those of `StatusRows.slices`), its calls and
    the database clock (a running slice whose lease lapsed reads as pending)."""
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
        slices=reports, language=getattr(rows[0], "language", None) or DEFAULT_LANGUAGE)


@dataclass
class ChapterReview:
    """`review SLUG`: a chapter's questions in the bank (up to its target) by review state,
    those the blind solve disputed (None: no verdicts in this schema) and those rejected."""

    chapter_id: str
    title: str
    target: int
    questions: int
    unreviewed: int
    approved: int
    rejected: int
    disputed: int | None
    # Approved or edited before `--regenerate` cut the chapter again: to review again.
    stale: int = 0
    # In the bank with no verdict booked (none yet, or pending), in an exam whose questions
    # are verified (None when none of them ever was).
    unverified: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def chapter_reviews(chapters: Sequence[Any], counts: Mapping[tuple[str, str], int],
                    rejected: Mapping[str, int], disputed: Mapping[str, int] | None,
                    verified: bool, unverified: Mapping[str, int]) -> list[ChapterReview]:
    """`review`'s chapters from what it read (storage.review `Review.review_summary`): the
    exam's chapters in syllabus order (chapter_id, title, target), the questions in the bank
    by (chapter, review state), the rejected ones, the disputed ones not rejected and those
    of the bank with no verdict or a pending one, by chapter, and whether any question of
    the exam has a verdict."""
    out = []
    for ch in chapters:
        unreviewed = counts.get((ch.chapter_id, ReviewState.unreviewed.value), 0)
        approved = counts.get((ch.chapter_id, ReviewState.approved.value), 0)
        in_bank = sum(n for (c, _), n in counts.items() if c == ch.chapter_id)
        out.append(ChapterReview(
            chapter_id=ch.chapter_id, title=ch.title, target=int(ch.target or 0),
            questions=in_bank, unreviewed=unreviewed, approved=approved,
            rejected=int(rejected.get(ch.chapter_id, 0)),
            disputed=None if disputed is None else disputed.get(ch.chapter_id, 0),
            stale=counts.get((ch.chapter_id, ReviewState.stale.value), 0),
            unverified=unverified.get(ch.chapter_id, 0) if verified else None))
    return out
