"""examforge.backoff: the pure backoff schedule and the Retry-After parser, as tables."""

from __future__ import annotations

import email.utils
import math
from datetime import datetime, timedelta, timezone

import pytest

from examforge.backoff import backoff_s, parse_retry_after

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def _http_date(when: datetime) -> str:
    return email.utils.format_datetime(when, usegmt=True)


# --- backoff_s ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 32.0), (6, 64.0), (7, 120.0), (8, 120.0),
     (20, 120.0)],
)
def test_growth_doubles_per_attempt_up_to_the_cap(attempt: int, expected: float) -> None:
    # rand=1.0: the top of the jitter band, i.e. the full step.
    assert backoff_s(attempt, rand=1.0, base_s=2.0, max_s=120.0) == expected


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.0, 1.0),     # bottom of the band: half the step
        (1, 1.0, 2.0),     # top of the band: the full step
        (1, 0.5, 1.5),
        (3, 0.0, 4.0),
        (3, 1.0, 8.0),
        (3, 0.25, 5.0),
        (10, 0.0, 60.0),   # capped step (120) still jittered: half of it
        (10, 1.0, 120.0),
        (2, -3.0, 2.0),    # rand below 0 is clamped to 0
        (2, 7.0, 4.0),     # rand above 1 is clamped to 1
    ],
)
def test_jitter_stays_between_half_and_full_step(attempt: int, rand: float,
                                                 expected: float) -> None:
    assert backoff_s(attempt, rand=rand, base_s=2.0, max_s=120.0) == pytest.approx(expected)


@pytest.mark.parametrize("attempt", range(1, 15))
@pytest.mark.parametrize("rand", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_jitter_band_holds_for_every_attempt(attempt: int, rand: float) -> None:
    step = min(120.0, 2.0 * 2 ** (attempt - 1))
    delay = backoff_s(attempt, rand=rand, base_s=2.0, max_s=120.0)
    assert step / 2 <= delay <= step
    assert delay <= 120.0


@pytest.mark.parametrize(
    ("base_s", "max_s", "attempt", "expected"),
    [(0.05, 0.5, 1, 0.05), (0.05, 0.5, 4, 0.4), (0.05, 0.5, 5, 0.5), (0.05, 0.5, 50, 0.5),
     (1.0, 3.0, 2, 2.0), (1.0, 3.0, 3, 3.0), (10.0, 5.0, 1, 5.0)],
)
def test_cap_at_max_s(base_s: float, max_s: float, attempt: int, expected: float) -> None:
    assert backoff_s(attempt, rand=1.0, base_s=base_s, max_s=max_s) == pytest.approx(expected)


@pytest.mark.parametrize("attempt", [1025, 5000, 10**6])
def test_huge_attempt_numbers_stay_at_the_cap(attempt: int) -> None:
    # The attempt counter of a chapter is never reset, so it can pass 1024; 2**1024 does not
    # convert to float and used to raise OverflowError from inside the retry handler.
    assert backoff_s(attempt, rand=1.0, base_s=2.0, max_s=120.0) == 120.0
    assert backoff_s(attempt, rand=0.0, base_s=2.0, max_s=120.0) == 60.0


@pytest.mark.parametrize(
    ("attempt", "retry_after_s", "rand", "expected"),
    [
        (1, 30.0, 1.0, 30.0),    # Retry-After longer than the step: it wins
        (1, 30.0, 0.0, 30.0),
        (5, 10.0, 1.0, 32.0),    # shorter than the step: the step wins (it is a floor)
        (5, 10.0, 0.0, 16.0),
        (3, 6.0, 0.0, 6.0),      # between half step (4) and step (8), rand=0 -> the floor
        (1, 0.0, 1.0, 2.0),      # zero: no floor
        (1, -5.0, 1.0, 2.0),     # negative: ignored
        (1, None, 1.0, 2.0),
        (2, 2.5, 0.0, 2.5),
    ],
)
def test_retry_after_is_a_floor(attempt: int, retry_after_s: float | None, rand: float,
                                expected: float) -> None:
    got = backoff_s(attempt, retry_after_s=retry_after_s, rand=rand, base_s=2.0, max_s=120.0)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("retry_after_s", "retry_after_max_s", "expected"),
    [
        (86_400.0, 300.0, 300.0),      # a day: clamped
        (301.0, 300.0, 300.0),
        (300.0, 300.0, 300.0),
        (299.0, 300.0, 299.0),
        (1e12, 300.0, 300.0),
        (math.inf, 300.0, 300.0),
        (1000.0, 50.0, 50.0),
        (200.0, 150.0, 150.0),         # Retry-After above max_s (120) but clamp above too
    ],
)
def test_retry_after_clamped_to_retry_after_max_s(retry_after_s: float, retry_after_max_s: float,
                                                  expected: float) -> None:
    got = backoff_s(1, retry_after_s=retry_after_s, rand=1.0, base_s=2.0, max_s=120.0,
                    retry_after_max_s=retry_after_max_s)
    assert got == pytest.approx(expected)


def test_clamped_retry_after_never_lowers_the_step() -> None:
    # A clamp below the exponential step cannot shorten the wait.
    assert backoff_s(7, retry_after_s=1000.0, rand=1.0, base_s=2.0, max_s=120.0,
                     retry_after_max_s=10.0) == 120.0


@pytest.mark.parametrize("attempt", [0, -1, -100])
@pytest.mark.parametrize("rand", [0.0, 1.0])
def test_attempt_zero_or_negative_is_treated_as_one(attempt: int, rand: float) -> None:
    assert backoff_s(attempt, rand=rand) == backoff_s(1, rand=rand)
    assert backoff_s(attempt, rand=1.0) == 2.0


def test_defaults() -> None:
    # base 2 s, cap 120 s, rand defaults to 1.0 (the full step), Retry-After clamp 300 s.
    assert backoff_s(1) == 2.0
    assert backoff_s(100) == 120.0
    assert backoff_s(1, retry_after_s=10_000.0) == 300.0


# --- parse_retry_after ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", 7.0),
        ("0", 0.0),
        ("120", 120.0),
        ("  7  ", 7.0),
        ("7\r\n", 7.0),
        ("1.5", 1.5),
        ("0.25", 0.25),
        ("86400", 86400.0),   # parsing does not clamp: backoff_s does
    ],
)
def test_parse_seconds(value: str, expected: float) -> None:
    got = parse_retry_after(value, now=NOW)
    assert got == expected
    assert isinstance(got, float)


@pytest.mark.parametrize(("delta_s", "expected"), [(60, 60.0), (1, 1.0), (3600, 3600.0)])
def test_parse_http_date_in_the_future(delta_s: int, expected: float) -> None:
    assert parse_retry_after(_http_date(NOW + timedelta(seconds=delta_s)), now=NOW) == expected


def test_parse_http_date_in_other_formats() -> None:
    # RFC 850 and asctime forms are obsolete but still valid HTTP dates.
    assert parse_retry_after("Wednesday, 01-May-24 12:01:00 GMT", now=NOW) == 60.0
    assert parse_retry_after("Wed May  1 12:02:00 2024", now=NOW) == 120.0


def test_parse_http_date_with_offset() -> None:
    assert parse_retry_after("Wed, 01 May 2024 14:00:30 +0200", now=NOW) == 30.0


@pytest.mark.parametrize("delta_s", [0, -1, -3600, -10 * 365 * 86400])
def test_parse_http_date_now_or_in_the_past_is_zero(delta_s: int) -> None:
    assert parse_retry_after(_http_date(NOW + timedelta(seconds=delta_s)), now=NOW) == 0.0


def test_parse_http_date_uses_the_clock_when_now_is_not_given() -> None:
    when = datetime.now(timezone.utc) + timedelta(seconds=90)
    got = parse_retry_after(_http_date(when))
    assert got is not None and 85.0 <= got <= 90.0


@pytest.mark.parametrize(
    "value",
    ["soon", "abc123", "7 seconds", "0x10", "1,5", "Thu, 32 Foo 2024 99:99:99 GMT",
     "Mon, 01 Jan 99999 00:00:00 GMT", "--5", "nan", "NaN", "inf", "-inf", "Infinity", "1e400"],
)
def test_parse_garbage_is_none(value: str) -> None:
    # Non-finite numbers are garbage, not an infinite (or undefined) wait.
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", [None, "", "   "])
def test_parse_absent_is_none(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", ["-5", "-0.5", "-0", "-86400"])
def test_parse_negative_seconds_is_zero(value: str) -> None:
    # Not a valid delta-seconds, but the only sane reading is "no wait asked": backoff_s then
    # uses its own schedule. Always +0.0, never -0.0.
    got = parse_retry_after(value, now=NOW)
    assert got == 0.0
    assert math.copysign(1.0, got) == 1.0  # type: ignore[arg-type]


def test_parse_then_backoff_end_to_end() -> None:
    hostile = parse_retry_after(_http_date(NOW + timedelta(days=30)), now=NOW)
    assert hostile == 30 * 86400.0
    assert backoff_s(1, retry_after_s=hostile, rand=0.0, retry_after_max_s=300.0) == 300.0
    assert backoff_s(1, retry_after_s=parse_retry_after("inf"), rand=0.0) == 1.0
