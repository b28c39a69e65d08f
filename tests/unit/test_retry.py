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
    SliceReason,
)
from examforge.retry import BUDGET_WAIT_S, Action, HandBack, decide

ROWS = [
    # error, action, counted, delay (None: not checked), code, the text people read
    (LeaseLost("gone"), Action.lost, True, None, SliceReason.lease_lost, "gone"),
    (HandBack(), Action.release, False, 0.0, SliceReason.handed_back,
     "handed back: worker shutting down"),
    (RateLimited("HTTP 429", retry_after_s=7.0), Action.release, False, 7.0,
     SliceReason.rate_limited, "rate_limited: HTTP 429"),
    (RateLimited("HTTP 429"), Action.release, False, 0.05, SliceReason.rate_limited,
     "rate_limited: HTTP 429"),
    (RateLimited("HTTP 429", retry_after_s=10_000), Action.release, False, 300.0,
     SliceReason.rate_limited, "rate_limited: HTTP 429"),
    (BudgetExceeded("no room", others_in_flight=True), Action.release, False, BUDGET_WAIT_S,
     SliceReason.budget_wait, "budget_wait: no room"),
    (BudgetExceeded("no room", others_in_flight=False), Action.pause, False, None,
     SliceReason.budget, "budget: no room"),
    (QuotaExceeded("HTTP 429: quota"), Action.pause, False, None, SliceReason.stopped,
     "quota: HTTP 429: quota"),
    (ModelNotFound("HTTP 404"), Action.pause, False, None, SliceReason.stopped,
     "model_not_found: HTTP 404"),
    (AuthError("HTTP 401"), Action.fail, True, None, SliceReason.auth, "auth: HTTP 401"),
    (RetryableProviderError("HTTP 503"), Action.release, True, None, SliceReason.transient,
     "transient: HTTP 503"),
    (DeadlineExceeded("deadline"), Action.release, True, None, SliceReason.transient,
     "transient: deadline"),
    (PermanentProviderError("HTTP 400"), Action.fail, True, None, SliceReason.permanent,
     "permanent: HTTP 400"),
    (OutputInvalid(Rejection.truncated), Action.fail, True, None, SliceReason.invalid_output,
     "invalid output after 3 re-asks: truncated"),
    (OperationalError("x", {}, Exception("db down")), Action.reraise, True, 0.05,
     SliceReason.unexpected, "OperationalError: "),
]


@pytest.mark.parametrize(("error", "action", "counted", "delay", "code", "text"), ROWS,
                         ids=[f"{type(r[0]).__name__}-{i}" for i, r in enumerate(ROWS)])
def test_the_decision_table(make_settings, error, action, counted, delay, code, text):
    settings = make_settings(retry_base_s=0.05, retry_max_s=1.0, max_reasks=3)
    decision = decide(error, streak=1, settings=settings, rand=1.0)
    assert decision.action is action
    assert decision.count_attempt is counted
    if delay is not None:
        assert decision.delay_s == pytest.approx(delay)
    assert decision.code is code
    # The text people read (logs, status) is the code's label and the detail, as before codes.
    assert decision.reason.startswith(text)
    assert decision.reason == code.describe(decision.detail)


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
