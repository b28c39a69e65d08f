"""LLM_FALLBACK_BASE_URL: a local server (Ollama) first, a cloud API while it is unreachable.

Only a connection that never opened falls back (nothing was delivered, nothing paid); every
answer from a primary that is up, errors included, goes to the caller's retry policy."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import httpx
import pytest

import ssl

from examforge.errors import AuthError, PermanentProviderError, RetryableProviderError
from examforge.llm import LLMClient
from fakellm import reply

PRIMARY, FALLBACK = "ollama.local", "cloud.example"
PRIMARY_KEY, FALLBACK_KEY = "sk-PRIMARY-1111", "sk-FALLBACK-2222"
MESSAGES = [{"role": "user", "content": "Number: 5"}]


class Hosts:
    """One MockTransport for both endpoints: each host behaves as its entry says."""

    def __init__(self) -> None:
        self.behaviour: dict[str, Callable[[httpx.Request], httpx.Response]] = {
            PRIMARY: lambda r: reply('{"questions": []}'),
            FALLBACK: lambda r: reply('{"questions": []}', prompt_tokens=1000,
                                      completion_tokens=500),
        }
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        return self.behaviour[request.url.host](request)

    def hosts(self) -> list[str]:
        return [r.url.host for r in self.seen]


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def no_answer_to_connect(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectTimeout("timed out", request=request)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hosts() -> Hosts:
    return Hosts()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(make_settings: Callable[..., Any], hosts: Hosts, clock: Clock) -> Iterator[LLMClient]:
    settings = make_settings(
        llm_base_url=f"http://{PRIMARY}:11434/v1", llm_api_key=PRIMARY_KEY, llm_model="llama3",
        llm_fallback_base_url=f"https://{FALLBACK}/v1", llm_fallback_api_key=FALLBACK_KEY,
        llm_fallback_model="gpt-4o-mini", llm_fallback_hold_s=60,
        llm_fallback_price_prompt_per_mtok=0.15, llm_fallback_price_completion_per_mtok=0.60)
    c = LLMClient(settings, transport=httpx.MockTransport(hosts), clock=clock)
    yield c
    c.close()


def test_the_primary_serves_while_it_is_up(client: LLMClient, hosts: Hosts) -> None:
    completion = client.complete(MESSAGES)
    assert hosts.hosts() == [PRIMARY] and not completion.fallback


@pytest.mark.parametrize("failure", [refused, no_answer_to_connect], ids=["refused", "connect-timeout"])
def test_an_unreachable_primary_sends_the_same_call_to_the_fallback(
        client: LLMClient, hosts: Hosts, failure: Callable[[httpx.Request], httpx.Response]
) -> None:
    hosts.behaviour[PRIMARY] = failure
    completion = client.complete(MESSAGES)
    assert hosts.hosts() == [PRIMARY, FALLBACK]
    assert completion.fallback and completion.prompt_tokens == 1000
    fallback_request = hosts.seen[1]
    assert fallback_request.headers["authorization"] == f"Bearer {FALLBACK_KEY}"
    assert b'"model":"gpt-4o-mini"' in fallback_request.content.replace(b" ", b"")
    # The primary's key is never sent to the other provider.
    assert PRIMARY_KEY not in str(fallback_request.headers)


def test_calls_stay_on_the_fallback_for_the_hold_then_try_the_primary_again(
        client: LLMClient, hosts: Hosts, clock: Clock) -> None:
    hosts.behaviour[PRIMARY] = refused
    client.complete(MESSAGES)
    clock.now += 59
    client.complete(MESSAGES)  # within the hold: no connect attempt to the primary
    assert hosts.hosts() == [PRIMARY, FALLBACK, FALLBACK]
    hosts.behaviour[PRIMARY] = lambda r: reply('{"questions": []}')
    clock.now += 2
    assert not client.complete(MESSAGES).fallback
    assert hosts.hosts()[-1] == PRIMARY


@pytest.mark.parametrize("answer", [
    lambda r: httpx.Response(429, headers={"retry-after": "3"}),
    lambda r: httpx.Response(503),
    lambda r: (_ for _ in ()).throw(httpx.ReadTimeout("slow", request=r)),
    lambda r: (_ for _ in ()).throw(httpx.RemoteProtocolError("reset mid-reply", request=r)),
], ids=["429", "503", "read-timeout", "reset-after-send"])
def test_a_primary_that_answered_or_was_sent_the_request_does_not_fall_back(
        client: LLMClient, hosts: Hosts, answer: Callable[[httpx.Request], httpx.Response]
) -> None:
    # It may have been paid, or it is up and saying "later": the retry policy decides.
    hosts.behaviour[PRIMARY] = answer
    with pytest.raises(RetryableProviderError):
        client.complete(MESSAGES)
    assert hosts.hosts() == [PRIMARY]


def test_both_unreachable_is_one_retryable_error(client: LLMClient, hosts: Hosts) -> None:
    hosts.behaviour[PRIMARY] = refused
    hosts.behaviour[FALLBACK] = no_answer_to_connect
    with pytest.raises(RetryableProviderError) as info:
        client.complete(MESSAGES)
    assert str(info.value) == "timeout: ConnectTimeout (primary and fallback)"
    assert isinstance(info.value.__cause__, httpx.ConnectTimeout)
    with pytest.raises(RetryableProviderError) as info:  # within the hold now
        client.complete(MESSAGES)
    assert str(info.value) == "timeout: ConnectTimeout (fallback; primary held off)"
    assert hosts.hosts() == [PRIMARY, FALLBACK, FALLBACK]


def test_the_fallbacks_rejected_key_is_an_auth_error_with_the_key_redacted(
        client: LLMClient, hosts: Hosts) -> None:
    hosts.behaviour[PRIMARY] = refused
    hosts.behaviour[FALLBACK] = lambda r: httpx.Response(
        401, json={"error": {"message": f"Incorrect API key provided: {FALLBACK_KEY}"}})
    with pytest.raises(AuthError) as info:
        client.complete(MESSAGES)
    assert FALLBACK_KEY not in str(info.value) and "***" in str(info.value)


def test_without_a_fallback_an_unreachable_primary_is_retryable(
        make_settings: Callable[..., Any], hosts: Hosts) -> None:
    hosts.behaviour[PRIMARY] = refused
    c = LLMClient(make_settings(llm_base_url=f"http://{PRIMARY}/v1"),
                  transport=httpx.MockTransport(hosts))
    with pytest.raises(RetryableProviderError, match="^connection error: ConnectError$"):
        c.complete(MESSAGES)
    assert hosts.hosts() == [PRIMARY]
    c.close()


def test_the_fallbacks_prices_apply_to_its_calls(make_settings: Callable[..., Any]) -> None:
    s = make_settings(llm_price_prompt_per_mtok=0, llm_price_completion_per_mtok=0,
                      llm_fallback_price_prompt_per_mtok=0.15,
                      llm_fallback_price_completion_per_mtok=0.60)
    assert s.cost_usd(1_000_000, 1_000_000) == 0
    assert s.cost_usd(1_000_000, 1_000_000, fallback=True) == pytest.approx(0.75)


def test_a_certificate_that_does_not_verify_is_permanent_and_does_not_fall_back(
        client: LLMClient, hosts: Hosts) -> None:
    def bad_certificate(request: httpx.Request) -> httpx.Response:
        # What httpcore raises: ConnectError, re-raised `from None`, over the ssl error.
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed")
        except ssl.SSLError:
            raise httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]", request=request) from None

    hosts.behaviour[PRIMARY] = bad_certificate
    with pytest.raises(PermanentProviderError, match=f"TLS certificate verification failed for {PRIMARY}"):
        client.complete(MESSAGES)
    assert hosts.hosts() == [PRIMARY]


def test_the_endpoint_repr_never_shows_a_key(client: LLMClient) -> None:
    text = repr(vars(client))
    assert PRIMARY_KEY not in text and FALLBACK_KEY not in text


def test_when_the_hold_ends_one_call_probes_the_primary_and_the_others_keep_to_the_fallback(
        client: LLMClient, hosts: Hosts, clock: Clock) -> None:
    hosts.behaviour[PRIMARY] = refused
    client.complete(MESSAGES)  # primary refused: held off for 60 s
    clock.now += 61
    during_probe: list[bool] = []

    def slow_refusal(request: httpx.Request) -> httpx.Response:
        # While this probe is still connecting, another thread's call arrives.
        during_probe.append(client.complete(MESSAGES).fallback)
        return refused(request)

    hosts.behaviour[PRIMARY] = slow_refusal
    assert client.complete(MESSAGES).fallback
    assert during_probe == [True]
    assert hosts.hosts() == [PRIMARY, FALLBACK, PRIMARY, FALLBACK, FALLBACK]
    clock.now += 59  # the failed probe started a new hold
    client.complete(MESSAGES)
    assert hosts.hosts()[-1] == FALLBACK


def test_errors_and_completions_say_which_endpoint_they_came_from(
        client: LLMClient, hosts: Hosts, clock: Clock) -> None:
    hosts.behaviour[PRIMARY] = lambda r: httpx.Response(503)
    with pytest.raises(RetryableProviderError) as info:
        client.complete(MESSAGES)
    assert info.value.endpoint == "primary"
    hosts.behaviour[PRIMARY] = refused
    hosts.behaviour[FALLBACK] = lambda r: httpx.Response(500)
    with pytest.raises(RetryableProviderError) as info:
        client.complete(MESSAGES)
    assert info.value.endpoint == "fallback"
    hosts.behaviour[FALLBACK] = no_answer_to_connect
    with pytest.raises(RetryableProviderError) as info:
        client.complete(MESSAGES)
    assert info.value.endpoint == "fallback"
    hosts.behaviour[FALLBACK] = lambda r: reply('{"questions": []}')
    assert client.complete(MESSAGES).endpoint == "fallback"
    clock.now += 3600
    hosts.behaviour[PRIMARY] = lambda r: reply('{"questions": []}')
    assert client.complete(MESSAGES).endpoint == "primary"
