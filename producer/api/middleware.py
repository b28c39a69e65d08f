"""The two checks made before a request reaches the app: the bearer token and the body size.

Both are plain ASGI middleware, outside FastAPI's routing, so that a request with a wrong
token learns nothing (not whether its path exists, nor what its body's error would be), and
an oversized body is refused before anything parses it.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

from starlette.concurrency import run_in_threadpool

from producer.api.problems import PROBLEM_JSON, problem_bytes

log = logging.getLogger("examforge.api")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1_000_000  # the 1 MB; a syllabus file has the same cap
# Public without a token: the page (it asks for the token), the probe, the spec.
PUBLIC_PATHS = frozenset({"/", "/index.html", "/healthz", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect"})


async def _answer(send: Send, status: int, detail: str,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = problem_bytes(status, detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", PROBLEM_JSON.encode()),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def bearer_token(header: bytes | None) -> bytes | None:
    """The token of `Authorization: Bearer <token>`, or None."""
    if not header:
        return None
    scheme, _, given = header.partition(b" ")
    if scheme.lower() != b"bearer" or not given.strip():
        return None
    return given.strip()


def token_ok(header: bytes | None, tokens: list[bytes]) -> bool:
    """Whether `Authorization: Bearer <token>` names one of `tokens`. Every token is
    compared, in constant time each, so the time taken says nothing of which nearly
    matched."""
    given = bearer_token(header)
    if given is None or not tokens:
        return False
    found = False
    for token in tokens:
        found |= hmac.compare_digest(given, token)
    return found


class BearerAuth:
    """401 for every request without a valid token, except the public paths and the
    page's static files. `resolver` (producer.api.auth.Resolver) names the caller of a
    header, or None: `flat_token` from memory, `named_token` from the database (so in the
    thread pool). The caller is handed on in the request's state (`principal`), for the
    routes' `authorize`."""

    def __init__(self, app: ASGIApp, resolver: Any, static_dir: Path) -> None:
        self.app, self.resolver, self.static_dir = app, resolver, static_dir.resolve()

    def _public(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if path in PUBLIC_PATHS:
            # Any method: the app answers what is not GET or HEAD with 405 and Allow, as on
            # every path (a 401 would say a token could make DELETE /healthz work).
            return True
        if scope.get("method") not in ("GET", "HEAD"):
            return False
        target = (self.static_dir / path.lstrip("/")).resolve()
        return target.is_relative_to(self.static_dir) and target.is_file()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._public(scope):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization")
        try:
            principal = self.resolver.flat_token(header) or await run_in_threadpool(
                self.resolver.named_token, header)
        except Exception as exc:  # the database did not answer: no way to check the token
            log.error("token check failed: %s", type(exc).__name__)
            await _answer(send, 503, "the token cannot be checked now: the database did not "
                                     "answer")
            return
        if principal is not None:
            scope["state"] = {**(scope.get("state") or {}), "principal": principal}
            await self.app(scope, receive, send)
            return
        await _answer(send, 401, "a valid bearer token is required",
                      [(b"www-authenticate", b'Bearer realm="examforge"')])


class BodyLimit:
    """413 for a body over `limit` bytes: at once when Content-Length says so, and while
    reading a body sent without one (chunked). The body is read here, up to the limit, and
    handed on whole: nothing in the app ever sees a part of an oversized body."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await _answer(send, 400, "Content-Length is not a number")
                return
            if int(length) > self.limit:
                await _answer(send, 413, f"request body over {self.limit} bytes")
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing was asked of the app
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _answer(send, 413, f"request body over {self.limit} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)
