"""What to do with a chapter after its attempt ended in an error: one pure decision.

`decide(error, ...)` maps every way an attempt can end early to one `Decision`, the way
procrastinate's RetryStrategy does, so the policy reads as one table and is tested as one
(tests/unit/test_retry.py). The pipeline only carries the decision out.

    error                       action     attempt counted  delay
    LeaseLost                   lost       -                -  (someone else holds it now)
    HandBack (shutdown)         release    no               0
    RateLimited                 release    no               Retry-After (or the limiter's wait)
    CapacityUnavailable (flex)  release    no               backoff(refusals in a row),
                                                            >= Retry-After
    BudgetExceeded, others in   release    no               BUDGET_WAIT_S
      flight (live leases)
    BudgetExceeded, none        pause      no               -  (raise the budget to resume)
    QuotaExceeded, ModelNotFound pause     no               -  (`resume` after the fix)
    EndpointUnreachable         pause      no               -  (`resume` once it is back)
    AuthError                   fail+pause yes              -  (pauses after AUTH_FAILURE_LIMIT)
    other RetryableProviderError release   yes              backoff(streak), >= Retry-After
    PermanentProviderError      fail       yes              -
    OutputInvalid               fail       yes              -
    anything else (database)    release    yes              RETRY_BASE_S, then re-raised

Each decision names its code (`examforge.errors.SliceReason`, stored as slice.last_error_code)
and the error's text as its detail (slice.last_error): readers compare the code.

A chapter fails at MAX_ATTEMPTS attempts without progress; an attempt that is not counted
(rate limits, budget waits, shutdowns) never brings it closer to that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from examforge.backoff import backoff_s
from examforge.errors import (
    AuthError,
    BudgetExceeded,
    CapacityUnavailable,
    EndpointUnreachable,
    ExamStopped,
    LeaseLost,
    OutputInvalid,
    PauseCode,
    PermanentProviderError,
    RateLimited,
    RetryableProviderError,
    SliceReason,
    SolverDisputes,
)
from examforge.settings import Settings

# How long a chapter waits when the budget has no room now but calls in flight elsewhere may
# settle below their worst case and free some. Only calls under a live lease count as in
# flight (the store settles dead holders' calls before it says there is no room), and each of
# them ends within its deadline or loses its lease: the wait cannot go on forever, and once
# none is left the exam is paused.
BUDGET_WAIT_S = 2.0


class HandBack(Exception):
    """The process is shutting down: stop between calls and return the chapter to the queue."""


class Action(str, Enum):
    release = "release"  # give the lease back; come back after `delay_s`
    fail = "fail"  # the chapter is failed with `reason`
    pause = "pause"  # the exam is paused with `reason`; the chapter waits, uncounted
    lost = "lost"  # the lease is gone: nothing to give back
    reraise = "reraise"  # release, then let the error propagate (Celery's own retry)


@dataclass(frozen=True)
class Decision:
    action: Action
    code: SliceReason  # slice.last_error_code; `detail` is the free text beside it
    detail: str
    delay_s: float = 0.0
    count_attempt: bool = True
    pause_exam_after: int | None = None  # with fail: count an auth failure against the exam
    pause_code: PauseCode | None = None  # with pause: why (exam.pause_code)

    @property
    def reason(self) -> str:
        """The text people read (logs, a pause's reason, a run's result)."""
        return self.code.describe(self.detail)


def decide(error: BaseException, *, streak: int, settings: Settings,
           rand: float) -> Decision:
    """`streak`: attempts without progress, counting this one (1 after a committed batch)."""
    if isinstance(error, LeaseLost):
        return Decision(Action.lost, SliceReason.lease_lost, str(error))
    if isinstance(error, HandBack):
        return Decision(Action.release, SliceReason.handed_back, "worker shutting down", 0.0,
                        count_attempt=False)
    if isinstance(error, CapacityUnavailable):
        # Flex had no capacity: retried with backoff, never counted (a long shortage would
        # otherwise fail the chapter at MAX_ATTEMPTS), never a pause. The backoff grows with
        # the process's refusals in a row, not with the chapter's streak, which an uncounted
        # attempt does not advance.
        delay = backoff_s(max(streak, error.in_row), retry_after_s=error.retry_after_s,
                          rand=rand, base_s=settings.retry_base_s, max_s=settings.retry_max_s,
                          retry_after_max_s=settings.retry_after_max_s)
        return Decision(Action.release, SliceReason.flex_unavailable, str(error), delay,
                        count_attempt=False)
    if isinstance(error, RateLimited):
        wait = error.retry_after_s or settings.retry_base_s
        return Decision(Action.release, SliceReason.rate_limited, str(error),
                        min(wait, settings.retry_after_max_s), count_attempt=False)
    if isinstance(error, BudgetExceeded):
        if error.others_in_flight:
            return Decision(Action.release, SliceReason.budget_wait, str(error), BUDGET_WAIT_S,
                            count_attempt=False)
        return Decision(Action.pause, SliceReason.budget, str(error), count_attempt=False,
                        pause_code=PauseCode.budget)
    if isinstance(error, SolverDisputes):
        # Nothing a retry can fix: a person checks the solver and the generator.
        return Decision(Action.pause, SliceReason.disputes, str(error), count_attempt=False,
                        pause_code=PauseCode.disputes)
    if isinstance(error, AuthError):
        return Decision(Action.fail, SliceReason.auth, str(error),
                        pause_exam_after=settings.auth_failure_limit)
    if isinstance(error, EndpointUnreachable):
        return Decision(Action.pause, SliceReason.stopped, str(error), count_attempt=False,
                        pause_code=PauseCode.unreachable)
    if isinstance(error, ExamStopped):
        return Decision(Action.pause, SliceReason.stopped, f"{error.kind.value}: {error}",
                        count_attempt=False,
                        pause_code=PauseCode.provider)
    if isinstance(error, RetryableProviderError):
        delay = backoff_s(streak, retry_after_s=error.retry_after_s, rand=rand,
                          base_s=settings.retry_base_s, max_s=settings.retry_max_s,
                          retry_after_max_s=settings.retry_after_max_s)
        return Decision(Action.release, SliceReason.transient, str(error), delay)
    if isinstance(error, PermanentProviderError):
        return Decision(Action.fail, SliceReason.permanent, str(error))
    if isinstance(error, OutputInvalid):
        return Decision(Action.fail, SliceReason.invalid_output,
                        f"invalid output after {settings.max_reasks} re-asks: {error}")
    # The database down, a bug: hand the chapter back for someone else to take, and let the
    # error reach Celery, which retries the task with its own backoff.
    return Decision(Action.reraise, SliceReason.unexpected, f"{type(error).__name__}: {error}",
                    settings.retry_base_s)
