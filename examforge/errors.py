"""The one error vocabulary of examforge.

    ExamforgeError
    ├── UserError                    bad input from a person: one line, exit 2, no traceback
    │   ├── SyllabusError            a syllabus file or field is invalid
    │   ├── UnknownExam              no such exam
    │   └── ConfigError              a setting is invalid
    ├── InfrastructureError          a service we depend on is down: one line, exit 3
    │   ├── BrokerUnavailable
    │   └── DatabaseUnavailable
    ├── ProviderError                the model provider failed a call
    │   ├── RetryableProviderError   timeout, connection reset, 429, 5xx: retrying can fix it
    │   │   └── DeadlineExceeded     no complete reply within LLM_TIMEOUT_S (may be billed)
    │   ├── ReplyTooLarge            a reply over LLM_MAX_REPLY_BYTES, cut off (may be billed)
    │   └── PermanentProviderError   400, 404, 422: retrying cannot fix it
    │       └── AuthError            401, 403: stop the whole exam
    ├── OutputInvalid                the model answered, but not with usable questions
    └── LeaseLost                    another worker owns the chapter now; our result is void
"""

from __future__ import annotations


class ExamforgeError(Exception):
    """An examforge error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UserError(ExamforgeError):
    """Invalid input."""

    exit_code = 2


class SyllabusError(UserError):
    """Raised when a syllabus file is missing, unreadable or fails validation."""


class UnknownExam(UserError):
    """Raised when an exam slug names no syllabus and no stored exam."""


class ConfigError(UserError):
    """Raised when the settings (environment or .env) are invalid."""


class InfrastructureError(ExamforgeError):
    """A service examforge depends on is unavailable."""

    exit_code = 3


class BrokerUnavailable(InfrastructureError):
    """Raised when the Celery broker cannot be reached within the connect timeout."""


class DatabaseUnavailable(InfrastructureError):
    """Raised when the database cannot be reached."""


class ProviderError(ExamforgeError):
    """Raised when a model call fails."""

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
        self.endpoint: str | None = None  # "primary" or "fallback", set by the client
        # Set when the provider may bill the call although no usage came back (the request
        # was sent and the reply abandoned): our own count of the prompt.
        self.prompt_tokens_estimate: int | None = None


class RetryableProviderError(ProviderError):
    """Raised for timeouts, connection errors, 429 and 5xx: a later attempt may succeed."""


class DeadlineExceeded(RetryableProviderError):
    """Raised when a reply did not arrive in full within LLM_TIMEOUT_S of sending the request
    (a silent server, or one that trickles its reply); the connection is closed."""


class ReplyTooLarge(ProviderError):
    """Raised when a reply is larger than LLM_MAX_REPLY_BYTES: it is cut off and refused, so a
    broken or hostile endpoint cannot exhaust a worker's memory."""


class PermanentProviderError(ProviderError):
    """Raised for 4xx replies other than 408/409/429: the request itself is wrong."""


class AuthError(PermanentProviderError):
    """Raised when the provider rejects the API key (401/403)."""


class OutputInvalid(ExamforgeError):
    """Raised when a model reply holds no usable questions."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class LeaseLost(ExamforgeError):
    """Raised when a worker's lease on a chapter expired or was taken; its result is discarded."""
