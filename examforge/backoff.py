"""Backoff as a pure function, so it can be tested with a table of cases."""

from __future__ import annotations

import email.utils
import math
from datetime import datetime, timezone


def backoff_s(
    attempt: int,
    *,
    retry_after_s: float | None = None,
    rand: float = 1.0,
    base_s: float = 2.0,
    max_s: float = 120.0,
    retry_after_max_s: float = 300.0,
) -> float:
    """Seconds to wait before attempt `attempt + 1` (attempt counts from 1).

    Exponential with "full jitter" scaled into [50 %, 100 %] of the step so workers that failed
    together do not come back together, capped at `max_s`. A provider's Retry-After is a floor
    (clamped to `retry_after_max_s` so a hostile header cannot park work for days).
    """
    attempt = max(1, attempt)
    # Cap the exponent: past ~2**1023 the int no longer converts to float (OverflowError), and
    # the step is long past max_s anyway. `attempt` counts every attempt of a chapter, so it can
    # grow without bound on a big chapter with a flaky provider.
    step = min(max_s, base_s * (2 ** min(attempt - 1, 64)))
    delay = step * (0.5 + 0.5 * min(max(rand, 0.0), 1.0))
    if retry_after_s is not None and retry_after_s > 0:
        delay = max(delay, min(retry_after_s, retry_after_max_s))
    return delay


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Parse a Retry-After header: delta-seconds or an HTTP date. None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        now = now or datetime.now(timezone.utc)
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):  # "nan", "inf", "1e400": not a delay
        return None
    if seconds <= 0:  # in the past (or a negative delta): no wait asked
        return 0.0
    return seconds
