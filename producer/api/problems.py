"""Every error as an RFC 9457 problem document (application/problem+json).

FastAPI's own errors (a validation error, a 404, a 405) and examforge's error tree are
translated here, in one place; anything unexpected is a 500 problem with no detail of the
code (it is logged with its traceback, never sent).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any, Iterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from examforge.errors import (
    BadCursor,
    BadEdit,
    BadImportLine,
    Conflict,
    DuplicateEdit,
    DatabaseCorrupt,
    ExamforgeError,
    Forbidden,
    IdempotencyKeyReused,
    InfrastructureError,
    RunNotLaunched,
    SyllabusError,
    UnknownChapter,
    UnknownExam,
    UnknownQuestion,
    VersionConflict,
)

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("examforge.api")


def problem(status: int, detail: str, headers: dict[str, str] | None = None,
            **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
            "detail": detail, **extra}
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def problem_bytes(status: int, detail: str) -> bytes:
    """The same document, for the ASGI middlewares that answer before the app."""
    return json.dumps({"type": "about:blank", "title": HTTPStatus(status).phrase,
                       "status": status, "detail": detail}).encode()


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(parts) or "request"


def allowed_methods(request: Request, router: APIRouter) -> list[str]:
    """The methods the API's routes (`router`'s) accept on the request's path: Starlette's
    405 names only those of the first route that matched the path (FastAPI makes one route
    per method), and the page's static files answer for every path not routed. Empty for a
    path no route of the API has. The router is passed in (by `install`), not imported: the
    routes import this module."""

    methods: set[str] = set()
    scope = {**request.scope, "method": "GET"}
    # Every route, those of the included routers too (review, /me, /audit): FastAPI keeps an
    # included router as one entry of `router.routes`, which is no Route.
    for route in api_routes(router):
        if route.methods:
            match, _ = route.matches({**scope, "path": request.url.path})
            if match is not Match.NONE:
                methods |= route.methods
    return sorted(methods)


def install(app: FastAPI, router: APIRouter) -> None:
    """Register the handlers that turn every error into a problem document; `router` holds
    the API's routes (a 405's Allow header names what they accept)."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        headers = dict(getattr(exc, "headers", None) or {})
        status = exc.status_code
        routed = allowed_methods(request, router) if status in (404, 405) and detail in (
            "Not Found", "Method Not Allowed") else []
        if status == 404 and routed and request.method not in routed:
            status = 405  # the page's files answered for a path the API routes otherwise
        if status == 404 and detail == "Not Found":
            detail = f"no such resource: {request.url.path}"
        if status == 405:
            allowed = routed or ["GET", "HEAD"]  # the page's own files
            headers["Allow"] = ", ".join(allowed)
            detail = f"{request.method} is not allowed on {request.url.path}: use " \
                     + " or ".join(allowed)
        return problem(status, detail, headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": _location(e.get("loc", ())), "msg": str(e.get("msg", ""))}
                  for e in exc.errors()]
        first = errors[0] if errors else {"loc": "request", "msg": "invalid"}
        status = 400 if first["loc"].startswith("header") else 422
        return problem(status, f"{first['loc']}: {first['msg']}", errors=errors)

    @app.exception_handler(ExamforgeError)
    async def _ours(request: Request, exc: ExamforgeError) -> JSONResponse:
        if isinstance(exc, (UnknownExam, UnknownChapter, UnknownQuestion)):
            return problem(404, str(exc))
        if isinstance(exc, Forbidden):
            extra: dict[str, Any] = {"required_scope": "every exam"} if exc.every_exam else {}
            return problem(403, str(exc), required_role=exc.required_role, **extra)
        if isinstance(exc, VersionConflict):
            # The current version and question, so that a client can show what changed.
            return problem(409, str(exc), headers={"ETag": f'"{exc.version}"'},
                           version=exc.version, question=_iso_times(exc.question))
        if isinstance(exc, (SyllabusError, IdempotencyKeyReused, BadCursor, BadImportLine,
                            BadEdit)):
            return problem(422, str(exc))
        if isinstance(exc, DuplicateEdit):
            return problem(409, str(exc), duplicate_of={"id": exc.other_id,
                                                        "number": exc.other_number})
        if isinstance(exc, Conflict):
            return problem(409, str(exc))
        if isinstance(exc, DatabaseCorrupt):
            # Not a bug of ours: one log line per request, no traceback; 503 so that a load
            # balancer takes this replica out, with a title that says why at a glance.
            log.error("%s %s: %s", request.method, request.url.path, exc)
            return problem(503, str(exc), title="Database damaged")
        if isinstance(exc, RunNotLaunched):
            return problem(503, str(exc), run_id=exc.run_id)
        if isinstance(exc, InfrastructureError):
            return problem(503, str(exc))
        return problem(400, str(exc))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", extra={"path": request.url.path})
        return problem(500, "internal error: the server's log has the details")


def _iso_times(question: dict[str, Any]) -> dict[str, Any]:
    from producer.views import when

    return {**question, **{k: when(question.get(k)) for k in ("created_at", "reviewed_at")}}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for problem documents with these status codes."""
    return {code: {"description": HTTPStatus(code).phrase,
                   "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
            for code in codes}


def api_routes(router: Any) -> Iterator[APIRoute]:
    """Every APIRoute of `router` (an app or a router), those of included routers too:
    FastAPI keeps an included router as one entry of `routes` (`original_router`), not as
    its routes."""
    for route in getattr(router, "routes", ()):
        if isinstance(route, APIRoute):
            yield route
        elif getattr(route, "original_router", None) is not None:
            yield from api_routes(route.original_router)
