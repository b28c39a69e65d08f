"""The one error vocabulary of examforge.

    ExamforgeError
    ├── UserError                    bad input from a person: one line, exit 2, no traceback
    │   ├── SyllabusError            a syllabus file or field is invalid
    │   ├── UnknownExam              no such exam
    │   ├── UnknownChapter           no such chapter in the exam (the API's 404)
    │   ├── UnknownQuestion          no such question in the exam (the API's 404)
    │   ├── BadEdit                  a review's edit or note is invalid (the API's 422)
    │   ├── BadCursor                a page cursor no page gave
    │   ├── BadImportLine            a line of an import file is invalid: nothing imported
    │   ├── IdempotencyKeyReused     an Idempotency-Key came back with another request
    │   ├── Forbidden                a token's role or exam scope falls short (the API's 403)
    │   ├── Conflict                 the request conflicts with the exam's state (409)
    │   │   ├── ChapterBusy          an import names a chapter a worker is generating
    │   │   ├── ExamRunning          prune asked of an exam with chapters still running
    │   │   ├── VersionConflict      a review saved from a version that is no longer current
    │   │   ├── DuplicateEdit        an edit would make a question the bank already has
    │   │   └── NothingApproved      export --approved-only of an exam with none approved
    │   └── ConfigError              a setting is invalid
    │       └── NoSchema             the database has no examforge schema (a read-only command)
    ├── InfrastructureError          a service we depend on is down: one line, exit 3
    │   ├── BrokerUnavailable
    │   ├── DatabaseUnavailable
    │   ├── RunNotLaunched           an API run is stored but the broker refused its work
    │   └── ExportInterrupted        a streamed export's writer failed mid-response
    ├── DatabaseCorrupt              the database's file or pages are damaged: one line, exit 4
    ├── ProviderError                the model provider failed a call (examforge.classify
    │   │                            decides which, from the status and the error body)
    │   ├── RetryableProviderError   timeout, connection reset, 5xx: retrying can fix it
    │   │   ├── RateLimited          429 from a rate limit: every worker holds back
    │   │   ├── CapacityUnavailable  flex's 429 "Resource unavailable": this call backs off
    │   │   └── ReplyLost            sent, and no whole reply came back (may be billed)
    │   │       └── DeadlineExceeded no complete reply within LLM_TIMEOUT_S
    │   ├── ReplyTooLarge            a reply over LLM_MAX_REPLY_BYTES, cut off (may be billed)
    │   ├── ReplyUnusable            a billed 200 whose envelope or content cannot be used
    │   └── PermanentProviderError   400, 422, ...: this request is wrong; fail the chapter
    │       └── ExamStopped          nothing can succeed until a person acts: pause the exam
    │           ├── AuthError        401, 403: the key was rejected
    │           ├── QuotaExceeded    insufficient_quota, 402, a credit balance too low
    │           └── ModelNotFound    the provider does not know LLM_MODEL
    ├── BudgetExceeded               the next call's worst case does not fit in the budget
    ├── SolverDisputes               the blind solver keeps disputing a slice's keys (replace)
    ├── OutputInvalid                the model answered, but not with usable questions
    └── LeaseLost                    another worker owns the chapter now; our result is void
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping


class ErrorKind(str, Enum):
    """What went wrong with a call, as the ledger and `status` name it."""

    rate_limited = "rate_limited"
    quota = "quota"
    auth = "auth"
    model_not_found = "model_not_found"
    bad_request = "bad_request"
    server_error = "server_error"
    conflict = "conflict"  # 408, 409, 425: the server asks for the request again
    timeout = "timeout"
    deadline = "deadline"
    connection = "connection"
    unreadable = "unreadable"  # a 200 whose envelope is broken, a corrupt body
    reply_cut = "reply_cut"  # a 200 whose body stopped mid-way (the connection closed)
    reply_too_large = "reply_too_large"
    redirect = "redirect"
    tls = "tls"
    # A 429 for a service_tier=flex request the provider has no flex capacity for right now.
    resource_unavailable = "resource_unavailable"
    # A provider batch's line that never ran: the batch expired or was cancelled first; and a
    # batch refused at validation for the model's enqueued-token limit (issue 18). Retryable.
    batch_expired = "batch_expired"
    batch_cancelled = "batch_cancelled"
    batch_token_limit = "batch_token_limit"
    # A finished batch whose output or error file is gone at the provider (purged, deleted):
    # its lines ran and were billed, and their replies can never be read. Booked at their
    # worst case (runner.batching.BATCH_FILE_TRIES).
    batch_output_lost = "batch_output_lost"


@dataclass(frozen=True)
class Billed:
    """What the provider billed, or may have billed, for a call that raised: its usage as
    the reply reported it, or (`estimated`) our own count, the worst case when the reply
    never arrived whole. The pipeline books it as a wasted call; the rate limiter keeps it."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    estimated: bool
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    service_tier: str | None = None  # the tier the reply says served it (priced at it)


class ExamforgeError(Exception):
    """An examforge error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UserError(ExamforgeError):
    """Invalid input."""

    exit_code = 2


class SyllabusError(UserError):
    """Raised when a syllabus file is missing, unreadable or fails validation."""


class SourceError(SyllabusError):
    """A chapter's source file is refused: outside EXAMS_DIR, unreadable, encrypted, scanned
    (no text) or over a cap (examforge.sources)."""


class UnknownExam(UserError):
    """Raised when an exam slug names no syllabus and no stored exam."""


class UnknownChapter(UserError):
    """Raised when a chapter id names no chapter of the exam."""


class UnknownQuestion(UserError):
    """Raised when a question id names no question of the exam."""


class BadEdit(UserError):
    """Raised when a review's edit names a field it cannot change or a value a question
    cannot hold (two equal choices, an answer out of range, an unknown level)."""


class Forbidden(UserError):
    """Raised when a token's role, or its exam scope, falls short of what a request needs
    (the API's 403, naming the role needed)."""

    def __init__(self, message: str, required_role: str, every_exam: bool = False) -> None:
        super().__init__(message)
        self.required_role, self.every_exam = required_role, every_exam


class BadCursor(UserError):
    """Raised when a page cursor (`exams --after`, GET /exams?after=) is not one a page gave."""


class BadImportLine(UserError):
    """Raised when a line of an import file fails validation: nothing is imported."""


class IdempotencyKeyReused(UserError):
    """Raised when an Idempotency-Key comes back with a request other than its first."""


class Conflict(UserError):
    """Raised when a request conflicts with the exam's state (the API's 409)."""


class ChapterBusy(Conflict):
    """Raised when an import would write a chapter that a worker is generating right now."""


class ExamRunning(Conflict):
    """Raised when pruning is asked of an exam that has pending or running chapters."""


class DuplicateEdit(Conflict):
    """Raised when an edit's text is the same (normalised) as, or a near-duplicate of,
    another question of the bank: nothing is changed; `other_id` and `other_number` name
    that question."""

    def __init__(self, message: str, other_id: int, other_number: int | None) -> None:
        super().__init__(message)
        self.other_id, self.other_number = other_id, other_number


class NothingApproved(Conflict):
    """Raised when `export --approved-only` (`?approved_only=true`) is asked of an exam none
    of whose questions a reviewer approved: an empty bank is not a success (exit 1, 409);
    no file is written."""

    exit_code = 1


class VersionConflict(Conflict):
    """Raised when a review action (approve, reject, edit) names a version of the question
    that is no longer its current one: another reviewer saved it first. Nothing is changed;
    `version` is the current version and `question` the question as it is now."""

    def __init__(self, message: str, version: int, question: Mapping[str, object]) -> None:
        super().__init__(message)
        self.version = version
        self.question = dict(question)


class ConfigError(UserError):
    """Raised when the settings (environment or .env) are invalid."""


class NoSchema(ConfigError):
    """The database has no examforge schema, or an older one, and the command only reads."""


class InfrastructureError(ExamforgeError):
    """A service examforge depends on is unavailable."""

    exit_code = 3


class BrokerUnavailable(InfrastructureError):
    """Raised when the Celery broker cannot be reached within the connect timeout."""


class DatabaseUnavailable(InfrastructureError):
    """Raised when the database cannot be reached."""


class RunNotLaunched(InfrastructureError):
    """Raised when a run is stored but its work could not be handed on (the broker refused):
    the run stays queued and is launched later (503)."""

    def __init__(self, run_id: int, cause: Exception) -> None:
        super().__init__(f"{cause}; run {run_id} is stored and stays queued: the same "
                         "Idempotency-Key, or the server's next sweep, starts it")
        self.run_id = run_id


class ExportInterrupted(InfrastructureError):
    """Raised mid-response when a streamed export's writer failed: the client sees an
    incomplete body rather than one that looks whole."""


class DatabaseCorrupt(ExamforgeError):
    """Raised when the database answers that its own data is damaged (SQLite's "database
    disk image is malformed" or "file is not a database", PostgreSQL's SQLSTATE class XX).
    Not an outage: waiting or retrying never fixes it, so every command stops with exit 4,
    and a worker shuts down instead of retrying its tasks (storage.db.corruption)."""

    exit_code = 4


class ProviderError(ExamforgeError):
    """Raised when a model call fails."""

    default_kind = ErrorKind.server_error

    def __init__(
        self,
        message: str | None = None,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.kind: ErrorKind = self.default_kind
        self.endpoint: str | None = None  # "primary" or "fallback", set by the client
        # Set when the provider billed, or may have billed, the call (examforge.llm sets it):
        # a reply read but unusable, or sent and never received whole. None: nothing was
        # billed (refused before the provider did the work, or never delivered).
        self.billed: Billed | None = None
        # The reply's headers, when there was a reply (rate-limit hints for the limiter).
        self.headers: Mapping[str, str] | None = None


class RetryableProviderError(ProviderError):
    """Raised for timeouts, connection errors, 429 and 5xx: a later attempt may succeed."""


class RateLimited(RetryableProviderError):
    """Raised for a 429 from a rate limit: the provider's limit is shared, so every worker on
    that endpoint holds back until its Retry-After, and no attempt of the chapter is counted."""

    default_kind = ErrorKind.rate_limited


class CapacityUnavailable(RetryableProviderError):
    """Raised for flex's 429 "Resource unavailable" (code `resource_unavailable`): the
    provider has no flex capacity now. Unlike a rate limit it says nothing about the
    account's limits, so it holds back no other worker and no other tier: only this chapter
    backs off, exponentially by `in_row` (this process's refusals in a row), and the attempt
    is not counted (a long shortage must neither fail the chapter nor pause the exam)."""

    default_kind = ErrorKind.resource_unavailable
    in_row: int = 1


class ReplyLost(RetryableProviderError):
    """Raised when the request was sent and its reply never arrived whole: a 200 whose body
    stopped mid-way (the connection closed after the headers). The provider may well bill
    it: it is booked at its worst case (`billed`), and retried, since the request may be fine."""

    default_kind = ErrorKind.reply_cut


class DeadlineExceeded(ReplyLost):
    """Raised when a reply did not arrive in full within LLM_TIMEOUT_S of sending the request
    (a silent server, or one that trickles its reply); the connection is closed."""

    default_kind = ErrorKind.deadline


class ReplyTooLarge(ProviderError):
    """Raised when a reply is larger than LLM_MAX_REPLY_BYTES: it is cut off and refused, so a
    broken or hostile endpoint cannot exhaust a worker's memory."""

    default_kind = ErrorKind.reply_too_large


class ReplyUnusable(ProviderError):
    """Raised for a 200 the provider billed whose envelope or content cannot be used (no
    choices, content of a wrong type, a body that is not JSON): booked at its usage as wasted
    invalid output and re-asked like one (MAX_REASKS), never retried as a transient fault."""

    default_kind = ErrorKind.unreadable


class PermanentProviderError(ProviderError):
    """Raised for 4xx replies other than 408/409/429: the request itself is wrong."""

    default_kind = ErrorKind.bad_request


class ExamStopped(PermanentProviderError):
    """Raised when no call of the exam can succeed until a person fixes something: the exam is
    paused with the reason, and `producer resume SLUG` continues it."""


class EndpointUnreachable(ExamStopped):
    """Raised when the model endpoint (and its fallback, if any) refused or dropped every
    connection for LLM_UNREACHABLE_PAUSE_S, across calls: the exam is paused (pause code
    `unreachable`) with the endpoint named, and `producer resume SLUG` continues it once the
    endpoint is back. Nothing was sent, so nothing was paid."""

    default_kind = ErrorKind.connection


class AuthError(ExamStopped):
    """Raised when the provider rejects the API key (401/403)."""

    default_kind = ErrorKind.auth


class QuotaExceeded(ExamStopped):
    """Raised when the account has no quota or credit left (OpenAI's 429 insufficient_quota,
    402 Payment Required, "credit balance is too low"): waiting does not fix it."""

    default_kind = ErrorKind.quota


class ModelNotFound(ExamStopped):
    """Raised when the provider does not know the model asked for (LLM_MODEL)."""

    default_kind = ErrorKind.model_not_found


class BudgetExceeded(ExamforgeError):
    """Raised when the next call's worst case does not fit in what is left of the exam's
    budget. With calls still in flight elsewhere under a live lease (`others_in_flight`; a dead
    holder's call is settled first and never counts), their real cost may free room: wait.
    With none, nothing more fits: the exam is paused until its budget is raised."""

    def __init__(self, message: str, *, others_in_flight: bool) -> None:
        super().__init__(message)
        self.others_in_flight = others_in_flight


class SolverDisputes(ExamforgeError):
    """Raised when the blind solver disputed too many of a slice's keys under
    VERIFY=replace: VERIFY_MAX_DISPUTED_IN_ROW in a row, or more than
    VERIFY_MAX_DISPUTED_SHARE of at least that many. Each disputed key is withdrawn and
    replaced, and each replacement is a paid call: a solver (or a generator) that is wrong
    every time would spend without end. The exam pauses (PauseCode.disputes) until a person
    checks VERIFY_MODEL and LLM_MODEL and runs `resume`."""


class PauseCode(str, Enum):
    """Why an exam is paused, as stored in exam.pause_code beside the human text of
    exam.pause_reason: what ends the pause depends on it, so it is never read from the text."""

    budget = "budget"  # nothing more fits in its budget: a raised budget resumes it
    provider = "provider"  # the provider refused every call (quota, model): `resume` after the fix
    auth = "auth"  # AUTH_FAILURE_LIMIT auth failures in a row: `resume` after the key is fixed
    # The model endpoint refused or dropped every connection for LLM_UNREACHABLE_PAUSE_S:
    # `resume` once it is back.
    unreachable = "unreachable"
    manual = "manual"  # paused for another reason (an older database's pause with no code)
    # The blind solver kept disputing a slice's keys under VERIFY=replace (SolverDisputes):
    # `resume` after checking VERIFY_MODEL (and LLM_MODEL); it counts that slice afresh.
    disputes = "disputes"


class SliceReason(str, Enum):
    """Why a slice's last attempt ended early, as stored in slice.last_error_code beside the
    free text of slice.last_error (the detail). Code decides by the code, never by the text;
    people read `describe(detail)`: the code's label, then the detail."""

    lease_lost = "lease_lost"  # another worker holds it now (never stored: its holder writes)
    handed_back = "handed_back"  # the worker shut down between two calls
    rate_limited = "rate_limited"  # a 429 from a rate limit: held back, not counted
    flex_unavailable = "flex_unavailable"  # flex had no capacity: backed off, not counted
    budget_wait = "budget_wait"  # no room in the budget until calls in flight settle
    budget = "budget"  # nothing more fits in the budget: the exam is paused
    auth = "auth"  # the key was rejected
    stopped = "stopped"  # the provider refused every call (quota, model): the exam is paused
    transient = "transient"  # a retryable provider error: backed off, counted
    permanent = "permanent"  # a request the provider refuses for good: the chapter failed
    invalid_output = "invalid_output"  # no usable question after the re-asks
    duplicates = "duplicates"  # every question of a batch line was one the chapter had
    too_large = "too_large"  # a batch request no batch file can hold (BATCH_MAX_BYTES)
    not_sent = "not_sent"  # its provider batch was abandoned before it was created
    attempt_cap = "attempt_cap"  # MAX_ATTEMPTS attempts without progress: failed
    disputes = "disputes"  # the solver kept disputing its keys (replace): the exam is paused
    unexpected = "unexpected"  # not the provider's: the database down, a bug
    legacy = "legacy"  # written before the code existed (migration 0024): the detail says all

    def describe(self, detail: str | None) -> str:
        """The text people read: "transient: HTTP 503 ...". A code whose detail names it
        itself (a sentence, an error's type) shows the detail alone."""
        label = _SLICE_LABELS.get(self)
        if label is None:
            return detail or self.value
        return f"{label}: {detail}" if detail else label


# The labels shown before a slice reason's detail; the others' details say it themselves.
_SLICE_LABELS = {
    SliceReason.handed_back: "handed back", SliceReason.rate_limited: "rate_limited",
    SliceReason.flex_unavailable: "flex_unavailable", SliceReason.budget_wait: "budget_wait",
    SliceReason.budget: "budget", SliceReason.auth: "auth", SliceReason.transient: "transient",
    SliceReason.permanent: "permanent", SliceReason.attempt_cap: "attempt cap",
}


class Rejection(str, Enum):
    """Why a model reply, or one question in it, was not stored."""

    truncated = "truncated"  # finish_reason "length": the reply was cut at max_tokens
    empty = "empty"
    refusal = "refusal"
    malformed_json = "malformed_json"
    wrong_schema = "wrong_schema"  # not the questions object, or a question missing a field
    duplicate = "duplicate"  # already stored in the chapter, or twice in the reply
    near_duplicate = "near_duplicate"  # a reworded repeat (examforge.neardup)
    too_few = "too_few"  # a valid reply with no question in it
    unreadable = "unreadable"  # a billed 200 whose envelope or content could not be read
    reply_too_large = "reply_too_large"
    # A choice that stands for the others ("all of the above", "همه موارد") or names one by
    # its letter ("both A and B"), in the chapter's language or English: choices are
    # reordered when stored (examforge.balance), which such a choice does not survive.
    positional = "positional"
    # The item types of a chapter's `types` mix (examforge.item_types): each malformed form
    # has its own reason, so that a model that gets one type wrong shows which.
    unknown_type = "unknown_type"  # a `type` that is not one of the five
    bad_multi = "bad_multi"  # not 4-6 distinct choices with 2 or more (not all) correct
    bad_truefalse = "bad_truefalse"  # no true/false `answer`, or choices given
    bad_short = "bad_short"  # not 1-5 distinct non-empty accepted answers
    bad_numeric = "bad_numeric"  # no finite value, or a tolerance that is negative or absent
    surplus_type = "surplus_type"  # more of a type than the slice still lacks


class OutputInvalid(ExamforgeError):
    """Raised when a model reply holds no usable questions."""

    def __init__(self, kind: Rejection, detail: str = "") -> None:
        super().__init__(f"{kind.value}: {detail}" if detail else kind.value)
        self.kind = kind


class LeaseLost(ExamforgeError):
    """Raised when a worker's lease on a chapter expired or was taken; its result is discarded."""
