"""OpenAI's Files and Batch API, as runner.batching uses it: upload a JSONL file, create a
batch with metadata, retrieve it, list batches newest first, cancel it, download and delete a
file.

The same endpoint, key and error table as the chat client (LLM_BASE_URL, LLM_API_KEY,
examforge.classify): any provider or gateway with OpenAI's Batch API works by configuration
alone. One request per method and no retries of its own: the caller's protocol decides what
may be repeated (a create never is without a listing in between; see runner.batching).
Every failure is a ProviderError; `sent_maybe` tells the caller whether a failed request may
still have reached the provider (a timeout, a reset, a 5xx) or surely did not (a 4xx reply).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterator

import httpx

from examforge.classify import classify
from examforge.errors import ErrorKind, PermanentProviderError, ProviderError, RetryableProviderError
from examforge.settings import Settings

BATCH_ENDPOINT = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"
LIST_LIMIT = 100  # OpenAI's largest page of GET /v1/batches
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchAPI:
    """A small synchronous client; thread-safe like httpx.Client."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        secret = settings.llm_api_key.get_secret_value()
        self._secret = secret
        self.base_url = settings.llm_base_url.rstrip("/") + "/"
        self._http = httpx.Client(
            base_url=self.base_url, transport=transport,
            timeout=httpx.Timeout(settings.batch_http_timeout_s,
                                  connect=settings.llm_connect_timeout_s),
            headers={"Authorization": f"Bearer {secret}"} if secret else {})

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ the API
    def upload(self, filename: str, content: bytes) -> str:
        """POST /files with purpose "batch"; the file's id."""
        data = self._request("POST", "files", data={"purpose": "batch"},
                             files={"file": (filename, content, "application/jsonl")})
        return str(data["id"])

    def create(self, input_file_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        """POST /batches for chat completions in the 24 h window."""
        return self._request("POST", "batches", json={
            "input_file_id": input_file_id, "endpoint": BATCH_ENDPOINT,
            "completion_window": COMPLETION_WINDOW, "metadata": metadata})

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._request("GET", f"batches/{batch_id}")

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._request("POST", f"batches/{batch_id}/cancel")

    def page(self, after: str | None = None, limit: int = LIST_LIMIT) -> dict[str, Any]:
        """One page of GET /batches, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return self._request("GET", "batches", params=params)

    def batches_since(self, since: float) -> Iterator[dict[str, Any]]:
        """Every batch created at or after `since` (epoch seconds), newest first, paging
        with `after` until a page reaches an older batch or the list ends. The list cannot
        be filtered by metadata: the caller matches it."""
        after: str | None = None
        while True:
            page = self.page(after)
            data = page.get("data") or []
            for batch in data:
                created = created_at(batch)
                if created is not None and created < since:
                    return
                yield batch  # a batch with no readable time may be ours: kept
            if not page.get("has_more") or not data:
                return
            after = str(page.get("last_id") or data[-1]["id"])

    def delete_file(self, file_id: str) -> bool:
        """DELETE /files/{id}. True when deleted now, False when the provider has no such
        file (deleted already, by an earlier recovery that stopped mid-way): either way it is
        gone, and a create naming it is refused. Any other failure raises."""
        try:
            self._request("DELETE", f"files/{file_id}")
        except ProviderError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True

    def content(self, file_id: str) -> bytes:
        """GET /files/{id}/content: a batch's output or error file."""
        response = self._send("GET", f"files/{file_id}/content")
        return response.content

    # ------------------------------------------------------------------ transport
    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._send(method, path, **kwargs)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            err = RetryableProviderError(f"{method} {path}: the reply is not a JSON object")
            err.kind = ErrorKind.unreadable
            raise err
        return data

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            err: ProviderError = RetryableProviderError(
                f"{method} {path}: connection error: {type(exc).__name__}")
            err.kind = ErrorKind.connection
            err.sent_maybe = False  # type: ignore[attr-defined]
            raise err from exc
        except httpx.TimeoutException as exc:
            err = RetryableProviderError(f"{method} {path}: timeout: {type(exc).__name__}")
            err.kind = ErrorKind.timeout
            raise err from exc
        except httpx.TransportError as exc:
            err = RetryableProviderError(f"{method} {path}: connection error: "
                                         f"{type(exc).__name__}")
            err.kind = ErrorKind.connection
            raise err from exc
        if response.status_code >= 400 or 300 <= response.status_code < 400:
            raise self._error(method, path, response)
        return response

    def _error(self, method: str, path: str, response: httpx.Response) -> ProviderError:
        from examforge.llm import _ERROR_CLASS  # the chat client's classes for each action

        status = response.status_code
        message = code = type_ = None
        try:
            body = response.json().get("error")
            if isinstance(body, dict):
                message, code, type_ = (str(body.get(k)) if body.get(k) is not None else None
                                        for k in ("message", "code", "type"))
        except (ValueError, AttributeError):
            pass
        if 300 <= status < 400:
            err: ProviderError = PermanentProviderError(
                f"{method} {path}: HTTP {status} redirect: check LLM_BASE_URL",
                status_code=status)
            err.kind = ErrorKind.redirect
        else:
            rule = classify(status, code, type_, message or "")
            cls = _ERROR_CLASS.get((rule.action, rule.kind)) or _ERROR_CLASS[(rule.action, None)]
            text = f"{method} {path}: HTTP {status}" + (f": {message}" if message else "")
            if self._secret:
                text = text.replace(self._secret, "***")
            err = cls(text[:300], status_code=status)
            err.kind = rule.kind
        # A 4xx reply says the request was refused: nothing was created.
        err.sent_maybe = status >= 500  # type: ignore[attr-defined]
        return err


def created_at(batch: dict[str, Any]) -> float | None:
    """A batch's creation time in epoch seconds: OpenAI's number, or the ISO 8601 text some
    providers and gateways give (Anthropic's shape); None when there is none to read."""
    value = batch.get("created_at")
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return float(value)
        except ValueError:
            pass
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
    return None


def sent_maybe(exc: BaseException) -> bool:
    """Whether a failed request may have reached the provider and done its work (a timeout, a
    reset, a 5xx), as opposed to refused (a 4xx) or never sent (connection refused)."""
    return bool(getattr(exc, "sent_maybe", True))


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
                   for line in lines).encode()


def parse_jsonl(content: bytes) -> list[dict[str, Any]]:
    """The lines of an output or error file; a line that is not a JSON object is skipped
    (its call is then missing, and classified so)."""
    lines = []
    for text in content.decode("utf-8", "replace").splitlines():
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            lines.append(obj)
    return lines
