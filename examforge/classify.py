"""Which provider errors retrying can fix: one table, read top to bottom, first match wins.

Each rule matches an HTTP status (or a range), optionally the error body's `code` or `type`
(OpenAI's `{"error": {"message", "type", "code"}}`, which most OpenAI-compatible servers and
gateways copy) or a phrase of its message, and says what the error is and what to do:

- `retry`: a later attempt may succeed (rate limits, overload, server errors);
- `pause_exam`: no attempt of any chapter can succeed until a person acts (a rejected key, an
  exhausted quota or credit balance, a model name the provider does not know); `resume`
  continues after the fix;
- `fail_chapter`: this request is wrong (malformed, too long); other chapters may be fine.

To support a new provider's billing error, add a row (tests/unit/test_classify.py checks
every row with a real error body).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from examforge.errors import ErrorKind as Kind


class Action(str, Enum):
    retry = "retry"
    pause_exam = "pause_exam"
    fail_chapter = "fail_chapter"


@dataclass(frozen=True)
class Rule:
    status: tuple[int, int]  # inclusive range
    kind: Kind
    action: Action
    code: str | None = None  # error.code, or error.type, equal to this
    phrase: str | None = None  # a case-insensitive regex found in error.message

    def matches(self, status: int, code: str | None, type_: str | None, message: str) -> bool:
        if not self.status[0] <= status <= self.status[1]:
            return False
        if self.code is not None and self.code not in (code, type_):
            return False
        return self.phrase is None or re.search(self.phrase, message, re.IGNORECASE) is not None


def _s(lo: int, hi: int | None = None) -> tuple[int, int]:
    return (lo, hi if hi is not None else lo)


RULES: tuple[Rule, ...] = (
    # Flex capacity (OpenAI's service_tier=flex): a 429 with code resource_unavailable and a
    # message starting "Resource unavailable". Waiting fixes it; it is no quota and no rate
    # limit (examforge.retry backs off this chapter only, uncounted). First, so that no
    # billing phrase its message may carry ever reads as a quota that pauses the exam.
    Rule(_s(429), Kind.resource_unavailable, Action.retry, code="resource_unavailable"),
    Rule(_s(429), Kind.resource_unavailable, Action.retry, phrase=r"^\s*resource unavailable"),
    # A provider batch's lines and batches (runner.batching): a line the batch never ran
    # (it expired, or was cancelled) and a batch over the model's enqueued-token limit are
    # retried in a later batch; neither was billed. Their errors carry no HTTP status of
    # their own (0) and are matched by code first, whatever the status.
    Rule(_s(0, 599), Kind.batch_expired, Action.retry, code="batch_expired"),
    Rule(_s(0, 599), Kind.batch_cancelled, Action.retry, code="batch_cancelled"),
    Rule(_s(0, 599), Kind.batch_token_limit, Action.retry, code="token_limit_exceeded"),
    # Billing. OpenAI says 429 for both a rate limit and an exhausted quota: the body tells.
    Rule(_s(429), Kind.quota, Action.pause_exam, code="insufficient_quota"),
    Rule(_s(403), Kind.quota, Action.pause_exam, code="insufficient_quota"),
    Rule(_s(429), Kind.quota, Action.pause_exam, phrase=r"exceeded your current quota"),
    Rule(_s(402), Kind.quota, Action.pause_exam),  # OpenRouter, DeepSeek: payment required
    Rule(_s(400), Kind.quota, Action.pause_exam, phrase=r"credit balance is too low"),  # Anthropic
    Rule(_s(403), Kind.quota, Action.pause_exam, phrase=r"billing|quota|credits"),
    # The key.
    Rule(_s(401), Kind.auth, Action.pause_exam),
    Rule(_s(403), Kind.auth, Action.pause_exam),
    # A model name no call can use.
    Rule(_s(404), Kind.model_not_found, Action.pause_exam, code="model_not_found"),
    Rule(_s(400, 404), Kind.model_not_found, Action.pause_exam,
         phrase=r"model .*(does not exist|not found)|unknown model|no such model"),
    # Waiting fixes these.
    Rule(_s(429), Kind.rate_limited, Action.retry),
    Rule(_s(408), Kind.conflict, Action.retry),
    Rule(_s(409), Kind.conflict, Action.retry),
    Rule(_s(425), Kind.conflict, Action.retry),
    Rule(_s(500, 599), Kind.server_error, Action.retry),  # 529: Anthropic's "overloaded"
    # The request itself is wrong: context too long, bad parameter, unprocessable.
    Rule(_s(400, 499), Kind.bad_request, Action.fail_chapter),
)


def classify(status: int, code: str | None = None, type_: str | None = None,
             message: str = "") -> Rule:
    """The first rule that matches an error reply (status >= 400)."""
    for rule in RULES:
        if rule.matches(status, code, type_, message):
            return rule
    return Rule(_s(status), Kind.bad_request, Action.fail_chapter)
