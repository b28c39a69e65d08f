"""The provider client: one OpenAI-compatible chat-completions call, no retries of its own.

Every httpx and HTTP failure is translated into the error vocabulary of `examforge.errors` here
and nowhere else. Retries are decided by the caller (the Celery task), so no SDK-level retry
multiplies paid attempts. The transport is injectable: unit tests pass `httpx.MockTransport`.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx
from pydantic import SecretStr

from examforge.backoff import parse_retry_after
from examforge.deadline import DeadlineTransport, deadline
from examforge.errors import (
    AuthError,
    DeadlineExceeded,
    PermanentProviderError,
    ProviderError,
    ReplyTooLarge,
    RetryableProviderError,
)
from examforge.settings import Settings
from examforge.tokens import count_messages

RETRYABLE_STATUS = {408, 409, 425, 429}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    model: str
    fallback: bool = False  # served by LLM_FALLBACK_BASE_URL (priced with its rates)

    @property
    def endpoint(self) -> str:
        return "fallback" if self.fallback else "primary"


@dataclass(frozen=True)
class _Endpoint:
    http: httpx.Client
    model: str
    secret: str = field(repr=False)  # never in a repr, a traceback's locals or a log
    fallback: bool = False

    @property
    def name(self) -> str:
        return "fallback" if self.fallback else "primary"


class _Unreachable(Exception):
    """The request never reached the endpoint (connect refused or timed out): nothing was paid,
    so the same call may go to the fallback."""


class LLMClient:
    """A thread-safe client for many concurrent calls (one connection pool per endpoint).

    With LLM_FALLBACK_BASE_URL set, a call whose connection to the primary fails (refused, a
    name that does not resolve, or no connection within LLM_CONNECT_TIMEOUT_S) goes to the
    fallback at once, and so does every call for the next LLM_FALLBACK_HOLD_S. Only connection
    failures fall back: the request was never delivered, so nothing can have been paid twice.
    A 429, a 5xx or a read timeout came from a primary that is up, and goes to the caller's
    retry policy as usual; a TLS certificate that does not verify is a permanent error.
    """

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._primary = self._endpoint(settings.llm_base_url, settings.llm_api_key,
                                       settings.llm_model, transport, fallback=False)
        self._fallback = None
        if settings.llm_fallback_base_url:
            self._fallback = self._endpoint(
                settings.llm_fallback_base_url, settings.llm_fallback_api_key,
                settings.llm_fallback_model or settings.llm_model, transport, fallback=True)
        self._primary_down_until = float("-inf")  # -inf: the primary is not known to be down
        self._lock = threading.Lock()

    def _endpoint(self, base_url: str, key: SecretStr, model: str,
                  transport: httpx.BaseTransport | None, *, fallback: bool) -> _Endpoint:
        secret = key.get_secret_value()
        http = httpx.Client(
            base_url=base_url.rstrip("/") + "/",
            # Every socket operation is also bounded by the call's total deadline (_post_once).
            transport=transport or DeadlineTransport(limits=httpx.Limits(
                max_connections=512, max_keepalive_connections=128)),
            timeout=httpx.Timeout(
                self._settings.llm_timeout_s, connect=self._settings.llm_connect_timeout_s
            ),
            headers={"Authorization": f"Bearer {secret}"} if secret else {},
        )
        return _Endpoint(http, model, secret, fallback)

    def close(self) -> None:
        self._primary.http.close()
        if self._fallback:
            self._fallback.http.close()

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        """One paid call. Raises a ProviderError subclass on any failure."""
        fallback = self._fallback
        skipped = not self._may_try_primary()
        if not skipped:
            try:
                completion = self._post(self._primary, messages)
            except _Unreachable as exc:
                if fallback is None:
                    raise _at(RetryableProviderError(str(exc)), self._primary) from exc.__cause__
                with self._lock:
                    self._primary_down_until = self._clock() + self._settings.llm_fallback_hold_s
                log.warning("primary model endpoint unreachable; using the fallback",
                            extra={"error": str(exc),
                                   "hold_s": self._settings.llm_fallback_hold_s})
            else:
                if fallback is not None:
                    with self._lock:
                        self._primary_down_until = float("-inf")  # it is back
                return completion
        assert fallback is not None  # reached only when the primary was skipped or unreachable
        try:
            return self._post(fallback, messages)
        except _Unreachable as exc:
            where = "fallback; primary held off" if skipped else "primary and fallback"
            raise _at(RetryableProviderError(f"{exc} ({where})"), fallback) from exc.__cause__

    def _may_try_primary(self) -> bool:
        """False while the primary is held off. When a hold ends, one call probes the primary
        and the others keep using the fallback until the probe has had its connect timeout:
        32 threads do not all stall on a primary that is still down."""
        if self._fallback is None:
            return True
        with self._lock:
            now = self._clock()
            if now < self._primary_down_until:
                return False
            if self._primary_down_until != float("-inf"):  # was down: this call is the probe
                self._primary_down_until = now + self._settings.llm_connect_timeout_s + 1
            return True

    def _post(self, ep: _Endpoint, messages: list[dict[str, str]]) -> Completion:
        try:
            return self._post_once(ep, messages)
        except ProviderError as exc:
            raise _at(exc, ep)

    def _post_once(self, ep: _Endpoint, messages: list[dict[str, str]]) -> Completion:
        body: dict[str, object] = {
            "model": ep.model,
            "messages": messages,
            "temperature": self._settings.llm_temperature,
        }
        if self._settings.llm_json_mode:
            body["response_format"] = {"type": "json_object"}
        cap = self._settings.llm_max_reply_bytes
        try:
            with deadline(self._settings.llm_timeout_s), \
                    ep.http.stream("POST", "chat/completions", json=body) as response:
                raw = _read_capped(response, cap)
        except httpx.ConnectTimeout as exc:
            raise _Unreachable(f"timeout: {type(exc).__name__}") from exc
        except httpx.ConnectError as exc:
            if _caused_by(exc, ssl.SSLCertVerificationError):
                # A certificate that does not verify is a configuration problem: no retry
                # fixes it, and it must not quietly send the traffic to the fallback.
                raise PermanentProviderError(
                    f"TLS certificate verification failed for {ep.http.base_url.host}") from exc
            # Refused, unreachable, or a name that does not resolve (in a compose network a
            # service's name exists only while it runs): the request was never sent.
            raise _Unreachable(f"connection error: {type(exc).__name__}") from exc
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ReadTimeout):
                # Sent and not answered in full within the deadline (a read is never given
                # more than what is left of it): the provider may well bill it.
                err: ProviderError = DeadlineExceeded(
                    f"deadline: no complete reply within LLM_TIMEOUT_S="
                    f"{self._settings.llm_timeout_s:g}s ({type(exc).__name__})")
                err.prompt_tokens_estimate = count_messages(messages, ep.model)
                raise err from exc
            raise RetryableProviderError(f"timeout: {type(exc).__name__}") from exc
        except _TooLarge as exc:
            err = ReplyTooLarge(f"reply_too_large: {exc} (LLM_MAX_REPLY_BYTES={cap})")
            err.prompt_tokens_estimate = count_messages(messages, ep.model)
            raise err from None
        except httpx.TransportError as exc:
            raise RetryableProviderError(f"connection error: {type(exc).__name__}") from exc
        except httpx.RequestError as exc:  # e.g. DecodingError: a corrupt compressed body
            raise RetryableProviderError(f"unreadable reply: {type(exc).__name__}") from exc
        return _translate(response, raw, ep)


class _TooLarge(Exception):
    pass


def _read_capped(response: httpx.Response, cap: int) -> bytes:
    """The whole body, refused as soon as it passes `cap` bytes (decompressed, so a small
    gzip bomb is caught too); a declared Content-Length over the cap is refused unread."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _TooLarge(f"Content-Length {declared} bytes")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > cap:
            raise _TooLarge(f"more than {cap} bytes")
    return bytes(body)


def _at(exc: ProviderError, ep: _Endpoint) -> ProviderError:
    """Say which endpoint an error came from (the ledger books failed calls by endpoint too)."""
    exc.endpoint = ep.name
    return exc


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `kind` is anywhere in the chain (httpcore re-raises with `from None`, so the
    original error sits on __context__)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, kind):
            return True
        seen.add(id(e))
        stack += [e.__cause__, e.__context__]
    return False


def _redact(text: str, secret: str) -> str:
    """Providers echo the key they rejected ("Incorrect API key provided: sk-..."): drop it."""
    return text.replace(secret, "***") if secret else text


def _error_text(response: httpx.Response, raw: bytes, secret: str) -> str:
    try:
        err = json.loads(raw).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError, RecursionError):
        message = None
    text = f"HTTP {response.status_code}" + (f": {str(message)}" if message else "")
    return _redact(text, secret)[:220]


def _usage(data: dict[str, object]) -> tuple[int, int]:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    def _int(v: object) -> int:
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
    return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))


def _translate(response: httpx.Response, raw: bytes, ep: _Endpoint) -> Completion:
    status, secret = response.status_code, ep.secret
    if status in (401, 403):
        raise AuthError(_error_text(response, raw, secret), status_code=status)
    if status in RETRYABLE_STATUS or status >= 500:
        raise RetryableProviderError(
            _error_text(response, raw, secret),
            status_code=status,
            retry_after_s=parse_retry_after(response.headers.get("retry-after")),
        )
    if status >= 400:
        raise PermanentProviderError(_error_text(response, raw, secret), status_code=status)
    if status >= 300:
        # httpx does not follow redirects here on purpose: a POST redirected is a wrong
        # LLM_BASE_URL (http vs https, a missing /v1), which no retry can fix.
        raise PermanentProviderError(
            f"HTTP {status} redirect to {response.headers.get('location', '?')[:200]}: "
            "check LLM_BASE_URL", status_code=status)
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        content, finish_reason = message.get("content"), choice.get("finish_reason")
        if not isinstance(content, (str, type(None))):
            raise TypeError(f"message content is {type(content).__name__}, not a string")
        if not isinstance(finish_reason, (str, type(None))):
            raise TypeError(f"finish_reason is {type(finish_reason).__name__}, not a string")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        # A 200 whose envelope is broken is a provider fault (often a proxy), not model output.
        raise RetryableProviderError(
            _redact(f"unreadable reply envelope: {exc!r}", secret)[:200]
        ) from exc
    prompt_tokens, completion_tokens = _usage(data)
    return Completion(
        content=content,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        model=str(data.get("model") or ep.model),
        fallback=ep.fallback,
    )


__all__ = ["Completion", "LLMClient", "ProviderError"]
