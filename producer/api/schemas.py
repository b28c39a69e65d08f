"""The API's JSON shapes: what each endpoint answers, declared so /openapi.json is complete.

Times are ISO 8601 strings in UTC (the database's clock), money is USD, like `status --json`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def whole_number(value: Any) -> Any:
    """JSON has one kind of number: 3.0 is the integer 3 to JSON Schema, and so to the
    OpenAPI document's `integer`. Taken as 3; a fraction, a string or a boolean is still
    refused (the fields are strict). (A syllabus keeps its own rule: `questions: 5.0` in a
    file is refused, as the file's validation always did.)"""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# The largest id or version the API takes: 2**53 - 1, the largest integer every JSON client
# holds exactly (JavaScript's Number.MAX_SAFE_INTEGER). A bound past it reads back, through a
# double, as another number than the one written (2**62 becomes 4611686018427388000).
MAX_ID = 2**53 - 1
# Integers of a request body: 3.0 is 3 (JSON Schema's `integer` says so), a string, a
# boolean or a fraction is refused (strict); the bounds stated in the document.
Id = Annotated[int, Field(ge=1, le=MAX_ID, strict=True), BeforeValidator(whole_number)]
AnswerIndex = Annotated[int, Field(ge=0, le=3, strict=True), BeforeValidator(whole_number)]


class Problem(BaseModel):
    """An RFC 9457 problem document (application/problem+json)."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None


class Progress(BaseModel):
    done: int
    target: int


class ChapterCounts(BaseModel):
    total: int
    pending: int
    running: int
    done: int
    failed: int
    cancelled: int


class BatchRequests(BaseModel):
    total: int
    completed: int
    failed: int


class BatchOut(BaseModel):
    """A submission to the provider's Batch API (batch mode), as `status --json` lists it."""

    id: str | None = Field(description="The provider's batch id (null until it is created).")
    submission: str = Field(description="Our submission id: recorded before anything is "
                                        "sent, and in the provider batch's metadata.")
    state: str = Field(description="Our step: preparing, uploaded, creating, submitted (the "
                                   "provider has it), done, abandoned (never sent, $0).")
    status: str = Field(description="The provider's status while it has the batch "
                                    "(validating, in_progress, finalizing, cancelling, "
                                    "completed, expired, cancelled, failed), else `state`.")
    provider_status: str | None
    live: bool = Field(description="Not ended yet: its slices wait on it.")
    requests: BatchRequests
    created_at: str | None
    submitted_at: str | None
    expires_at: str | None = Field(description="When the provider's 24 h window ends.")
    finished_at: str | None
    polled_at: str | None
    cancel_requested: bool
    detail: str | None
    waiting: str | None = Field(description="What its slices wait on, while it is live.")


class RunRequest(BaseModel):
    """POST /exams/SLUG/runs: optional; `{}` is the default."""

    model_config = ConfigDict(extra="forbid")

    batch: bool | None = Field(
        None, strict=True,
        description="Generate through the provider's Batch API (as enqueue --batch): about "
                    "half the price, results within the provider's 24 h window. Default: "
                    "LLM_BATCH. Part of the request: the same Idempotency-Key with another "
                    "value is refused (422).")

    budget_usd: float | None = Field(
        None, gt=0, allow_inf_nan=False, strict=True,
        description="The exam's budget in USD (as enqueue --budget-usd): never exceeded; a "
                    "raised one resumes an exam its budget paused. Default: the exam's, or "
                    "BUDGET_USD for a new exam.")

    verify: Literal["off", "flag", "replace"] | None = Field(
        None,
        description="The exam's blind-solve policy (as enqueue --verify), recorded on the "
                    "exam and followed by every worker; flag or replace also solves the "
                    "questions stored unverified, once each. Default: the syllabus's "
                    "`verify`, else the exam's own, else (a new exam) the server's VERIFY.")


class RunOut(BaseModel):
    """A run: the exam's progress and state since POST /exams/SLUG/runs made it."""

    id: int
    exam: str
    state: str = Field(description="queued, running, done, failed, cancelled or paused")
    pause_reason: str | None = Field(description="Why it is paused (state paused), else null.")
    pause_code: str | None = Field(default=None, description=(
        "Why it is paused, as a code: budget (a new run with a raised budget resumes it), "
        "provider, auth or manual (a new run resumes it once fixed); null unless paused."))
    questions: Progress
    chapters: ChapterCounts
    cost_usd: float = Field(description="What the run's calls cost.")
    budget_usd: float | None = Field(description="The exam's budget (null: none).")
    spent_usd: float = Field(description="What every call of the exam cost.")
    created_at: str
    updated_at: str
    batch: bool = Field(False, description="The run asked for batch mode.")
    state_detail: str | None = Field(
        None, description="What a running run waits on, e.g. \"waiting on the provider's "
                          "batch batch_abc (in_progress, 40/120 done)\"; else null.")
    batches: list[BatchOut] = Field(
        default_factory=list, description="The provider batches of its exam submitted since "
                                          "the run began, newest first.")
    started_by: str | None = Field(
        None, description="Who started it: the token's name (a run from before names: a "
                          "hash of its token; null without auth).")


class RunList(BaseModel):
    items: list[RunOut]


class ExamSummary(BaseModel):
    """One exam, as `exams --json` lists it; state `new` for a syllabus stored and never run."""

    exam: str
    title: str
    state: str
    chapters: dict[str, int] = Field(description='{"done": n, "total": n}')
    questions: Progress
    cost_usd: float
    updated_at: str | None
    source: str = Field(description="file (EXAMS_DIR) or api (PUT /exams/SLUG)")


class ExamList(BaseModel):
    items: list[ExamSummary]
    next: str | None = Field(None, description="The cursor of the next page (`after=`); "
                                               "null on the last page.")


class SourceStored(BaseModel):
    """PUT /exams/SLUG/sources/NAME's answer: the source as stored."""

    exam: str
    source: str = Field(description="Its name, as the syllabus lists it")
    bytes: int
    sha256: str = Field(description="The first 16 hex digits of its SHA-256")


class SourceItem(BaseModel):
    name: str
    bytes: int
    sha256: str


class SourceList(BaseModel):
    """The sources uploaded for an API exam."""

    items: list[SourceItem]


class ExamStored(BaseModel):
    """PUT /exams/SLUG's answer: the syllabus as stored."""

    exam: str
    title: str
    chapters: int
    questions: int


class VerificationOut(BaseModel):
    """What the blind solve said: questions in the bank `agreed` and `pending`; every
    question `disputed`, of which `withdrawn` left the bank (VERIFY=replace: replaced)."""

    agreed: int
    disputed: int
    pending: int
    withdrawn: int
    unverified: int = Field(default=0, description=(
        "In the bank with no verdict (never solved) in an exam whose questions are "
        "verified."))


class ChapterStatus(BaseModel):
    """A chapter of `status --json` (every field it has; the ones about reasons typed here)."""

    model_config = ConfigDict(extra="allow")

    id: str
    state: str
    last_error: str | None = Field(default=None, description=(
        "Why its last attempt ended early, for people: \"transient: HTTP 503 ...\"."))
    last_error_code: str | None = Field(default=None, description=(
        "The same as a code: handed_back, rate_limited, flex_unavailable, budget_wait, "
        "budget, auth, stopped, transient, permanent, invalid_output, duplicates, too_large, "
        "not_sent, attempt_cap, unexpected or legacy (text written before codes); null "
        "when it has none."))
    requeue_reason: str | None = Field(default=None, description=(
        "Why the reconciler last re-published it, for people."))
    requeue_code: str | None = Field(default=None, description=(
        "The same as a code: worker_vanished, broker_epoch_changed, message_lost or legacy."))
    verification: VerificationOut | None = Field(default=None, description=(
        "The blind solve's verdicts (VERIFY) of its questions; null when none was verified."))
    language: str = Field(default="en", description=(
        "The BCP 47 tag of the language its questions are written in: its own `language`, "
        "else the exam's."))


class ExamStatus(BaseModel):
    """`status --json` of one exam (every field it has; the main ones typed here)."""

    model_config = ConfigDict(extra="allow")

    exam: str
    title: str
    state: str
    pause_reason: str | None
    pause_code: str | None = Field(default=None, description=(
        "Why it is paused, as a code: budget (a raised budget resumes it), provider, auth or "
        "manual (resume); null unless paused."))
    chapters: ChapterCounts
    questions: Progress
    cost_usd: float
    budget_usd: float | None
    chapter_list: list[ChapterStatus]
    mode: str = Field("sync", description="sync, or batch (the provider's Batch API)")
    batches: list[BatchOut] = Field(default_factory=list,
                                    description="Its provider batches, newest first.")
    verification: VerificationOut | None = Field(default=None, description=(
        "The blind solve's verdicts (VERIFY) over its chapters (each chapter has its own "
        "`verification`); null when no question was verified."))
    verify: str | None = Field(default=None, description=(
        "Its blind-solve policy: off, flag or replace, recorded on the exam (enqueue "
        "--verify, a run's or the syllabus's `verify`) and followed by every worker; for a "
        "`new` exam, the syllabus's `verify` (null: none named)."))
    language: str = Field(default="en", description=(
        "The BCP 47 tag of the language the syllabus names for the exam (en, fa, ar, ru, ...), "
        "recorded at every enqueue and followed by every worker; a chapter may name its own "
        "(each chapter's `language`)."))


class Question(BaseModel):
    id: int
    chapter_id: str
    number: int
    question: str
    choices: list[str]
    answer_index: int
    explanation: str
    difficulty: str | None = Field(
        description="The level it was written at (easy, medium, hard), if its chapter asked "
                    "for one; null otherwise.")
    bloom: str | None = Field(
        description="The Bloom level it targets (remember ... create), if its chapter asked "
                    "for one; null otherwise.")
    source: str | None = Field(
        None, description="Where it was written from, when its chapter lists sources: "
                          "file, page or heading, and passage (\"guide.pdf, page 4, passage "
                          "p3\"); null otherwise.")
    verdict: str | None = Field(
        None, description="What the blind solve (VERIFY) said of its key: agreed, disputed "
                          "(VERIFY=flag keeps it marked) or pending; null when it was not "
                          "verified.")
    model: str
    created_at: str
    language: str = Field(default="en", description=(
        "The BCP 47 tag of the language it is written in (its chapter's): what a page sets "
        "as its `lang`."))
    type: Literal["mcq", "multi", "truefalse", "short", "numeric"] = Field(
        default="mcq", description="Its item type; a type other than mcq has `answer_index` "
        "-1 and its answer fields, as the review's question has them (null otherwise).")
    correct: list[int] | None = None
    answer: bool | None = None
    accepted: list[str] | None = None
    value: float | None = None
    tolerance: float | None = None
    relative: bool | None = None
    unit: str | None = None


class QuestionPage(BaseModel):
    """A page of questions by id; `next` is the `after` of the next page (null: this page
    was the last one for now; more may be stored later, ask again with the last id)."""

    items: list[Question]
    next: int | None


class Me(BaseModel):
    """Who the caller is: GET /me."""

    name: str = Field(description="The token's name (a token of API_TOKENS: a hash of it).")
    role: Literal["reader", "reviewer", "operator", "admin"] = Field(description=(
        "What it may do, each role including the one before: reader reads; reviewer also "
        "approves, rejects and edits; operator also runs, budgets and uploads; admin all."))
    exams: list[str] | None = Field(description="The exams it may see; null: every exam.")


class Health(BaseModel):
    status: str
    database: str
    broker: str


# ---- review (producer/api/review.py) ----------------------------------------------------

class ReviewQuestion(BaseModel):
    """A question as the review shows it."""

    id: int
    exam: str
    chapter_id: str
    number: int
    question: str
    choices: list[str]
    answer_index: int
    explanation: str
    difficulty: str | None
    bloom: str | None
    model: str
    created_at: str
    language: str = Field(default="en", description=(
        "The BCP 47 tag of the language it is written in (its chapter's): what a page sets "
        "as its `lang`."))
    verdict: str | None = Field(
        description="The blind solve's verdict (pending, agreed, disputed); null when it was "
                    "not verified.")
    solved_index: int | None = Field(
        default=None, description="The choice the blind solve picked (an index into "
                                  "`choices`), beside the key `answer_index`; null while no "
                                  "verdict is booked.")
    source: Any = Field(description="The passage of the course's material it cites (file, "
                                    "page or heading, passage); null when none.")
    type: Literal["mcq", "multi", "truefalse", "short", "numeric"] = Field(
        default="mcq", description="Its item type. Four-choice questions (`mcq`) have "
        "`choices` and `answer_index`; the others have `answer_index` -1 and their own "
        "answer fields below (null for the other types').")
    correct: list[int] | None = Field(default=None, description=(
        "multi: the indices of its correct choices (2 or more, not all; 4 to 6 choices)."))
    answer: bool | None = Field(default=None, description="truefalse: whether the statement "
                                                          "is true.")
    accepted: list[str] | None = Field(default=None, description=(
        "short: the 1 to 5 answers accepted (compared after normalisation: case, whitespace, "
        "Unicode form)."))
    value: float | None = Field(default=None, description="numeric: the value.")
    tolerance: float | None = Field(default=None, description=(
        "numeric: how far an answer may be from the value (0 or more)."))
    relative: bool | None = Field(default=None, description=(
        "numeric: whether the tolerance is a fraction of the value (below 1)."))
    unit: str | None = Field(default=None, description="numeric: its unit, if any.")
    solved_answer: Any = Field(default=None, description=(
        "An item of another type than mcq: what the blind solve answered (its set of "
        "choices, true or false, its short answer, its number), beside the key; null while "
        "no verdict is booked."))
    withdrawn: str | None = Field(
        description="Why it left its chapter's numbering (rejected, or disputed under "
                    "VERIFY=replace; `number` is the one it had and a replacement takes), or "
                    "null while it is in the bank.")
    review: str = Field(description="unreviewed, approved, rejected, or stale (approved or "
                                    "edited before `enqueue --regenerate` cut its chapter "
                                    "again: `stale` names the change)")
    version: int = Field(description="Bumped by every review action; a change names the "
                                     "version it was made from (If-Match or `version`).")
    reviewed_by: str | None = Field(description="The client that acted last (a hash of its "
                                                "bearer token), or null.")
    reviewed_at: str | None
    edited: bool = Field(description="A reviewer changed its text (see its history).")
    stale: str | None = Field(
        default=None, description="Why a question reviewed before its chapter was "
                                  "regenerated may no longer match it (the change named); null "
                                  "otherwise.")


class ReviewCounts(BaseModel):
    """How many of the chapter's questions each filter shows."""

    disputed: int = Field(description="In the bank, disputed by the blind solve.")
    unreviewed: int = Field(description="In the bank, not reviewed (or edited since).")
    edited: int = Field(description="In the bank, changed by a reviewer.")
    stale: int = Field(description="In the bank, reviewed before `--regenerate`.")
    approved: int = Field(description="In the bank, approved.")
    rejected: int = Field(description="Rejected: out of the bank, by the number they had.")


class ReviewChapter(BaseModel):
    exam: str
    chapter_id: str
    title: str
    filter: str | None = Field(default=None, description="The filter asked for; null: all.")
    counts: ReviewCounts = Field(description="Each filter's count over the whole chapter, "
                                             "whichever filter `items` follow.")
    items: list[ReviewQuestion]


class ChapterReviewOut(BaseModel):
    chapter_id: str
    title: str
    target: int
    questions: int = Field(description="In the bank: stored up to the target, not rejected.")
    unreviewed: int
    approved: int
    rejected: int
    disputed: int | None = Field(description="Disputed by the blind solve; null when this "
                                             "database has no verdicts.")
    stale: int = Field(default=0, description="Approved or edited before `--regenerate`: "
                                              "to review again.")
    unverified: int | None = Field(
        default=None, description="In the bank with no verdict booked (none, or pending) in "
                                  "an exam whose questions are verified; null when none ever "
                                  "was.")
    filters: ReviewCounts | None = Field(default=None, description=(
        "How many of its questions each filter (`?filter=`) shows."))


class ReviewSummary(BaseModel):
    exam: str
    chapters: list[ChapterReviewOut]
    totals: dict[str, int]
    filters: ReviewCounts | None = Field(default=None, description=(
        "How many questions each filter of the chapters' questions (`?filter=`) shows, "
        "over every chapter."))


class ReviewEvent(BaseModel):
    action: str = Field(description="approve, reject or edit")
    version: int = Field(description="The question's version it made.")
    client: str = Field(description="Who: a hash of the client's bearer token (\"\" "
                                    "without auth).")
    at: str
    changes: dict[str, list[Any]] | None = Field(
        description="An edit's changed fields: {field: [before, after]}.")
    note: str | None


class ReviewHistory(BaseModel):
    items: list[ReviewEvent]


class ReviewAction(BaseModel):
    """The body of approve and reject, optional: a `note` (reject). The version the action
    was made from is If-Match's (a client that cannot send a header may send `version`
    here instead)."""

    model_config = ConfigDict(extra="forbid")

    version: Id | None = Field(None, description="The version read (or If-Match).")
    note: str | None = Field(None, max_length=2000, description="Why (kept in the history).")


class BulkApproveItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Id = Field(description="The question's id.")
    version: Id = Field(
                         description="The version the reviewer read (its ETag's number).")


class BulkApprove(BaseModel):
    """POST /exams/SLUG/review/approve's body: each question to approve with the version
    it was read at, as a filter of the review showed them."""

    model_config = ConfigDict(extra="forbid")

    items: list[BulkApproveItem] = Field(min_length=1, max_length=1000,
                                         description="Up to 1000 questions, each once.")


class BulkApproveResult(BaseModel):
    """What the bulk approve did to one question: as its own `approve` would have answered."""

    id: int
    status: Literal[200, 404, 409] = Field(description=(
        "200: approved (or approved already); 409: not approved, because it changed since "
        "the version sent (`version` is the current one) or is out of the bank (rejected, "
        "withdrawn); 404: not a question of this exam."))
    result: Literal["approved", "conflict", "not_found"]
    version: int | None = Field(description="The question's current version (null: 404); "
                                            "send it to approve it as it is now.")
    detail: str | None = Field(description="Why it was not approved (null when it was).")
    question: ReviewQuestion | None = Field(description="The question as it is now (null: "
                                                        "404).")


class BulkApproveOut(BaseModel):
    items: list[BulkApproveResult] = Field(description="One per question sent, in order.")
    approved: int = Field(description="How many are approved now (status 200).")


class ReviewEdit(BaseModel):
    """PATCH's body: the fields to change. The version they were read at is If-Match's (a
    client that cannot send a header may send `version` here instead)."""

    model_config = ConfigDict(extra="forbid")

    version: Id | None = None
    question: str | None = Field(None, min_length=1, max_length=20_000, strict=True)
    choices: list[str] | None = Field(None, min_length=4, max_length=6, description=(
        "Four distinct choices (mcq), or four to six (multi)."))
    answer_index: AnswerIndex | None = None
    # An item of another type's answer fields (ReviewQuestion's), each only on its type;
    # validated as a generated item of the type is (422 otherwise). The type is not editable.
    correct: list[Annotated[int, Field(ge=0, le=5, strict=True),
                            BeforeValidator(whole_number)]] | None = Field(None, max_length=6)
    answer: bool | None = Field(None, strict=True)
    accepted: list[Annotated[str, Field(min_length=1, max_length=200, strict=True)]] | None = \
        Field(None, min_length=1, max_length=5)
    value: float | None = None
    tolerance: float | None = Field(None, ge=0)
    relative: bool | None = Field(None, strict=True)
    unit: str | None = Field(None, max_length=32)
    explanation: str | None = Field(None, min_length=1, max_length=20_000, strict=True)
    difficulty: Literal["easy", "medium", "hard"] | None = None
    bloom: Literal["remember", "understand", "apply", "analyze", "evaluate",
                   "create"] | None = None


class AuditItem(BaseModel):
    id: int
    at: str | None = Field(description="When, ISO 8601 (UTC).")
    actor: str = Field(description="Who: a token's name, or cli:<user> for the command line.")
    action: str = Field(description="run.start, run.cancel, run.resume, run.retry, "
                                    "budget.set, syllabus.put, source.put, source.delete, "
                                    "token.add, token.revoke, access.denied (a change "
                                    "beyond the token's role, answered 403)")
    exam: str | None
    details: dict[str, Any] | None
    outcome: str = Field(description="ok, refused (answered with a 4xx problem) or failed")


class AuditPage(BaseModel):
    items: list[AuditItem]
    next: str | None = Field(description="The cursor of the next page (`after`), null on the "
                                         "last.")
