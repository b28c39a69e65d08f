"""The tables. Times are float epoch seconds read from the database's clock (`*_at`), so
leases never depend on a worker's clock. Statuses are str enums stored as plain strings."""

from __future__ import annotations

import secrets
from typing import Any, Optional

from sqlalchemy import (BigInteger, Boolean, Column, Index, LargeBinary, Text, UniqueConstraint,
                        false, text)
from sqlmodel import Field, SQLModel

from examforge.languages import DEFAULT_LANGUAGE

# The states these tables store, as str enums: in storage.states, which imports no SQLAlchemy
# (the plain-driver reads of producer/read_sqlite.py compare them too); named here as well.
from storage.states import (FINAL_RUN_STATES, LIVE_BATCH_STATES, BatchState, CallKind,
                            CallOutcome, CallReason, ChapterState, ExamMode, ExamState,
                            RequeueReason, ReviewState, RunState, Verdict, VerifyPolicy,
                            Withdrawn)


def new_epoch() -> int:
    """A fresh `exam.index_epoch`: random, so that an exam deleted and recorded again never
    shows a process the epoch its index was built at."""
    return secrets.randbits(62)


def partial(sql: str) -> dict[str, Any]:
    """A partial index's condition on both databases: it holds only the rows that match, so
    reading by it costs what is active, not what is stored (migration 0017)."""
    return {"postgresql_where": text(sql), "sqlite_where": text(sql)}


# The rows that can still change, as the partial indexes of migration 0017 select them. A
# query uses such an index when its own condition implies this one (PostgreSQL proves it;
# SQLite needs the same terms, with literal values: storage.base.ACTIVE_SLICE).
ACTIVE_SLICE_SQL = "state IN ('pending', 'running')"
HELD_CANCELLED_SQL = "state = 'cancelled' AND lease_owner IS NOT NULL"
IN_FLIGHT_SQL = "outcome = 'in_flight'"


class Exam(SQLModel, table=True):
    # `exams` and GET /exams page newest first by (created_at, slug): a keyset that new
    # exams never shift (storage.reports.Reports.exam_page).
    __table_args__ = (Index("ix_exam_created", "created_at", "slug"),)

    slug: str = Field(primary_key=True, max_length=64)
    title: str = Field(sa_column=Column(Text, nullable=False))
    state: str = Field(default=ExamState.active.value, max_length=16)
    pause_reason: Optional[str] = Field(default=None, sa_column=Column(Text))
    # Why it is paused, as examforge.errors.PauseCode (migration 0020): what ends the pause is
    # decided by this, never by matching pause_reason's text.
    pause_code: Optional[str] = Field(default=None, max_length=16)
    auth_failures: int = 0
    # Money, in USD. For an exam with a budget, `spent_usd` is the booked cost of every call
    # (the sum of the ledger's cost_usd) and `reserved_usd` the worst cases of the calls in
    # flight, kept on the exam row so that the budget check and the reservation are one
    # conditional UPDATE. An exam without a budget keeps none (status sums the ledger).
    budget_usd: Optional[float] = None
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    created_at: float
    updated_at: float
    # Changed whenever questions of the exam are deleted: a process's in-memory near-duplicate
    # index of the exam (storage.neardup) is rebuilt when it sees a new one.
    index_epoch: Optional[int] = Field(
        default=None, sa_column=Column(BigInteger, nullable=True, default=new_epoch))
    # ExamMode: `sync` or `batch` (migration 0018).
    mode: str = Field(default=ExamMode.sync.value, max_length=16,
                      sa_column_kwargs={"server_default": ExamMode.sync.value})
    # VerifyPolicy: the blind solve the exam's questions get (migration 0029). The exam's,
    # not a worker's environment: what describes the work belongs to the exam row.
    verify: str = Field(default=VerifyPolicy.off.value, max_length=16,
                        sa_column_kwargs={"server_default": VerifyPolicy.off.value})
    # The BCP 47 tag of the syllabus's `language` (examforge.languages), recorded at every
    # enqueue (migration 0031); each chapter's own is on its slices.
    language: str = Field(default=DEFAULT_LANGUAGE, max_length=35,
                          sa_column_kwargs={"server_default": DEFAULT_LANGUAGE})


class Slice(SQLModel, table=True):
    """The unit of work: a fixed range of one chapter's question numbers, `first_number` to
    `first_number + target - 1`, with its own lease, attempts, backoff and message. The ranges
    of a chapter's slices are disjoint, so UNIQUE(exam, chapter_id, number) still makes a
    double commit impossible while its slices run at once; the chapter is done when all of
    them are. The chapter's own fields (position, title, prompt, spec_hash, language) are
    repeated on each of its slices so that a claim reads one row; they always change
    together."""

    __table_args__ = (
        # The work in progress, in the order the reconciler reads it (storage.recovery).
        Index("ix_slice_active", "exam", "position", "slice_no", **partial(ACTIVE_SLICE_SQL)),
        # Cancelled under a holder's lease: what settle_cancelled looks for.
        Index("ix_slice_cancelled_held", "exam", "chapter_id", "slice_no",
              **partial(HELD_CANCELLED_SQL)),
    )

    exam: str = Field(primary_key=True, foreign_key="exam.slug", max_length=64)
    chapter_id: str = Field(primary_key=True, max_length=64)
    slice_no: int = Field(default=0, primary_key=True)
    first_number: int = 1
    position: int
    title: str = Field(sa_column=Column(Text, nullable=False))
    prompt: Optional[str] = Field(default=None, sa_column=Column(Text))
    spec_hash: str = Field(max_length=32)
    # The chapter's `difficulty` (a level, or {level: share}) and `bloom` (a list of levels)
    # from the syllabus, as JSON; NULL when it sets none (examforge.syllabus.Chapter).
    difficulty: Optional[str] = Field(default=None, sa_column=Column(Text))
    bloom: Optional[str] = Field(default=None, sa_column=Column(Text))
    # The chapter's counts per item type (examforge.item_types) as JSON, NULL for all mcq
    # (migration 0033).
    types: Optional[str] = Field(default=None, sa_column=Column(Text))
    # The hashes of the chapter's source files its questions are written from, as JSON
    # ({entry: sha256 prefix}; examforge.sources), NULL without sources (migration 0021).
    sources: Optional[str] = Field(default=None, sa_column=Column(Text))
    # The language its questions are written in (a BCP 47 tag: the chapter's, else the
    # exam's; migration 0031): what its prompts say and its replies are validated in.
    language: str = Field(default=DEFAULT_LANGUAGE, max_length=35,
                          sa_column_kwargs={"server_default": DEFAULT_LANGUAGE})
    target: int  # questions in this slice's range
    state: str = Field(default=ChapterState.pending.value, max_length=16)
    attempts: int = 0
    attempts_since_progress: int = 0
    lease_owner: Optional[str] = Field(default=None, max_length=128, index=True)
    lease_expires_at: Optional[float] = None
    not_before_at: Optional[float] = None
    enqueued_at: Optional[float] = None
    enqueue_epoch: Optional[str] = Field(default=None, max_length=64)
    picked_at: Optional[float] = None
    # Times the reconciler re-published this chapter, the last time and why (status shows it):
    # why as a code (RequeueReason) and its free-text detail (migration 0024).
    requeues: int = 0
    requeued_at: Optional[float] = None
    requeue_code: Optional[str] = Field(default=None, max_length=32)
    # The blind solver's disputes are counted over the slice's questions with a higher id
    # (migration 0029): `resume` of an exam its disputes paused moves it past every question
    # stored, so each slice counts afresh (runner.verify, VERIFY_MAX_DISPUTED_*).
    disputes_from: Optional[int] = None
    requeue_reason: Optional[str] = Field(default=None, sa_column=Column(Text))
    # Why its last attempt ended early, as a code (examforge.errors.SliceReason), and the
    # free-text detail beside it (migration 0024); readers decide by the code, never the text.
    last_error_code: Optional[str] = Field(default=None, max_length=32)
    last_error: Optional[str] = Field(default=None, sa_column=Column(Text))
    last_error_at: Optional[float] = None
    updated_at: float


class Question(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("exam", "chapter_id", "number", name="uq_question_number"),
        # No two questions of a chapter with the same normalised text, whichever slices
        # stored them (NULL for rows stored before this rule, which are never compared).
        UniqueConstraint("exam", "chapter_id", "norm_hash", name="uq_question_text"),
        # The API's event streams read an exam's questions by the call that stored them.
        Index("ix_question_exam_call", "exam", "call_id"),
    )

    id: Optional[int] = Field(default=None, primary_key=True)
    exam: str = Field(max_length=64)
    chapter_id: str = Field(max_length=64)
    # NULL once withdrawn (Withdrawn): UNIQUE never compares NULLs, so the number is free.
    number: Optional[int] = Field(default=None, nullable=True)
    question: str = Field(sa_column=Column(Text, nullable=False))
    choices: str = Field(sa_column=Column(Text, nullable=False))  # JSON list of 4 strings
    answer_index: int
    # Its item type (examforge.item_types, migration 0033), and for a type other than mcq its
    # answer fields as JSON (then `choices` holds a multi's choices or [], and
    # `answer_index` is -1).
    type: str = Field(default="mcq", max_length=16, sa_column_kwargs={"server_default": "mcq"})
    answer: Optional[str] = Field(default=None, sa_column=Column(Text))
    explanation: str = Field(sa_column=Column(Text, nullable=False))
    norm_hash: Optional[str] = Field(default=None, max_length=32)
    # The level it was written at and the Bloom level it targets (NULL: none was asked).
    difficulty: Optional[str] = Field(default=None, max_length=16)
    bloom: Optional[str] = Field(default=None, max_length=16)
    # Where it was written from, for a chapter with sources (migration 0021): the reference
    # ("guide.pdf, page 4, passage p3") and the passage's number in its chapter.
    source: Optional[str] = Field(default=None, sa_column=Column(Text))
    passage: Optional[int] = None
    model: str = Field(default="", max_length=128)
    call_id: Optional[int] = None
    created_at: float
    # Withdrawn from the numbering (a Withdrawn value) and the number it had (migration 0022).
    withdrawn: Optional[str] = Field(default=None, max_length=16)
    withdrawn_number: Optional[int] = None
    # The blind solve (VERIFY): a Verdict, the choice the solver picked (an index into
    # `choices` as stored) and the call that solved it; all NULL when never verified.
    verdict: Optional[str] = Field(default=None, max_length=16)
    solved_index: Optional[int] = None
    # For an item type other than mcq, what the solver answered, as JSON ({"given": ...}:
    # its set of choices, true or false, its short answer or its number; migration 0033).
    solved_answer: Optional[str] = Field(default=None, sa_column=Column(Text))
    verify_call_id: Optional[int] = None
    # A person's review (migration 0023, storage.review): ReviewState, and the version every
    # review action checks and bumps (optimistic concurrency: a save made from an older
    # version is refused, never applied over a newer one). Who acted last and when; each
    # action, with an edit's fields before and after, is a row of question_edit.
    review: str = Field(default="unreviewed", max_length=16,
                        sa_column_kwargs={"server_default": "unreviewed"})
    version: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    reviewed_by: Optional[str] = Field(default=None, max_length=64)
    reviewed_at: Optional[float] = None
    # Why a question reviewed before `enqueue --regenerate` (kept, review `stale`) may no
    # longer match its chapter: the change named (migration 0027); NULL otherwise.
    stale: Optional[str] = Field(default=None, sa_column=Column(Text))


class QuestionEdit(SQLModel, table=True):
    """One review action on a question (migration 0023): approve, reject or edit, by whom
    (the API client: a hash of its bearer token, never the token) and when, the version it
    made, and for an edit the fields it changed as {field: [before, after]} (JSON). The
    question row holds the current text; its first edit's `before` values are the text as
    generated, so nothing a reviewer changes is lost."""

    __tablename__ = "question_edit"
    __table_args__ = (Index("ix_question_edit_question", "question_id", "id"),
                      Index("ix_question_edit_exam", "exam", "id"))

    id: Optional[int] = Field(default=None, primary_key=True)
    question_id: int
    exam: str = Field(max_length=64)
    chapter_id: str = Field(max_length=64)
    number: int
    action: str = Field(max_length=16)  # approve, reject, edit
    version: int  # the question's version after it
    client: str = Field(default="", max_length=64)
    changes: Optional[str] = Field(default=None, sa_column=Column(Text))
    note: Optional[str] = Field(default=None, sa_column=Column(Text))
    at: float


class Call(SQLModel, table=True):
    """One paid request to the provider, recorded before it is sent and updated after."""

    __table_args__ = (Index("ix_call_chapter_outcome", "exam", "chapter_id", "outcome"),
                      # The calls in flight: what settling orphans and pausing spent exams read.
                      Index("ix_call_in_flight", "exam", "chapter_id", "slice_no",
                            **partial(IN_FLIGHT_SQL)))

    id: Optional[int] = Field(default=None, primary_key=True)
    exam: str = Field(max_length=64)
    chapter_id: str = Field(max_length=64)
    slice_no: int = 0
    attempt: int
    first_number: int
    requested: int
    worker: str = Field(max_length=128)
    outcome: str = Field(default=CallOutcome.in_flight.value, max_length=16)
    # A CallReason or an ErrorKind value (None for a call that stored its questions).
    reason: Optional[str] = Field(default=None, max_length=32)
    detail: Optional[str] = Field(default=None, sa_column=Column(Text))
    status_code: Optional[int] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those the provider read from its prompt cache (billed at its cached
    # price): OpenAI's usage.prompt_tokens_details.cached_tokens.
    cached_tokens: int = 0
    cost_usd: float = 0.0
    # The processing tier the provider's reply says served the call (OpenAI's service_tier:
    # default, flex, priority), which its cost is priced at; None without one.
    service_tier: Optional[str] = Field(default=None, max_length=32)
    questions_stored: int = 0
    # "primary" or "fallback" (LLM_FALLBACK_BASE_URL); None while in flight or when unknown.
    endpoint: Optional[str] = Field(default=None, max_length=16)
    # The model asked for, the call's cap and its worst-case cost (reserved against the
    # budget while it is in flight); whether its tokens are our own count (the provider sent
    # no usage, or the reply never came) and whether a price was known for its model.
    model: Optional[str] = Field(default=None, max_length=128)
    max_tokens: Optional[int] = None
    reserved_usd: float = 0.0
    usage_estimated: bool = False
    price_known: bool = True
    # A CallKind; NULL for a generation call (migration 0022).
    kind: Optional[str] = Field(default=None, max_length=16)
    started_at: float
    finished_at: Optional[float] = None


class StoredSyllabus(SQLModel, table=True):
    """A syllabus sent through the API (PUT /exams/SLUG), kept in the database so that every
    API replica and worker sees the same one. `body` is the syllabus as validated, in JSON.
    An exam with a file in EXAMS_DIR never has one: the file is its syllabus."""

    __tablename__ = "syllabus"

    exam: str = Field(primary_key=True, max_length=64)
    body: str = Field(sa_column=Column(Text, nullable=False))
    created_at: float
    updated_at: float


class Run(SQLModel, table=True):
    """One POST /exams/SLUG/runs: a request to generate what the exam is missing.

    `idempotency_key` is UNIQUE per client: two requests with the same key (a double click, a retry, two
    at once on two replicas) insert one row, and the loser reads the winner's; the key is set
    to NULL once older than API_IDEMPOTENCY_TTL_S (NULLs never collide). `fingerprint` is the
    hash of what was asked (exam and body), to refuse the same key with another request.
    `call_floor` is the exam's highest call id when the run began: the run's calls, cost and
    events are those above it. `state` is written once, when the run is first seen final, so
    a later run of the same exam never reopens it; and only once `launched_at` is set, so a
    run read while its request is still enqueuing is never judged by the exam as it was.
    `launching_until` is the claim of whoever is handing the run's work on (migration 0010).
    `final_view` is what GET /runs/ID said when the run was first seen final, and `client`
    scopes the key to the token that sent it (0012)."""

    __table_args__ = (UniqueConstraint("client", "idempotency_key", name="uq_run_client_key"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    exam: str = Field(max_length=64, index=True)
    # Whose key it is: a hash of the bearer token that sent it ("" without auth), so that two
    # clients' keys never meet (the draft scopes a key to its client). Migration 0012.
    client: str = Field(default="", max_length=32)
    idempotency_key: Optional[str] = Field(default=None, max_length=255)
    fingerprint: str = Field(max_length=64)
    budget_usd: Optional[float] = None
    call_floor: int = 0
    state: Optional[str] = Field(default=None, max_length=16)
    cancelled_at: Optional[float] = None
    launched_at: Optional[float] = None  # its work was enqueued (or started, in --local)
    # A hand-off in progress holds the run until then (database clock); see storage.runs.
    launching_until: Optional[float] = None
    # The run asked for batch mode ({"batch": true}; migration 0019): the mode its exam is
    # set to when the run is launched, by its request or later by the sweep.
    batch: bool = Field(default=False, sa_column=Column(
        Boolean, nullable=False, default=False, server_default=false()))
    # The blind-solve policy the run asked for ({"verify": ...}; migration 0029), recorded
    # on its exam when the run is launched; NULL: the exam keeps its own.
    verify: Optional[str] = Field(default=None, max_length=16)
    # GET /runs/ID as it was when the run was first seen final, JSON (migration 0012): a
    # later run of the exam never changes what a finished one says of itself.
    final_view: Optional[str] = Field(default=None, sa_column=Column(Text))
    # Who started it: the token's name (migration 0030); NULL for the runs before, which
    # only have `client`, a hash.
    started_by: Optional[str] = Field(default=None, max_length=64)
    created_at: float
    updated_at: float


class QuestionSig(SQLModel, table=True):
    """A stored question's near-duplicate signature (examforge.neardup): its normalised
    content words and key terms, kept so that a candidate is verified without re-reading and
    re-normalising its text, and how often the model wrote it again (rejected near-duplicates:
    the prompt lists the most repeated, see storage.neardup.steering)."""

    __tablename__ = "question_sig"
    __table_args__ = (Index("ix_question_sig_repeats", "exam", "chapter_id", "repeats"),
                      # What a process's index reads of a scope since it last looked.
                      Index("ix_question_sig_chapter_id", "exam", "chapter_id", "question_id"),
                      Index("ix_question_sig_exam_id", "exam", "question_id"))

    question_id: int = Field(primary_key=True)  # question.id
    exam: str = Field(max_length=64)
    chapter_id: str = Field(max_length=64)
    tokens: str = Field(sa_column=Column(Text, nullable=False))
    key_terms: str = Field(sa_column=Column(Text, nullable=False))
    repeats: int = 0
    # Its LSH band keys (examforge.neardup.band_keys), 64 unsigned 64-bit little-endian
    # integers: what each process's in-memory band index is built from (storage.neardup).
    bands: Optional[bytes] = Field(default=None, sa_column=Column(LargeBinary))


class DedupLock(SQLModel, table=True):
    """The row a commit locks (FOR UPDATE, on PostgreSQL) before it checks its batch for
    near-duplicates and stores it: the check and the insert are one atomic step for the scope,
    so two slices committing near-duplicates at once cannot both store theirs. `scope` is the
    chapter id, or "" for the whole exam (NEAR_DUP_SCOPE=exam)."""

    __tablename__ = "dedup_lock"

    exam: str = Field(primary_key=True, max_length=64)
    scope: str = Field(primary_key=True, max_length=64)
    commits: int = 0


class DatabaseIdentity(SQLModel, table=True):
    """The database's id: one row (id 1), written with the schema (migration 0013). Task
    messages carry it, so that a worker on another database leaves them alone."""

    __tablename__ = "database_identity"

    id: int = Field(primary_key=True)
    database_id: str = Field(max_length=32)
    created_at: float


class Batch(SQLModel, table=True):
    """One submission to a provider's Batch API (runner.batching, migration 0018).

    `id` is the submission id, written before anything is sent: the submission holds its
    slices' leases and its calls as the owner `batch/<id>`, and the provider's batch carries it
    in its metadata (`examforge_submission`), so a batch created by a submitter that died
    before recording the reply is found again by listing the provider's batches. `lease_owner`
    and `lease_expires_at` are the submitter's short lease on the submission while it works
    through the protocol's steps (BatchState); `create_attempts` counts the create calls that
    may have reached the provider. `usage` is the provider batch's own usage object (JSON),
    kept to cross-check the ledger."""

    __table_args__ = (Index("ix_batch_exam_created", "exam", "created_at"),
                      Index("ix_batch_state", "state"))

    id: str = Field(primary_key=True, max_length=32)
    exam: str = Field(max_length=64)
    state: str = Field(default=BatchState.preparing.value, max_length=16)
    provider_batch_id: Optional[str] = Field(default=None, max_length=128)
    input_file_id: Optional[str] = Field(default=None, max_length=128)
    output_file_id: Optional[str] = Field(default=None, max_length=128)
    error_file_id: Optional[str] = Field(default=None, max_length=128)
    provider_status: Optional[str] = Field(default=None, max_length=32)
    model: Optional[str] = Field(default=None, max_length=128)
    requests: int = 0  # lines in the input file
    bytes: int = 0  # its size
    request_total: int = 0  # the provider's request_counts
    request_completed: int = 0
    request_failed: int = 0
    created_at: float
    submitted_at: Optional[float] = None
    expires_at: Optional[float] = None
    finished_at: Optional[float] = None
    polled_at: Optional[float] = None
    lease_owner: Optional[str] = Field(default=None, max_length=128)
    lease_expires_at: Optional[float] = None
    create_attempts: int = 0
    cancel_requested: bool = Field(default=False, sa_column=Column(
        Boolean, nullable=False, default=False, server_default=false()))
    detail: Optional[str] = Field(default=None, sa_column=Column(Text))
    usage: Optional[str] = Field(default=None, sa_column=Column(Text))


class PassageRow(SQLModel, table=True):
    """A chapter's material cut into passages (examforge.sources), written by enqueue when
    the chapter's slices are cut (or its sources changed before any question was stored):
    what the prompts show, and what a question's `passage` points at (migration 0021)."""

    __tablename__ = "passage"

    exam: str = Field(primary_key=True, max_length=64)
    chapter_id: str = Field(primary_key=True, max_length=64)
    seq: int = Field(primary_key=True)  # 1..N in the chapter; its id is "p<seq>"
    source: str = Field(sa_column=Column(Text, nullable=False))  # the file's name
    location: Optional[str] = Field(default=None, sa_column=Column(Text))  # page or heading
    text: str = Field(sa_column=Column(Text, nullable=False))


class SourceText(SQLModel, table=True):
    """A source's text as extracted once (examforge.sources.sections_of), by the hash of its
    bytes and how it is read (its kind and, for a PDF, the pages listed): `enqueue`, `run` and
    `POST /runs` read a file again only when its bytes change (migration 0028)."""

    __tablename__ = "source_text"

    key: str = Field(primary_key=True, max_length=96)
    sections: str = Field(sa_column=Column(Text, nullable=False))  # JSON [[where, text], ...]
    chars: int
    created_at: float


class SourceFile(SQLModel, table=True):
    """A source file of an exam made through the API (PUT /exams/SLUG/sources/NAME): its
    bytes, kept in the database so that every replica and worker reads the same one, and
    so that no request ever names a path the server reads (migration 0021)."""

    __tablename__ = "source_file"

    exam: str = Field(primary_key=True, max_length=64)
    name: str = Field(primary_key=True, max_length=255)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    sha256: str = Field(max_length=64)
    size: int
    created_at: float
    updated_at: float


class ApiToken(SQLModel, table=True):
    """A named bearer token of the API with a role and, optionally, the exams it may see
    (migration 0030). Only the SHA-256 of the token is kept (producer.access explains why a
    plain hash is enough): the database never holds a credential. A revoked token keeps its
    row, so that the history that names it still reads; a name is unique among the live
    tokens only, so a person's leaked token can be revoked and issued again under the same
    name."""

    __tablename__ = "api_token"
    __table_args__ = (Index("uq_api_token_live_name", "name", unique=True,
                            **partial("revoked_at IS NULL")),)

    id: Optional[int] = Field(default=None, primary_key=True)
    name: str = Field(max_length=64)
    role: str = Field(max_length=16)  # reader, reviewer, operator, admin
    exams: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON list; NULL: all
    token_hash: str = Field(max_length=64, unique=True)
    created_by: str = Field(default="", max_length=96)
    created_at: float
    last_used_at: Optional[float] = None  # to within TOKEN_TOUCH_S (a write per minute)
    revoked_at: Optional[float] = None


class AuditEvent(SQLModel, table=True):
    """One action that spends or changes access (migration 0030): a run started, cancelled
    or resumed, a budget set, a syllabus or source put or deleted, a token added or revoked;
    who (a token's name, or `cli:<user>`), when (the database's clock), the exam, details
    (JSON) and the outcome (ok, refused, failed). Read newest first, in keyset pages by id."""

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_exam", "exam", "id"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    at: float = Field(index=True)
    actor: str = Field(max_length=96)
    action: str = Field(max_length=32)
    exam: Optional[str] = Field(default=None, max_length=64)
    details: Optional[str] = Field(default=None, sa_column=Column(Text))
    outcome: str = Field(max_length=16)
