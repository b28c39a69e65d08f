"""Issue 16: a billed reply is booked at what it cost, and the reply's JSON schema is sent.

The client against httpx.MockTransport: list content, a 200 whose content cannot be used, a
body cut after its headers, the rate limiter's refunds, and LLM_RESPONSE_FORMAT with its
once-per-process fallback. (The ledger side, on both databases: tests/integration/
test_billed_ledger.py; whole runs: tests/e2e/test_billed_runs.py.)"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import httpx
import pytest

from examforge.errors import (
    DeadlineExceeded,
    PermanentProviderError,
    ReplyLost,
    ReplyUnusable,
    RetryableProviderError,
)
from examforge.llm import LLMClient
from examforge.ratelimit import Limits, LocalLimiter
from examforge.reply_schema import QuestionList, reply_schema, schema_text
from examforge.tokens import count_messages, count_text, reserve_prompt_tokens
from fakellm import reply

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Number: 5"}]
ANSWER = json.dumps({"questions": [{"question": "Q?", "choices": ["a", "b", "c", "d"],
                                    "answer_index": 1, "explanation": "b"}]})


class RecordingLimiter(LocalLimiter):
    """A local limiter that records every correction: negative ones are refunds."""

    def __init__(self) -> None:
        super().__init__()
        self.adjusted: list[int] = []

    def adjust(self, limits: Limits, tokens: int) -> None:
        self.adjusted.append(tokens)
        super().adjust(limits, tokens)


@pytest.fixture
def make(make_settings: Callable[..., Any]) -> Iterator[Callable[..., tuple[LLMClient, list[Any]]]]:
    clients: list[LLMClient] = []

    def build(handler: Callable[[httpx.Request], httpx.Response], limiter: Any = None,
              **overrides: Any) -> tuple[LLMClient, list[Any]]:
        sent: list[Any] = []

        def record(request: httpx.Request) -> httpx.Response:
            sent.append(json.loads(request.content))
            return handler(request)

        overrides.setdefault("llm_model", "test-model")
        client = LLMClient(make_settings(**overrides), transport=httpx.MockTransport(record),
                           limiters=(lambda url, model: limiter) if limiter else None)
        clients.append(client)
        return client, sent

    yield build
    for client in clients:
        client.close()


def _parts(*parts: object, usage: dict[str, int] | None = None) -> httpx.Response:
    return httpx.Response(200, json={
        "model": "m", "choices": [{"message": {"role": "assistant", "content": list(parts)},
                                   "finish_reason": "stop"}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 20}})


# --- list content ---------------------------------------------------------------------------

def test_content_given_as_text_parts_is_the_parts_joined(make: Any) -> None:
    half = len(ANSWER) // 2  # split inside a JSON string: the parts are joined as they come
    client, _ = make(lambda r: _parts({"type": "reasoning", "text": "thinking..."},
                                      {"type": "text", "text": ANSWER[:half]},
                                      {"type": "text", "text": ANSWER[half:]}))
    completion = client.complete(MESSAGES)
    assert completion.content == ANSWER
    assert (completion.prompt_tokens, completion.completion_tokens) == (10, 20)
    assert not completion.usage_estimated


def test_content_with_no_text_part_is_empty_content_not_an_error(make: Any) -> None:
    client, _ = make(lambda r: _parts({"type": "image_url", "image_url": {"url": "x"}}))
    assert client.complete(MESSAGES).content is None  # the output layer calls it "empty"


# --- a 200 whose content cannot be used -----------------------------------------------------

def test_unusable_content_with_usage_is_billed_at_that_usage_not_retried(make: Any) -> None:
    client, sent = make(lambda r: httpx.Response(200, json={
        "choices": [{"message": {"content": 42}}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 700}}),
        llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=2.0)
    with pytest.raises(ReplyUnusable) as info:
        client.complete(MESSAGES)
    err = info.value
    assert not isinstance(err, RetryableProviderError)  # re-asked under MAX_REASKS instead
    assert err.billed is not None and not err.billed.estimated
    assert (err.billed.prompt_tokens, err.billed.completion_tokens) == (300, 700)
    assert err.billed.cost_usd == pytest.approx((300 * 1.0 + 700 * 2.0) / 1e6)
    assert len(sent) == 1


def test_unusable_content_without_usage_is_our_count_capped_at_max_tokens(make: Any) -> None:
    body = json.dumps({"choices": [{"message": {"content": {"text": "x " * 5000}}}]})
    client, _ = make(lambda r: httpx.Response(200, content=body.encode()))
    with pytest.raises(ReplyUnusable) as info:
        client.complete(MESSAGES, max_tokens=50)
    billed = info.value.billed
    assert billed is not None and billed.estimated
    assert billed.prompt_tokens == count_messages(MESSAGES, "test-model")
    assert billed.completion_tokens == 50  # the body counts more; a model bills max_tokens at most
    with pytest.raises(ReplyUnusable) as info:
        client.complete(MESSAGES, max_tokens=100_000)
    assert info.value.billed is not None
    assert info.value.billed.completion_tokens == count_text(body, "test-model")


# --- a body cut after the headers -----------------------------------------------------------

class _CutStream(httpx.SyncByteStream):
    """The first half of a body, then the connection closes (what httpcore raises then)."""

    def __init__(self, body: bytes, error: type[httpx.TransportError]) -> None:
        self.body, self.error = body, error

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: len(self.body) // 2]
        raise self.error("peer closed connection without sending complete message body")


@pytest.mark.parametrize("error", [httpx.RemoteProtocolError, httpx.ReadError])
def test_a_body_cut_after_the_headers_is_billed_at_its_worst_case_and_retryable(
        make: Any, error: type[httpx.TransportError]) -> None:
    full = reply(ANSWER).content
    client, sent = make(lambda r: httpx.Response(
        200, headers={"content-length": str(len(full))}, stream=_CutStream(full, error)),
        llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=2.0)
    with pytest.raises(ReplyLost) as info:
        client.complete(MESSAGES, max_tokens=900)
    err = info.value
    assert isinstance(err, RetryableProviderError) and err.kind.value == "reply_cut"
    # Our count with the reservation's margin (test-model has no encoding of its own).
    prompt = reserve_prompt_tokens(count_messages(MESSAGES, "test-model"), "test-model")
    assert err.billed is not None and err.billed.estimated
    assert (err.billed.prompt_tokens, err.billed.completion_tokens) == (prompt, 900)
    assert err.billed.cost_usd == pytest.approx((prompt * 1.0 + 900 * 2.0) / 1e6)
    assert err.endpoint == "primary" and len(sent) == 1


def test_an_error_reply_cut_short_or_a_reset_before_any_reply_is_not_billed(make: Any) -> None:
    client, _ = make(lambda r: httpx.Response(
        503, stream=_CutStream(b'{"error": {"message": "overloaded"}}', httpx.ReadError)))
    with pytest.raises(RetryableProviderError) as info:
        client.complete(MESSAGES, max_tokens=900)
    assert not isinstance(info.value, ReplyLost) and info.value.billed is None

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                        request=request)

    client, _ = make(reset)
    with pytest.raises(RetryableProviderError) as info:
        client.complete(MESSAGES, max_tokens=900)
    assert info.value.billed is None and info.value.kind.value == "connection"


def test_a_timeout_after_sending_is_the_same_path_as_a_cut_body(make: Any) -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no reply", request=request)

    client, _ = make(timeout)
    with pytest.raises(DeadlineExceeded) as info:
        client.complete(MESSAGES, max_tokens=900)
    assert isinstance(info.value, ReplyLost)
    assert info.value.billed is not None and info.value.billed.completion_tokens == 900


# --- the rate limiter keeps what the provider counted ---------------------------------------

def test_tokens_the_provider_counted_are_never_refunded(make: Any) -> None:
    limiter = RecordingLimiter()
    full = reply(ANSWER).content
    outcomes = iter([
        lambda: httpx.Response(200, json={"choices": [], "usage": {"prompt_tokens": 10,
                                                                   "completion_tokens": 10}}),
        lambda: httpx.Response(200, headers={"content-length": str(len(full))},
                               stream=_CutStream(full, httpx.RemoteProtocolError)),
        lambda: httpx.Response(503, json={"error": {"message": "busy"}}),
    ])
    client, _ = make(lambda r: next(outcomes)(), limiter, llm_tpm=1_000_000)
    tokens = count_messages(MESSAGES, "test-model") + 500
    with pytest.raises(ReplyUnusable):  # billed at its usage: 20 of the 520 charged
        client.complete(MESSAGES, max_tokens=500)
    assert limiter.adjusted == []  # OpenAI counts max_tokens at admission: nothing goes back
    with pytest.raises(ReplyLost):  # billed at its worst case: all of it kept
        client.complete(MESSAGES, max_tokens=500)
    assert limiter.adjusted == []
    with pytest.raises(RetryableProviderError):  # a 503: the provider did not do the work
        client.complete(MESSAGES, max_tokens=500)
    assert limiter.adjusted == [-tokens]


def test_where_tpm_counts_usage_an_unusable_reply_is_settled_at_its_usage(make: Any) -> None:
    limiter = RecordingLimiter()
    client, _ = make(lambda r: httpx.Response(200, json={
        "choices": [{"message": "broken"}], "usage": {"prompt_tokens": 10,
                                                      "completion_tokens": 10}}),
        limiter, llm_tpm=1_000_000, llm_tpm_counts="usage")
    with pytest.raises(ReplyUnusable):
        client.complete(MESSAGES, max_tokens=500)
    assert limiter.adjusted == [20 - count_messages(MESSAGES, "test-model") - 500]


# --- LLM_RESPONSE_FORMAT --------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "expected"), [
    ({"llm_response_format": "json_schema"}, "json_schema"),
    ({"llm_response_format": "json_object"}, "json_object"),
    ({"llm_response_format": "none"}, None),
    ({}, "json_object"),  # auto, at an endpoint not known to take a schema
    ({"llm_base_url": "https://api.openai.com/v1"}, "json_schema"),
    ({"llm_model": "mock-model"}, "json_schema"),  # the bundled mock
    ({"llm_json_mode": False}, None),  # the deprecated switch still turns it off
    ({"llm_json_mode": False, "llm_response_format": "json_schema"}, "json_schema"),
])
def test_response_format_per_setting(make: Any, overrides: dict[str, Any],
                                     expected: str | None) -> None:
    client, sent = make(lambda r: reply(ANSWER), **overrides)
    client.complete(MESSAGES)
    shape = sent[0].get("response_format")
    assert (shape or {}).get("type") == expected
    if expected == "json_schema":
        assert shape == {"type": "json_schema", "json_schema": {
            "name": "exam_questions", "schema": reply_schema(), "strict": True}}


def test_the_schema_is_strict_and_fits_what_the_prompt_asks(make: Any) -> None:
    schema = reply_schema()
    item = schema["properties"]["questions"]["items"]
    for obj in (schema, item):  # OpenAI's strict mode: closed objects, every property required
        assert obj["additionalProperties"] is False
        assert sorted(obj["required"]) == sorted(obj["properties"])
    assert list(item["properties"])[:2] == ["question", "choices"]  # the answer comes after
    assert "$ref" not in schema_text() and "$defs" not in schema_text()
    QuestionList.model_validate_json(ANSWER.replace('"b"}', '"b", "difficulty": null, "bloom": null, "source": null}'))


def test_a_request_with_the_schema_counts_its_tokens_in_the_prompt(make: Any) -> None:
    plain, _ = make(lambda r: reply(ANSWER), llm_response_format="json_object")
    schema, _ = make(lambda r: reply(ANSWER), llm_response_format="json_schema")
    assert schema.count_prompt(MESSAGES) == (plain.count_prompt(MESSAGES)
                                             + count_text(schema_text(), "test-model"))


def _refusing(refused: set[str]) -> Callable[[httpx.Request], httpx.Response]:
    """A server that answers a 400 naming response_format to the formats in `refused`."""

    def handler(request: httpx.Request) -> httpx.Response:
        kind = (json.loads(request.content).get("response_format") or {}).get("type")
        if kind in refused:
            return httpx.Response(400, json={"error": {
                "message": f"Invalid parameter: 'response_format' of type '{kind}' is not "
                           "supported with this model.",
                "type": "invalid_request_error", "param": "response_format", "code": None}})
        return reply(ANSWER)

    return handler


def test_a_refused_schema_falls_back_once_per_process_without_a_failed_call(make: Any) -> None:
    limiter = RecordingLimiter()
    client, sent = make(_refusing({"json_schema"}), limiter, llm_response_format="json_schema",
                        llm_tpm=1_000_000)
    assert client.complete(MESSAGES).content == ANSWER  # the same call, re-sent at once
    assert [b["response_format"]["type"] for b in sent] == ["json_schema", "json_object"]
    assert limiter.adjusted == []  # one admission for the call, not refunded, not charged twice
    client.complete(MESSAGES)
    client.complete(MESSAGES)
    assert [b["response_format"]["type"] for b in sent[2:]] == ["json_object", "json_object"]
    assert client.response_format_of("primary") == "json_object"


def test_a_refused_json_object_falls_back_to_none(make: Any) -> None:
    client, sent = make(_refusing({"json_schema", "json_object"}),
                        llm_response_format="json_schema")
    assert client.complete(MESSAGES).content == ANSWER
    assert [(b.get("response_format") or {}).get("type") for b in sent] == [
        "json_schema", "json_object", None]


def test_a_400_that_names_something_else_is_not_a_fallback(make: Any) -> None:
    client, sent = make(lambda r: httpx.Response(400, json={"error": {
        "message": "This model's maximum context length is 8192 tokens",
        "type": "invalid_request_error", "param": "messages"}}),
        llm_response_format="json_schema")
    with pytest.raises(PermanentProviderError):
        client.complete(MESSAGES)
    assert len(sent) == 1 and client.response_format_of("primary") == "json_schema"
