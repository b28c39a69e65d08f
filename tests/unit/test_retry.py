"""The retry decision as one table: every way an attempt ends early, and what follows."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from examforge.errors import (
    AuthError,
    BudgetExceeded,
    DeadlineExceeded,
    LeaseLost,
    ModelNotFound,
    OutputInvalid,
    PermanentProviderError,
    QuotaExceeded,
    RateLimited,
    Rejection,
    RetryableProviderError,
)
from examforge.retry import BUDGET_WAIT_S, Action, HandBack, decide

ROWS = [
    # error, action, counted, delay (None: not checked), reason prefix
    (LeaseLost("gone"), Action.lost, True, None, "gone"),
    (HandBack(), Action.release, False, 0.0, "handed back"),
    (RateLimited("HTTP 429", retry_after_s=7.0), Action.release, False, 7.0, "rate_limited"),
    (RateLimited("HTTP 429"), Action.release, False, 0.05, "rate_limited"),
    (RateLimited("HTTP 429", retry_after_s=10_000), Action.release, False, 300.0,
     "rate_limited"),
    (BudgetExceeded("no room", others_in_flight=True), Action.release, False, BUDGET_WAIT_S,
     "budget_wait"),
    (BudgetExceeded("no room", others_in_flight=False), Action.pause, False, None, "budget:"),
    (QuotaExceeded("HTTP 429: quota"), Action.pause, False, None, "quota:"),
    (ModelNotFound("HTTP 404"), Action.pause, False, None, "model_not_found:"),
    (AuthError("HTTP 401"), Action.fail, True, None, "auth:"),
    (RetryableProviderError("HTTP 503"), Action.release, True, None, "transient:"),
    (DeadlineExceeded("deadline"), Action.release, True, None, "transient: deadline"),
    (PermanentProviderError("HTTP 400"), Action.fail, True, None, "permanent:"),
    (OutputInvalid(Rejection.truncated), Action.fail, True, None, "invalid output after 3 re-asks"),
    (OperationalError("x", {}, Exception("db down")), Action.reraise, True, 0.05,
     "OperationalError"),
]


@pytest.mark.parametrize(("error", "action", "counted", "delay", "reason"), ROWS,
                         ids=[f"{type(r[0]).__name__}-{i}" for i, r in enumerate(ROWS)])
def test_the_decision_table(make_settings, error, action, counted, delay, reason):
    settings = make_settings(retry_base_s=0.05, retry_max_s=1.0, max_reasks=3)
    decision = decide(error, streak=1, settings=settings, rand=1.0)
    assert decision.action is action
    assert decision.count_attempt is counted
    if delay is not None:
        assert decision.delay_s == pytest.approx(delay)
    assert decision.reason.startswith(reason)


def test_transient_backoff_grows_with_the_streak_and_honours_retry_after(make_settings):
    settings = make_settings(retry_base_s=1.0, retry_max_s=60.0)
    err = RetryableProviderError("HTTP 500")
    delays = [decide(err, streak=n, settings=settings, rand=1.0).delay_s for n in (1, 2, 3, 4)]
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert decide(RetryableProviderError("HTTP 503", retry_after_s=30), streak=1,
                  settings=settings, rand=0.0).delay_s == 30.0


def test_an_auth_failure_carries_the_pause_threshold(make_settings):
    decision = decide(AuthError("HTTP 401"), streak=1,
                      settings=make_settings(auth_failure_limit=3), rand=0.5)
    assert decision.pause_exam_after == 3
