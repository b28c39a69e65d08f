"""The mock's rate limiter and quota as pure objects, on a fake clock."""

from __future__ import annotations

import pytest

from mockllm.limits import (
    REQUESTS,
    TOKENS,
    RateLimiter,
    TokenBucket,
    format_duration,
    quota_exceeded,
    retry_headers,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (0.0001, "1ms"),
        (0.012, "12ms"),
        (0.1, "100ms"),
        (0.9999, "1s"),
        (1, "1s"),
        (1.5, "1.5s"),
        (20.032, "20.032s"),
        (59.9991, "1m0s"),
        (60, "1m0s"),
        (90.5, "1m30.5s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
    ],
)
def test_durations_are_written_like_openai(seconds: float, expected: str) -> None:
    assert format_duration(seconds) == expected


@pytest.mark.parametrize(
    ("limit", "fraction", "capacity"),
    [(600, 0.1, 60), (5, 0.1, 1), (1, 0.1, 1), (600, 1.0, 600), (600, 0.0, 1), (100_000, 0.1, 10_000)],
)
def test_bucket_holds_a_fraction_of_a_minute_never_less_than_one(limit: int, fraction: float,
                                                                  capacity: float) -> None:
    assert TokenBucket(limit, fraction, now=0).capacity == capacity


def test_600_rpm_is_ten_a_second_after_a_burst_of_60() -> None:
    clock = Clock()
    limiter = RateLimiter(600, None, 0.1, clock)
    assert all(limiter.admit(0) is None for _ in range(60))  # the burst
    refusal = limiter.admit(0)
    assert refusal is not None and refusal.limit_type == REQUESTS
    assert refusal.wait_s == pytest.approx(0.1)
    assert refusal.used == 600 and refusal.limit == 600 and refusal.requested == 1
    clock.now += 0.1
    assert limiter.admit(0) is None
    assert limiter.admit(0) is not None
    admitted = 0
    for _ in range(100):  # 10 s at 10 attempts a second
        clock.now += 0.1
        admitted += limiter.admit(0) is None
    assert admitted == 100


def test_a_refusal_charges_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(600, 1000, 0.1, clock)  # 60 requests, 100 tokens
    assert limiter.admit(90) is None
    refusal = limiter.admit(20)
    assert refusal is not None and refusal.limit_type == TOKENS
    assert limiter.requests is not None and limiter.requests.level == pytest.approx(59)
    assert limiter.tokens is not None and limiter.tokens.level == pytest.approx(10)


def test_the_longest_wait_names_the_limit() -> None:
    clock = Clock()
    limiter = RateLimiter(60, 600, 0.1, clock)  # 1 request of capacity (1/s); 60 tokens (10/s)
    assert limiter.admit(60) is None
    refusal = limiter.admit(60)
    assert refusal is not None
    assert refusal.limit_type == TOKENS and refusal.wait_s == pytest.approx(6.0)  # not the 1 s of RPM


def test_a_request_dearer_than_the_bucket_waits_for_a_full_bucket_then_leaves_debt() -> None:
    clock = Clock()
    limiter = RateLimiter(None, 6000, 0.1, clock)  # 600 tokens deep, 100 a second
    assert limiter.admit(900) is None  # full bucket: admitted, 300 in debt
    assert limiter.tokens is not None and limiter.tokens.level == pytest.approx(-300)
    refusal = limiter.admit(900)
    assert refusal is not None and refusal.wait_s == pytest.approx(9.0)  # back to full: 900 / 100
    clock.now += 9.0
    assert limiter.admit(900) is None


def test_a_request_dearer_than_the_minute_is_too_large() -> None:
    limiter = RateLimiter(None, 1000, 0.1, Clock())
    refusal = limiter.admit(1001)
    assert refusal is not None and refusal.too_large
    assert refusal.message("gpt-test").startswith("Request too large for gpt-test in organization org-mock on "
                                                  "tokens per min (TPM): Limit 1000, Requested 1001.")


def test_completion_tokens_charged_after_admission_hold_back_the_next_request() -> None:
    clock = Clock()
    limiter = RateLimiter(None, 6000, 0.1, clock)
    assert limiter.admit(100) is None
    limiter.debit_tokens(700)  # the completion of a request sent without max_tokens
    refusal = limiter.admit(100)
    assert refusal is not None and refusal.wait_s == pytest.approx(3.0)


def test_rate_limit_message_reads_like_openai() -> None:
    limiter = RateLimiter(600, None, 0.1, Clock())
    for _ in range(60):
        limiter.admit(0)
    refusal = limiter.admit(0)
    assert refusal is not None
    assert refusal.message("gpt-4o") == (
        "Rate limit reached for gpt-4o in organization org-mock on requests per min (RPM): Limit 600, Used 600, "
        "Requested 1. Please try again in 100ms. Visit https://platform.openai.com/account/rate-limits to learn "
        "more.")


def test_headers_report_limit_remaining_and_time_to_full() -> None:
    clock = Clock()
    limiter = RateLimiter(600, 60_000, 0.1, clock)
    limiter.admit(300)
    assert limiter.headers("openai") == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "590",  # 59 of 60 in the bucket, scaled to the minute
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": "57000",
        "x-ratelimit-reset-tokens": "300ms",
    }
    for _ in range(59):
        limiter.admit(1)
    assert limiter.headers("openai")["x-ratelimit-remaining-requests"] == "0"
    assert limiter.headers("absent") == {}
    azure = limiter.headers("azure")
    assert azure["x-ratelimit-limit-tokens"] == "-1" and azure["x-ratelimit-remaining-tokens"] == "-1"
    assert azure["x-ratelimit-reset-tokens"] == "0"


def test_only_configured_limits_send_headers() -> None:
    assert RateLimiter(None, None, 0.1, Clock()).headers("openai") == {}
    assert set(RateLimiter(None, 1000, 0.1, Clock()).headers("openai")) == {
        "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}


@pytest.mark.parametrize(
    ("wait_s", "mode", "expected"),
    [
        (0.1, "openai", {"Retry-After": "1", "retry-after-ms": "100"}),
        (1.0, "openai", {"Retry-After": "1", "retry-after-ms": "1000"}),
        (1.2, "openai", {"Retry-After": "2", "retry-after-ms": "1200"}),
        (0.1, "absent", {"Retry-After": "1"}),
        (0.1, "azure", {}),
    ],
)
def test_retry_headers(wait_s: float, mode: str, expected: dict[str, str]) -> None:
    assert retry_headers(wait_s, mode) == expected


@pytest.mark.parametrize(
    ("exhausted", "quota", "billed", "expected"),
    [(False, None, 10**9, False), (True, None, 0, True), (False, 100, 99, False), (False, 100, 100, True),
     (False, 0, 0, True)],
)
def test_quota(exhausted: bool, quota: int | None, billed: int, expected: bool) -> None:
    assert quota_exceeded(exhausted, quota, billed) is expected
