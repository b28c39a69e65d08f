"""Rate limits and quota, enforced the way OpenAI enforces them.

Requests per minute and tokens per minute are token buckets that refill continuously at
``limit / 60`` per second and hold at most ``burst_fraction`` of a minute's allowance (never
less than one request's worth): a 600 RPM limit behaves like 10 requests a second with a
burst of 60, which is how a per-minute limit behaves at real providers. A request is charged
one request and ``prompt tokens + max_tokens`` tokens at admission (OpenAI counts
``max_tokens`` toward TPM); without ``max_tokens`` the real completion is charged as it is
generated, right after admission, which may take the bucket below zero and hold back the next
requests.
A request dearer than the whole bucket is admitted when the bucket is full (and leaves it in
debt); one dearer than the whole minute can never run and gets OpenAI's "Request too large".

The ``x-ratelimit-*`` headers follow OpenAI's: the per-minute limit, the remaining
allowance (the bucket's fill scaled to the minute limit, so 0 means the next request is
refused) and the time until the bucket is full again, as a Go-style duration (``120ms``,
``1s``, ``6m0s``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

ORGANIZATION = "org-mock"
RATE_LIMITS_URL = "https://platform.openai.com/account/rate-limits"
INSUFFICIENT_QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
)
REQUESTS = "requests"
TOKENS = "tokens"
_UNIT = {REQUESTS: "requests per min (RPM)", TOKENS: "tokens per min (TPM)"}


def format_duration(seconds: float) -> str:
    """A duration the way OpenAI's headers and messages write it: ``12ms``, ``1.5s``, ``6m0s``.

    Rounded up to the millisecond, so waiting that long is always enough.
    """
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    minutes, ms_left = divmod(ms, 60_000)
    secs = f"{ms_left / 1000:.3f}".rstrip("0").rstrip(".")
    if not minutes:
        return f"{secs}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


class TokenBucket:
    """A continuously refilling bucket of ``limit_per_min`` per minute, ``capacity`` deep."""

    def __init__(self, limit_per_min: int, burst_fraction: float, now: float) -> None:
        self.limit = limit_per_min
        self.rate_per_s = limit_per_min / 60.0
        self.capacity = max(limit_per_min * burst_fraction, 1.0)
        self.level = self.capacity
        self._stamp = now

    def refill(self, now: float) -> None:
        if now > self._stamp:
            self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate_per_s)
            self._stamp = now

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` can be admitted (0: now). Call ``refill`` first."""
        need = min(cost, self.capacity) - self.level
        return 0.0 if need <= 1e-9 else need / self.rate_per_s

    def take(self, cost: float) -> None:
        self.level -= cost

    def remaining(self) -> int:
        """The allowance left, scaled to the minute limit (0 when the next request must wait)."""
        if self.level < 1 - 1e-9 and self.capacity >= 1:
            return 0
        return max(0, math.floor(self.level / self.capacity * self.limit + 1e-9))

    def used(self) -> int:
        return self.limit - self.remaining()

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level) / self.rate_per_s)


@dataclass(frozen=True)
class Refusal:
    """Why a request was not admitted, and what OpenAI would say."""

    limit_type: str  # REQUESTS or TOKENS
    limit: int
    used: int
    requested: int
    wait_s: float  # 0 when waiting cannot help (the request is larger than the limit)

    @property
    def too_large(self) -> bool:
        return self.wait_s == 0

    def message(self, model: str) -> str:
        unit = _UNIT[self.limit_type]
        if self.too_large:
            return (
                f"Request too large for {model} in organization {ORGANIZATION} on {unit}: Limit {self.limit}, "
                f"Requested {self.requested}. The input or output tokens must be reduced in order to run "
                f"successfully. Visit {RATE_LIMITS_URL} to learn more."
            )
        return (
            f"Rate limit reached for {model} in organization {ORGANIZATION} on {unit}: Limit {self.limit}, "
            f"Used {self.used}, Requested {self.requested}. Please try again in {format_duration(self.wait_s)}. "
            f"Visit {RATE_LIMITS_URL} to learn more."
        )


class RateLimiter:
    """RPM and TPM buckets checked and charged together, in one step (admit or refuse both)."""

    def __init__(
        self,
        rpm: int | None,
        tpm: int | None,
        burst_fraction: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        now = clock()
        self.requests = TokenBucket(rpm, burst_fraction, now) if rpm else None
        self.tokens = TokenBucket(tpm, burst_fraction, now) if tpm else None

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def _refill(self) -> None:
        now = self._clock()
        for bucket in (self.requests, self.tokens):
            if bucket is not None:
                bucket.refill(now)

    def admit(self, tokens: int) -> Refusal | None:
        """Charge one request and ``tokens`` tokens, or return why not (charging nothing)."""
        self._refill()
        if self.tokens is not None and tokens > self.tokens.limit:
            return Refusal(TOKENS, self.tokens.limit, self.tokens.used(), tokens, 0.0)
        waits = []
        if self.requests is not None:
            waits.append((self.requests.wait_s(1), REQUESTS, self.requests, 1))
        if self.tokens is not None:
            waits.append((self.tokens.wait_s(tokens), TOKENS, self.tokens, tokens))
        blocking = [w for w in waits if w[0] > 0]
        if blocking:
            # The longest wait is the honest Retry-After: retrying sooner meets the other limit.
            wait, kind, bucket, requested = max(blocking, key=lambda w: w[0])
            return Refusal(kind, bucket.limit, bucket.used(), requested, wait)
        if self.requests is not None:
            self.requests.take(1)
        if self.tokens is not None:
            self.tokens.take(tokens)
        return None

    def debit_tokens(self, tokens: int) -> None:
        """Charge tokens known only after admission (a completion when max_tokens was absent)."""
        if self.tokens is not None and tokens > 0:
            self._refill()
            self.tokens.take(tokens)

    def headers(self, mode: str) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers of a reply, per ``mode`` (openai, absent, azure)."""
        if mode == "absent":
            return {}
        self._refill()
        headers: dict[str, str] = {}
        for kind, bucket in ((REQUESTS, self.requests), (TOKENS, self.tokens)):
            if bucket is None:
                continue
            if mode == "azure":  # what Azure OpenAI has been seen to send
                headers.update({f"x-ratelimit-limit-{kind}": "-1", f"x-ratelimit-remaining-{kind}": "-1",
                                f"x-ratelimit-reset-{kind}": "0"})
            else:
                headers.update({
                    f"x-ratelimit-limit-{kind}": str(bucket.limit),
                    f"x-ratelimit-remaining-{kind}": str(bucket.remaining()),
                    f"x-ratelimit-reset-{kind}": format_duration(bucket.reset_s()),
                })
        return headers


def retry_headers(wait_s: float, mode: str) -> dict[str, str]:
    """``Retry-After`` (whole seconds, rounded up) and ``retry-after-ms``, as OpenAI sends them."""
    if mode == "azure":
        return {}
    headers = {"Retry-After": str(max(1, math.ceil(wait_s - 1e-9)))}
    if mode == "openai":
        headers["retry-after-ms"] = str(max(1, math.ceil(wait_s * 1000 - 1e-6)))
    return headers


def quota_exceeded(quota_exhausted: bool, quota_tokens: int | None, billed_tokens: int) -> bool:
    """Whether a chat call must get 429 ``insufficient_quota``: waiting cannot fix that."""
    return quota_exhausted or (quota_tokens is not None and billed_tokens >= quota_tokens)
