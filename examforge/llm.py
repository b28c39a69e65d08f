"""The provider client: one OpenAI-compatible chat-completions call, no retries of its own.

Every httpx and HTTP failure is translated into the error vocabulary of `examforge.errors` here
and nowhere else. Retries are decided by the caller (the Celery task), so no SDK-level retry
multiplies paid attempts. The transport is injectable: unit tests pass `httpx.MockTransport`.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from examforge.backoff import parse_retry_after
from examforge.errors import (
    AuthError,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
)
from examforge.settings import Settings

RETRYABLE_STATUS = {408, 409, 425, 429}


@dataclass(frozen=True)
class Completion:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    model: str


class LLMClient:
    """A thread-safe client for many concurrent calls (one connection pool per process)."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        self._settings = settings
        self._http = httpx.Client(
            base_url=settings.llm_base_url.rstrip("/") + "/",
            transport=transport,
            timeout=httpx.Timeout(
                settings.llm_timeout_s, connect=settings.llm_connect_timeout_s
            ),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
            headers={"Authorization": f"Bearer {settings.llm_api_key.get_secret_value()}"},
        )

    def close(self) -> None:
        self._http.close()

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        """One paid call. Raises a ProviderError subclass on any failure."""
        body: dict[str, object] = {
            "model": self._settings.llm_model,
            "messages": messages,
            "temperature": self._settings.llm_temperature,
        }
        if self._settings.llm_json_mode:
            body["response_format"] = {"type": "json_object"}
        try:
            response = self._http.post("chat/completions", json=body)
        except httpx.TimeoutException as exc:
            raise RetryableProviderError(f"timeout: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise RetryableProviderError(f"connection error: {type(exc).__name__}") from exc
        except httpx.RequestError as exc:  # e.g. DecodingError: a corrupt compressed body
            raise RetryableProviderError(f"unreadable reply: {type(exc).__name__}") from exc
        return _translate(response, self._settings.llm_api_key.get_secret_value())


def _redact(text: str, secret: str) -> str:
    """Providers echo the key they rejected ("Incorrect API key provided: sk-..."): drop it."""
    return text.replace(secret, "***") if secret else text


def _error_text(response: httpx.Response, secret: str) -> str:
    try:
        err = response.json().get("error")
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


def _translate(response: httpx.Response, secret: str) -> Completion:
    status = response.status_code
    if status in (401, 403):
        raise AuthError(_error_text(response, secret), status_code=status)
    if status in RETRYABLE_STATUS or status >= 500:
        raise RetryableProviderError(
            _error_text(response, secret),
            status_code=status,
            retry_after_s=parse_retry_after(response.headers.get("retry-after")),
        )
    if status >= 400:
        raise PermanentProviderError(_error_text(response, secret), status_code=status)
    if status >= 300:
        # httpx does not follow redirects here on purpose: a POST redirected is a wrong
        # LLM_BASE_URL (http vs https, a missing /v1), which no retry can fix.
        raise PermanentProviderError(
            f"HTTP {status} redirect to {response.headers.get('location', '?')[:200]}: "
            "check LLM_BASE_URL", status_code=status)
    try:
        data = response.json()
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
        model=str(data.get("model") or ""),
    )


__all__ = ["Completion", "LLMClient", "ProviderError"]
