"""examforge.llm.LLMClient against httpx.MockTransport: request shape and error translation."""

from __future__ import annotations

import email.utils
import gzip
import json
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

import httpx
import pytest

from examforge.errors import (
    AuthError,
    DeadlineExceeded,
    PermanentProviderError,
    ProviderError,
    RateLimited,
    ReplyUnusable,
    RetryableProviderError,
)
from examforge.llm import Completion, LLMClient
from fakellm import reply

KEY = "sk-test-SECRET-4242-do-not-leak"
MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Number: 5"}]

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that records every request it sees."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.handler(request)


@pytest.fixture
def client_for(make_settings: Callable[..., Any]) -> Iterator[Callable[..., tuple[LLMClient, Recorder]]]:
    clients: list[LLMClient] = []

    def make(handler: Handler, **overrides: Any) -> tuple[LLMClient, Recorder]:
        overrides.setdefault("llm_api_key", KEY)
        recorder = Recorder(handler)
        client = LLMClient(make_settings(**overrides), transport=httpx.MockTransport(recorder))
        clients.append(client)
        return client, recorder

    yield make
    for client in clients:
        client.close()


def complete_error(client: LLMClient) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        client.complete(MESSAGES)
    err = info.value
    assert KEY not in str(err) and KEY not in repr(err)
    return err


def http_date(delta_s: int) -> str:
    return email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=delta_s),
                                       usegmt=True)


# --- request shape --------------------------------------------------------------------------

def test_request_shape(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, rec = client_for(lambda r: reply("{}"), llm_model="gpt-test", llm_temperature=0.3)
    client.complete(MESSAGES)
    assert len(rec.requests) == 1
    request = rec.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "http://mock.invalid/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {
        "model": "gpt-test",
        "messages": MESSAGES,
        "temperature": 0.3,
        "response_format": {"type": "json_object"},
    }


@pytest.mark.parametrize("base", ["http://mock.invalid/v1", "http://mock.invalid/v1/"])
def test_url_with_or_without_trailing_slash(client_for: Callable[..., tuple[LLMClient, Recorder]],
                                           base: str) -> None:
    client, rec = client_for(lambda r: reply("{}"), llm_base_url=base)
    client.complete(MESSAGES)
    assert str(rec.requests[0].url) == "http://mock.invalid/v1/chat/completions"


def test_json_mode_off_sends_no_response_format(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, rec = client_for(lambda r: reply("{}"), llm_json_mode=False)
    client.complete(MESSAGES)
    body = json.loads(rec.requests[0].content)
    assert "response_format" not in body
    assert body["messages"] == MESSAGES


def test_each_call_is_one_request(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, rec = client_for(lambda r: reply("{}"))
    for _ in range(3):
        client.complete(MESSAGES)
    assert len(rec.requests) == 3


# --- 200 ------------------------------------------------------------------------------------

def test_200_is_a_completion(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: reply('{"questions": []}', finish_reason="stop",
                                           prompt_tokens=123, completion_tokens=45))
    assert client.complete(MESSAGES) == Completion(
        content='{"questions": []}', finish_reason="stop", prompt_tokens=123,
        completion_tokens=45, model="fake-model")


def test_200_with_length_finish_reason_is_returned_as_is(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: reply('{"questions": [', finish_reason="length"))
    completion = client.complete(MESSAGES)
    assert completion.finish_reason == "length" and completion.content == '{"questions": ['


def _envelope(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "m", "choices": [{"message": {"role": "assistant", "content": "hi"},
                                   "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 20}}
    data.update(overrides)
    return data


ESTIMATED = None  # the reply's usage is missing or unusable: our own count is booked


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 10, "completion_tokens": 20}, (10, 20)),
        ({"prompt_tokens": 0, "completion_tokens": 0}, (0, 0)),
        (None, ESTIMATED),
        ({}, ESTIMATED),
        ({"prompt_tokens": 7}, ESTIMATED),
        ({"prompt_tokens": -5, "completion_tokens": 3}, ESTIMATED),
        ({"prompt_tokens": "10", "completion_tokens": 2.5}, ESTIMATED),
        ({"prompt_tokens": True, "completion_tokens": False}, ESTIMATED),
        ("lots", ESTIMATED),
        ([10, 20], ESTIMATED),
    ],
)
def test_usage_tokens(client_for: Callable[..., tuple[LLMClient, Recorder]], usage: Any,
                      expected: tuple[int, int] | None) -> None:
    data = _envelope(usage=usage)
    # A model auto sends json_object for (json_schema would add the schema to our count).
    client, _ = client_for(lambda r: httpx.Response(200, json=data), llm_model="test-model")
    completion = client.complete(MESSAGES)
    if expected is ESTIMATED:
        from examforge.tokens import count_messages, count_text

        # A reply without usage is not free: the prompt as sent and the reply as received
        # are counted with the tokenizer, and the call says its usage is an estimate.
        assert completion.usage_estimated
        assert completion.prompt_tokens == count_messages(MESSAGES, "test-model")
        assert completion.completion_tokens == count_text(completion.content or "", "m")
        assert completion.prompt_tokens > 0
    else:
        assert not completion.usage_estimated
        assert (completion.prompt_tokens, completion.completion_tokens) == expected
    assert completion.content == "hi"


def test_missing_usage_key(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    data = _envelope()
    del data["usage"]
    client, _ = client_for(lambda r: httpx.Response(200, json=data))
    completion = client.complete(MESSAGES)
    assert completion.usage_estimated and completion.prompt_tokens > 0


@pytest.mark.parametrize(
    ("choice", "content", "finish_reason"),
    [
        ({"message": {"content": None}, "finish_reason": "stop"}, None, "stop"),
        ({"message": None}, None, None),
        ({"message": {}}, None, None),
        ({}, None, None),
        ({"message": {"content": ""}, "finish_reason": None}, "", None),
    ],
)
def test_empty_but_well_formed_messages(client_for: Callable[..., tuple[LLMClient, Recorder]],
                                        choice: dict[str, Any], content: str | None,
                                        finish_reason: str | None) -> None:
    # No content is the model's answer (the output layer calls it "empty"), not a fault.
    client, _ = client_for(lambda r: httpx.Response(200, json=_envelope(choices=[choice])))
    completion = client.complete(MESSAGES)
    assert (completion.content, completion.finish_reason) == (content, finish_reason)


def test_missing_model_is_the_model_asked_for(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    data = _envelope()
    del data["model"]
    client, _ = client_for(lambda r: httpx.Response(200, json=data), llm_model="asked-model")
    assert client.complete(MESSAGES).model == "asked-model"


BROKEN_ENVELOPES: list[tuple[str, Callable[[], httpx.Response]]] = [
    ("no choices", lambda: httpx.Response(200, json={"id": "x", "model": "m"})),
    ("empty choices", lambda: httpx.Response(200, json=_envelope(choices=[]))),
    ("choices null", lambda: httpx.Response(200, json=_envelope(choices=None))),
    ("choices an object", lambda: httpx.Response(200, json=_envelope(choices={"0": {}}))),
    ("choice a string", lambda: httpx.Response(200, json=_envelope(choices=["hi"]))),
    ("message a string", lambda: httpx.Response(200, json=_envelope(choices=[{"message": "hi"}]))),
    ("content a number",
     lambda: httpx.Response(200, json=_envelope(choices=[{"message": {"content": 42}}]))),
    ("content a list of strings",
     lambda: httpx.Response(200, json=_envelope(choices=[{"message": {"content": ["a"]}}]))),
    ("a text part without text", lambda: httpx.Response(200, json=_envelope(
        choices=[{"message": {"content": [{"type": "text", "text": 5}]}}]))),
    ("finish_reason a number", lambda: httpx.Response(200, json=_envelope(
        choices=[{"message": {"content": "x"}, "finish_reason": 1}]))),
    ("top level a list", lambda: httpx.Response(200, json=[1, 2])),
    ("top level a string", lambda: httpx.Response(200, json="ok")),
    ("html", lambda: httpx.Response(200, text="<html>Bad gateway</html>")),
    ("empty body", lambda: httpx.Response(200, content=b"")),
    ("truncated json", lambda: httpx.Response(200, content=b'{"choices": [{"mess')),
    ("not utf-8", lambda: httpx.Response(200, content=b"\xff\xfe\xfa",
                                         headers={"content-type": "application/json"})),
    ("deeply nested", lambda: httpx.Response(200, content=b"[" * 100_000 + b"]" * 100_000)),
]


@pytest.mark.parametrize("make_response", [m for _, m in BROKEN_ENVELOPES],
                         ids=[n for n, _ in BROKEN_ENVELOPES])
def test_200_with_broken_envelope_is_unusable_and_billed(
        client_for: Callable[..., tuple[LLMClient, Recorder]],
        make_response: Callable[[], httpx.Response]) -> None:
    # Not a transient fault (the pipeline re-asks it under MAX_REASKS) and never free: booked
    # at the usage it carries, or at our own count of the prompt and the body when it has none.
    client, rec = client_for(lambda r: make_response())
    err = complete_error(client)
    assert type(err) is ReplyUnusable and not isinstance(err, RetryableProviderError)
    assert err.status_code is None and err.retry_after_s is None
    assert str(err).startswith("unreadable reply envelope: ")
    assert len(str(err)) <= 200
    assert len(rec.requests) == 1
    assert err.billed is not None
    try:
        carried = isinstance(json.loads(make_response().content).get("usage"), dict)
    except (ValueError, AttributeError, RecursionError):
        carried = False
    if carried:
        assert (err.billed.prompt_tokens, err.billed.completion_tokens) == (10, 20)
        assert not err.billed.estimated
    else:
        assert err.billed.estimated and err.billed.prompt_tokens > 0


# --- HTTP status translation ----------------------------------------------------------------

STATUS_TABLE: list[tuple[int, type[ProviderError]]] = [
    (400, PermanentProviderError),
    (401, AuthError),
    (403, AuthError),
    (404, PermanentProviderError),
    (405, PermanentProviderError),
    (413, PermanentProviderError),
    (422, PermanentProviderError),
    (408, RetryableProviderError),
    (409, RetryableProviderError),
    (425, RetryableProviderError),
    (429, RateLimited),
    (500, RetryableProviderError),
    (501, RetryableProviderError),
    (502, RetryableProviderError),
    (503, RetryableProviderError),
    (504, RetryableProviderError),
    (529, RetryableProviderError),
]


@pytest.mark.parametrize(("status", "error_type"), STATUS_TABLE)
def test_status_translation(client_for: Callable[..., tuple[LLMClient, Recorder]], status: int,
                            error_type: type[ProviderError]) -> None:
    client, rec = client_for(
        lambda r: httpx.Response(status, json={"error": {"message": "something went wrong"}}))
    err = complete_error(client)
    assert type(err) is error_type
    assert err.status_code == status
    assert str(err) == f"HTTP {status}: something went wrong"
    assert len(rec.requests) == 1  # no retry of its own, whatever the status
    if error_type is AuthError:
        assert isinstance(err, PermanentProviderError)
    if error_type is PermanentProviderError:
        assert not isinstance(err, (RetryableProviderError, AuthError))
    if error_type is RetryableProviderError:
        assert not isinstance(err, PermanentProviderError)
        assert err.retry_after_s is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"error": {"message": "bad model"}}, "HTTP 400: bad model"),
        ({"error": "plain string error"}, "HTTP 400: plain string error"),
        ({"error": {"code": "x"}}, "HTTP 400"),
        ({"detail": "fastapi style"}, "HTTP 400"),
        ([1, 2, 3], "HTTP 400"),
        ("<html>nginx</html>", "HTTP 400"),
        ("[" * 100_000 + "]" * 100_000, "HTTP 400"),
    ],
)
def test_error_text(client_for: Callable[..., tuple[LLMClient, Recorder]], body: Any,
                    expected: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(400, text=body)
        return httpx.Response(400, json=body)

    client, _ = client_for(handler)
    assert str(complete_error(client)) == expected


def test_error_text_is_bounded(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: httpx.Response(500, json={"error": {"message": "x" * 10_000}}))
    text = str(complete_error(client))
    assert text.startswith("HTTP 500: xxx") and len(text) <= 220


def test_deeply_nested_error_body_still_translates(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: httpx.Response(503, content=b"[" * 100_000 + b"]" * 100_000))
    err = complete_error(client)
    assert type(err) is RetryableProviderError and err.status_code == 503


# --- Retry-After ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [
        (429, "7", 7.0),
        (429, "0", 0.0),
        (429, "1.5", 1.5),
        (503, "30", 30.0),
        (500, "2", 2.0),
        (429, "soon", None),
        (429, "", None),
        (429, "-3", 0.0),
        (429, "inf", None),
        (429, http_date(-3600), 0.0),
    ],
    # A stable id for the date an hour ago: pytest-xdist's workers must collect the same ids.
    ids=lambda value: "an-hour-ago" if isinstance(value, str) and "GMT" in value else None,
)
def test_retry_after(client_for: Callable[..., tuple[LLMClient, Recorder]], status: int,
                     header: str, expected: float | None) -> None:
    client, _ = client_for(lambda r: httpx.Response(status, headers={"Retry-After": header}))
    err = complete_error(client)
    assert type(err) is (RateLimited if status == 429 else RetryableProviderError)
    assert err.status_code == status
    assert err.retry_after_s == expected


def test_retry_after_http_date(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: httpx.Response(429, headers={"Retry-After": http_date(120)}))
    err = complete_error(client)
    assert err.retry_after_s is not None and 115.0 <= err.retry_after_s <= 120.0


def test_no_retry_after_header(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: httpx.Response(429))
    err = complete_error(client)
    assert err.retry_after_s is None and str(err) == "HTTP 429"


def test_retry_after_is_ignored_on_permanent_errors(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: httpx.Response(400, headers={"Retry-After": "9"}))
    assert complete_error(client).retry_after_s is None


# --- transport failures ---------------------------------------------------------------------

TRANSPORT_ERRORS: list[tuple[type[httpx.RequestError], type[Exception], str]] = [
    (httpx.ConnectTimeout, RetryableProviderError, "timeout: ConnectTimeout"),
    # A read is never given more than what is left of the call's deadline: a read timeout
    # means no complete reply within LLM_TIMEOUT_S (and the provider may bill the call).
    (httpx.ReadTimeout, DeadlineExceeded,
     "deadline: no complete reply within LLM_TIMEOUT_S=5s (ReadTimeout)"),
    (httpx.WriteTimeout, RetryableProviderError, "timeout: WriteTimeout"),
    (httpx.PoolTimeout, RetryableProviderError, "timeout: PoolTimeout"),
    (httpx.ConnectError, RetryableProviderError, "connection error: ConnectError"),
    (httpx.ReadError, RetryableProviderError, "connection error: ReadError"),
    (httpx.WriteError, RetryableProviderError, "connection error: WriteError"),
    (httpx.RemoteProtocolError, RetryableProviderError, "connection error: RemoteProtocolError"),
    (httpx.LocalProtocolError, RetryableProviderError, "connection error: LocalProtocolError"),
    (httpx.ProxyError, RetryableProviderError, "connection error: ProxyError"),
]


@pytest.mark.parametrize(("exc_type", "error_type", "message"), TRANSPORT_ERRORS)
def test_transport_errors_are_retryable(client_for: Callable[..., tuple[LLMClient, Recorder]],
                                        exc_type: type[httpx.RequestError],
                                        error_type: type[Exception], message: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        # The message mentions the key, as some proxies' errors do: it must not surface.
        raise exc_type(f"failed with Authorization: Bearer {KEY}", request=request)

    client, rec = client_for(handler)
    err = complete_error(client)
    assert type(err) is error_type
    assert str(err) == message
    assert err.status_code is None and err.retry_after_s is None
    assert isinstance(err.__cause__, exc_type)
    assert len(rec.requests) == 1


def test_corrupt_compressed_body_is_retryable(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, rec = client_for(
        lambda r: httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"not gzip"))
    err = complete_error(client)
    assert type(err) is RetryableProviderError
    assert str(err) == "unreadable reply: DecodingError"
    assert isinstance(err.__cause__, httpx.DecodingError)
    assert len(rec.requests) == 1


def test_valid_compressed_body_is_read(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    body = gzip.compress(json.dumps(_envelope()).encode())
    client, _ = client_for(lambda r: httpx.Response(
        200, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        content=body))
    assert client.complete(MESSAGES).content == "hi"


# --- no retries, no leaked key --------------------------------------------------------------

@pytest.mark.parametrize(
    "handler",
    [
        lambda r: httpx.Response(503),
        lambda r: httpx.Response(429, headers={"Retry-After": "0"}),
        lambda r: httpx.Response(500, json={"error": "boom"}),
        lambda r: httpx.Response(200, json={}),
    ],
    ids=["503", "429", "500", "broken-200"],
)
def test_client_never_retries_by_itself(client_for: Callable[..., tuple[LLMClient, Recorder]],
                                        handler: Handler) -> None:
    client, rec = client_for(handler)
    for calls in (1, 2):
        with pytest.raises((RetryableProviderError, ReplyUnusable)):
            client.complete(MESSAGES)
        assert len(rec.requests) == calls


def test_client_never_retries_connect_errors(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client, rec = client_for(handler)
    with pytest.raises(RetryableProviderError):
        client.complete(MESSAGES)
    assert len(rec.requests) == 1


LEAKY_RESPONSES: list[tuple[str, Callable[[], httpx.Response]]] = [
    ("401 echoes the key",
     lambda: httpx.Response(401, json={"error": {"message": f"Incorrect API key provided: {KEY}."}})),
    ("403 echoes the key", lambda: httpx.Response(403, json={"error": f"key {KEY} is disabled"})),
    ("400 echoes the key", lambda: httpx.Response(400, json={"error": {"message": f"{KEY} bad"}})),
    ("429 echoes the key",
     lambda: httpx.Response(429, json={"error": {"message": f"rate limit for {KEY}"}})),
    ("503 echoes the key", lambda: httpx.Response(503, json={"error": f"{KEY}"})),
    ("key beyond the truncation point",
     # 200 characters of message end 15 characters into the key: redact first, then cut.
     lambda: httpx.Response(500, json={"error": "x" * 185 + KEY})),
    ("key in a broken envelope", lambda: httpx.Response(200, json={KEY: KEY})),
    ("key as a choices key", lambda: httpx.Response(200, json={"choices": {KEY: 1}})),
    ("key in a non-JSON body", lambda: httpx.Response(401, text=f"Bearer {KEY}")),
]


@pytest.mark.parametrize("make_response", [m for _, m in LEAKY_RESPONSES],
                         ids=[n for n, _ in LEAKY_RESPONSES])
def test_api_key_never_appears_in_errors(client_for: Callable[..., tuple[LLMClient, Recorder]],
                                         make_response: Callable[[], httpx.Response]) -> None:
    client, _ = client_for(lambda r: make_response())
    err = complete_error(client)  # asserts KEY not in str() / repr()
    assert all(KEY not in str(arg) for arg in err.args)
    assert KEY[:15] not in str(err)  # not even a prefix cut by truncation


def test_redaction_message(client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, _ = client_for(lambda r: httpx.Response(
        401, json={"error": {"message": f"Incorrect API key provided: {KEY}."}}))
    err = complete_error(client)
    assert type(err) is AuthError
    assert str(err) == "HTTP 401: Incorrect API key provided: ***."


def test_empty_api_key_does_not_mangle_messages(
        client_for: Callable[..., tuple[LLMClient, Recorder]]) -> None:
    client, rec = client_for(lambda r: httpx.Response(400, json={"error": "bad request"}),
                             llm_api_key="")
    with pytest.raises(PermanentProviderError) as info:
        client.complete(MESSAGES)
    assert str(info.value) == "HTTP 400: bad request"
    assert len(rec.requests) == 1


def test_settings_repr_hides_the_key(make_settings: Callable[..., Any]) -> None:
    settings = make_settings(llm_api_key=KEY)
    assert KEY not in repr(settings) and KEY not in str(settings)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_a_permanent_configuration_error(
        client_for: Callable[..., tuple[LLMClient, Recorder]], status: int) -> None:
    client, rec = client_for(
        lambda r: httpx.Response(status, headers={"location": "https://mock.invalid/v1/x"}))
    err = complete_error(client)
    assert type(err) is PermanentProviderError and err.status_code == status
    assert "LLM_BASE_URL" in str(err) and len(rec.requests) == 1


@pytest.mark.parametrize(("usage", "cached"), [
    # OpenAI's shape: part of prompt_tokens came from the prompt cache.
    ({"prompt_tokens": 2000, "completion_tokens": 100,
      "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0}}, 1536),
    # Anthropic's cache reads as a gateway passes them through in an OpenAI-shaped usage.
    ({"prompt_tokens": 2000, "completion_tokens": 100, "cache_read_input_tokens": 1024,
      "cache_creation_input_tokens": 0}, 1024),
    # No cache, a null or broken detail, more cached than the prompt (capped).
    ({"prompt_tokens": 2000, "completion_tokens": 100}, 0),
    ({"prompt_tokens": 2000, "completion_tokens": 100, "prompt_tokens_details": None}, 0),
    ({"prompt_tokens": 2000, "completion_tokens": 100,
      "prompt_tokens_details": {"cached_tokens": "lots"}}, 0),
    ({"prompt_tokens": 2000, "completion_tokens": 100,
      "prompt_tokens_details": {"cached_tokens": 5000}}, 2000),
])
def test_cached_tokens_are_read_and_priced(client_for: Callable[..., tuple[LLMClient, Recorder]],
                                           usage: dict[str, Any], cached: int) -> None:
    data = _envelope(usage=usage)
    client, _ = client_for(lambda r: httpx.Response(200, json=data), llm_model="x",
                           llm_price_prompt_per_mtok=2.0, llm_price_completion_per_mtok=8.0,
                           llm_price_cached_prompt_per_mtok=0.5)
    completion = client.complete(MESSAGES)
    assert completion.cached_tokens == cached and not completion.usage_estimated
    assert completion.cost_usd == pytest.approx(
        ((2000 - cached) * 2.0 + cached * 0.5 + 100 * 8.0) / 1e6)


def test_an_endpoint_that_answers_no_connection_for_the_stated_time_pauses_the_exam(
        make_settings: Callable[..., Any]) -> None:
    from examforge.errors import EndpointUnreachable, ErrorKind, PauseCode
    from examforge.retry import Action, decide

    now, answering = [0.0], [False]

    def handler(request: httpx.Request) -> httpx.Response:
        if answering[0]:
            return httpx.Response(200, json=_envelope())
        raise httpx.ConnectError("refused", request=request)

    settings = make_settings(llm_api_key=KEY, llm_unreachable_pause_s=30)
    client = LLMClient(settings, transport=httpx.MockTransport(handler), clock=lambda: now[0])
    try:
        for t in (0.0, 10.0, 29.0):  # refused, within the stated time: retried as today
            now[0] = t
            err = complete_error(client)
            assert type(err) is RetryableProviderError and err.kind is ErrorKind.connection
        now[0] = 31.0
        err = complete_error(client)
        assert isinstance(err, EndpointUnreachable), err
        assert "http://mock.invalid/v1" in str(err) and "31 s" in str(err), str(err)
        decision = decide(err, streak=1, settings=settings, rand=0.0)
        assert decision.action is Action.pause and decision.pause_code is PauseCode.unreachable
        assert not decision.count_attempt
        # One reply, and the count starts again: a refusal later is an ordinary retry.
        answering[0] = True
        client.complete(MESSAGES)
        answering[0] = False
        now[0] = 100.0
        assert type(complete_error(client)) is RetryableProviderError
    finally:
        client.close()
