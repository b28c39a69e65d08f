"""The table of provider errors, row by row, with the bodies real providers send."""

from __future__ import annotations

import json

import httpx
import pytest

from examforge.classify import RULES, Action, classify
from examforge.errors import (
    AuthError,
    CapacityUnavailable,
    ErrorKind,
    ModelNotFound,
    PermanentProviderError,
    QuotaExceeded,
    RateLimited,
    RetryableProviderError,
)
from examforge.llm import LLMClient


def _openai(message: str, type_: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


CASES = [
    # (what, status, body, kind, action)
    ("OpenAI rate limit", 429, _openai(
        "Rate limit reached for gpt-4o-mini in organization org-x on requests per min (RPM): "
        "Limit 500, Used 500, Requested 1.", "requests", "rate_limit_exceeded"),
     ErrorKind.rate_limited, Action.retry),
    ("OpenAI token rate limit", 429, _openai(
        "Rate limit reached ... on tokens per min (TPM)", "tokens", "rate_limit_exceeded"),
     ErrorKind.rate_limited, Action.retry),
    ("OpenAI exhausted quota", 429, _openai(
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota", "insufficient_quota"), ErrorKind.quota, Action.pause_exam),
    ("quota with the type only", 429, _openai("no credit", "insufficient_quota", None),
     ErrorKind.quota, Action.pause_exam),
    ("quota in the message only", 429, {"error": {
        "message": "You exceeded your current quota, please check your plan"}},
     ErrorKind.quota, Action.pause_exam),
    ("quota as 403", 403, _openai("quota", "insufficient_quota", "insufficient_quota"),
     ErrorKind.quota, Action.pause_exam),
    ("OpenRouter out of credits", 402, {"error": {
        "code": 402, "message": "Insufficient credits. Add more using https://openrouter.ai"}},
     ErrorKind.quota, Action.pause_exam),
    ("DeepSeek balance", 402, {"error": {"message": "Insufficient Balance",
                                         "type": "unknown_error"}},
     ErrorKind.quota, Action.pause_exam),
    ("Anthropic credit balance", 400, {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "Your credit balance is too low to access the Anthropic API."}},
     ErrorKind.quota, Action.pause_exam),
    ("a 403 about billing", 403, {"error": {"message": "Billing hard limit has been reached"}},
     ErrorKind.quota, Action.pause_exam),
    ("OpenAI bad key", 401, _openai("Incorrect API key provided: sk-...",
                                    "invalid_request_error", "invalid_api_key"),
     ErrorKind.auth, Action.pause_exam),
    ("permission denied", 403, _openai("Project does not have access to model",
                                       "invalid_request_error", None),
     ErrorKind.auth, Action.pause_exam),
    ("OpenAI unknown model", 404, _openai(
        "The model `gpt-9` does not exist or you do not have access to it.",
        "invalid_request_error", "model_not_found"), ErrorKind.model_not_found,
     Action.pause_exam),
    ("Ollama unknown model", 404, {"error": {
        "message": "model \"llama9\" not found, try pulling it first", "type": "api_error"}},
     ErrorKind.model_not_found, Action.pause_exam),
    ("vLLM unknown model", 400, {"object": "error", "message": "x", "error": {
        "message": "The model `qwen` does not exist.", "type": "NotFoundError"}},
     ErrorKind.model_not_found, Action.pause_exam),
    ("context too long", 400, _openai(
        "This model's maximum context length is 128000 tokens.", "invalid_request_error",
        "context_length_exceeded"), ErrorKind.bad_request, Action.fail_chapter),
    ("an unknown path", 404, {"error": {"message": "Not Found"}},
     ErrorKind.bad_request, Action.fail_chapter),
    ("unprocessable", 422, {"detail": "bad"}, ErrorKind.bad_request, Action.fail_chapter),
    ("timeout at a proxy", 408, {}, ErrorKind.conflict, Action.retry),
    ("conflict", 409, {}, ErrorKind.conflict, Action.retry),
    ("too early", 425, {}, ErrorKind.conflict, Action.retry),
    ("OpenAI server error", 500, _openai("The server had an error", "server_error", None),
     ErrorKind.server_error, Action.retry),
    ("overloaded", 503, _openai("The engine is currently overloaded", "server_error", None),
     ErrorKind.server_error, Action.retry),
    ("Anthropic overloaded", 529, {"type": "error", "error": {"type": "overloaded_error",
                                                               "message": "Overloaded"}},
     ErrorKind.server_error, Action.retry),
    ("a gateway's 502 page", 502, "<html>Bad Gateway</html>", ErrorKind.server_error,
     Action.retry),
    ("a teapot", 418, {}, ErrorKind.bad_request, Action.fail_chapter),
    # OpenAI's flex tier out of capacity (developers.openai.com/api/docs/guides/flex-processing:
    # "429 Resource Unavailable"); the code row first, the message row for a gateway that
    # passes the message on without the code.
    ("OpenAI flex capacity", 429, _openai(
        "Resource unavailable: flex capacity is exhausted right now; retry later, or use the "
        "default service tier.", "rate_limit_error", "resource_unavailable"),
     ErrorKind.resource_unavailable, Action.retry),
    ("flex capacity, message only", 429, {"error": {
        "message": "Resource Unavailable", "type": "invalid_request_error"}},
     ErrorKind.resource_unavailable, Action.retry),
    # Batch API codes (runner.batching passes status 0 for a line with no response).
    ("a batch line that expired", 400, _openai(
        "This request could not be executed before the completion window expired.", None,
        "batch_expired"), ErrorKind.batch_expired, Action.retry),
    ("a batch line that was cancelled", 400, _openai(
        "This request was not executed because the batch was cancelled.", None,
        "batch_cancelled"), ErrorKind.batch_cancelled, Action.retry),
    ("a batch over the enqueued-token limit", 400, _openai(
        "Enqueued token limit reached for gpt-4o-mini in organization org-x. Limit: 90,000 "
        "enqueued tokens. Please try again once some in_progress batches have been completed.",
        None, "token_limit_exceeded"), ErrorKind.batch_token_limit, Action.retry),
]

ERROR_CLASS = {
    (Action.retry, ErrorKind.rate_limited): RateLimited,
    (Action.retry, ErrorKind.resource_unavailable): CapacityUnavailable,
    (Action.pause_exam, ErrorKind.quota): QuotaExceeded,
    (Action.pause_exam, ErrorKind.auth): AuthError,
    (Action.pause_exam, ErrorKind.model_not_found): ModelNotFound,
}


@pytest.mark.parametrize(("what", "status", "body", "kind", "action"), CASES,
                         ids=[c[0] for c in CASES])
def test_each_row_with_a_real_body(make_settings, what, status, body, kind, action):
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    client = LLMClient(make_settings(), transport=httpx.MockTransport(
        lambda r: httpx.Response(status, content=content)))
    with pytest.raises(Exception) as info:
        client.complete([{"role": "user", "content": "hi"}])
    err = info.value
    assert err.kind is kind, what
    expected = ERROR_CLASS.get((action, kind)) or {
        Action.retry: RetryableProviderError, Action.fail_chapter: PermanentProviderError}[action]
    assert type(err) is expected, what
    assert err.status_code == status


def test_every_rule_is_reached_by_some_case():
    reached = set()
    for _, status, body, *_ in CASES:
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        rule = classify(status, str(err["code"]) if err.get("code") is not None else None,
                        err.get("type"), str(err.get("message") or ""))
        reached.add(RULES.index(rule))
    assert reached == set(range(len(RULES)))


def test_the_first_matching_row_wins_quota_before_rate_limit():
    assert classify(429, "insufficient_quota").kind is ErrorKind.quota
    assert classify(429, "rate_limit_exceeded").kind is ErrorKind.rate_limited
    assert classify(429).kind is ErrorKind.rate_limited


def test_flex_capacity_is_never_a_quota_or_a_rate_limit():
    """Flex's 429 must never pause the exam (a quota) nor hold every worker (a rate limit),
    even when its message carries a billing phrase."""
    rule = classify(429, "resource_unavailable", "rate_limit_error",
                    "Resource unavailable; you exceeded your current quota of flex")
    assert (rule.kind, rule.action) == (ErrorKind.resource_unavailable, Action.retry)
    assert classify(429, None, None, "resource unavailable right now").kind \
        is ErrorKind.resource_unavailable
    # Elsewhere in a message the phrase is no flex refusal.
    assert classify(429, "rate_limit_exceeded", None, "a resource unavailable").kind \
        is ErrorKind.rate_limited
