"""Who calls, and whether they may: the token's `Principal`, the role each route needs, the
exam scope, and GET /me.

The bearer token is checked by the middleware (producer.api.middleware.BearerAuth, with
`Resolver`): no valid token is 401 before routing. What the token may do is checked here,
by `authorize`, one dependency on every route of the API: the route declares the role it
needs (`requires`; a route that declares none needs admin, so a new route is closed until
someone decides), and a route with an exam (`{slug}`, or a run's exam) is 404 to a token
that does not see that exam, as if it did not exist, before the role is even looked at.
Beyond the role is 403 (examforge.errors.Forbidden), a problem document naming the
role needed (`required_role`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeVar

from fastapi import APIRouter, Request

from examforge.errors import Forbidden, UnknownExam
from examforge.settings import Settings
from producer.access import (NO_AUTH, TOKEN_PREFIX, TOKEN_TOUCH_S, Principal, Role, same_hash,
                             token_hash)
from producer.api import schemas
from producer.api.middleware import bearer_token, token_ok
from producer.api.problems import api_routes, responses  # noqa: F401 (api_routes: auth.api_routes for its callers)

log = logging.getLogger("examforge.api")
F = TypeVar("F", bound=Callable[..., Any])
router = APIRouter(tags=["access"])


def _forbidden(needed: Role, principal: Principal, every_exam: bool = False) -> Forbidden:
    if every_exam:
        detail = (f"this covers every exam: it needs a {needed.value} token without an exam "
                  f"scope; token {principal.name} sees only "
                  f"{', '.join(sorted(principal.exams or ()))}")
    else:
        detail = (f"this needs the {needed.value} role; token {principal.name} is a "
                  f"{principal.role.value}")
    return Forbidden(detail, needed.value, every_exam)


def requires(role: Role, *, every_exam: bool = False) -> Callable[[F], F]:
    """Declare the role a route needs (`every_exam`: and a token without exam scope, for a
    route whose answer covers every exam, like /metrics)."""

    def mark(endpoint: F) -> F:
        endpoint.required_role = role  # type: ignore[attr-defined]
        endpoint.every_exam = every_exam  # type: ignore[attr-defined]
        return endpoint

    return mark


def public(endpoint: F) -> F:
    """A route that needs no token (the probe)."""
    endpoint.public = True  # type: ignore[attr-defined]
    return endpoint


def required_role(endpoint: Any) -> Role | None:
    """The role `endpoint` needs; None for a public one; admin when it declares none."""
    if getattr(endpoint, "public", False):
        return None
    return getattr(endpoint, "required_role", Role.admin)


class Resolver:
    """The caller a request's Authorization header names, or None. API_TOKENS first (in
    memory, compared in constant time, admin of every exam), then a named token, read from
    the database on every request so that a revocation holds at once on every replica."""

    def __init__(self, settings: Settings, store: Any) -> None:
        from producer.api.runs import client_of

        self.store = store
        self.flat = [(t, client_of(f"Bearer {t.decode()}", True))
                     for t in settings.api_token_list()]

    def flat_token(self, header: bytes | None) -> Principal | None:
        """A token of API_TOKENS: no I/O, so the middleware asks on the event loop (a hop
        to the thread pool would let a client that sends and leaves at once be seen gone
        before its request is read)."""
        found = None
        for token, name in self.flat:  # every one compared: the time says nothing of which
            if token_ok(header, [token]):
                found = Principal(name, Role.admin)
        return found

    def named_token(self, header: bytes | None) -> Principal | None:
        """A named token: read from the database (in the thread pool). A client that sends
        a request and leaves before the read ends has asked for nothing: its retry (the
        same Idempotency-Key) does what it asked."""
        given = bearer_token(header)
        if given is None or not given.startswith(TOKEN_PREFIX.encode()):
            return None  # not one of ours: no database read for it
        try:
            digest = token_hash(given.decode())
        except UnicodeDecodeError:
            return None
        row = self.store.live_token(digest)
        if row is None or not same_hash(row.token_hash, digest):
            return None
        if row.last_used_at is None or time.time() - row.last_used_at > TOKEN_TOUCH_S:
            self.store.touch_token(row.id, TOKEN_TOUCH_S)
        return Principal(row.name, Role(row.role),
                         None if row.exams is None else frozenset(row.exams), row.id)


def caller(request: Request) -> Principal:
    """The principal `authorize` found for this request."""
    principal = getattr(request.state, "principal", None)
    return principal if isinstance(principal, Principal) else NO_AUTH


def _exam_of(request: Request, ctx: Any) -> str | None:
    """The exam a request is about: its `{slug}`, or the exam of its `{run_id}`."""
    params = request.path_params
    if "slug" in params:
        return str(params["slug"])
    run_id = str(params.get("run_id", ""))
    if run_id.isdigit() and 1 <= int(run_id) <= 2**62:
        run = ctx.store.run(int(run_id))
        return None if run is None else str(run.exam)
    return None


def authorize(request: Request) -> None:
    """The dependency of every route of the API (see the module's docstring)."""
    ctx = request.app.state.ctx
    route = request.scope.get("route")
    needed = required_role(getattr(route, "endpoint", None))
    if needed is None:
        return
    principal = request.scope.get("state", {}).get("principal")
    if principal is None:
        if ctx.auth:  # the middleware lets no request through without one: a bug
            raise RuntimeError("no principal on an authenticated request")
        principal = NO_AUTH
    request.state.principal = principal
    # Only a scoped token needs the exam (a run's costs a read of the run).
    exam = _exam_of(request, ctx) if principal.exams is not None else None
    if exam is not None and not principal.sees(exam):
        # The same answer as for an exam that does not exist: a scope reveals nothing.
        if "run_id" in request.path_params and "slug" not in request.path_params:
            raise UnknownExam(f"no run {request.path_params['run_id']}")
        raise UnknownExam(f"unknown exam {exam!r}")
    if not principal.role.allows(needed):
        _audit_denied(request, ctx, principal, needed, exam)
        raise _forbidden(needed, principal)
    if getattr(getattr(route, "endpoint", None), "every_exam", False) and \
            principal.exams is not None:
        _audit_denied(request, ctx, principal, needed, exam)
        raise _forbidden(needed, principal, every_exam=True)


# Methods that change something: an attempt beyond the caller's role is audited. (A read
# refused is not: a page polling with a reader's token would fill the audit.)
_CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _audit_denied(request: Request, ctx: Any, principal: Principal, needed: Role,
                  exam: str | None) -> None:
    """An attempt to change something beyond the token's role, in the audit as `refused`
    (action `access.denied`): who tried what, and the role it needed."""
    if request.method not in _CHANGES:
        return
    route = request.scope.get("route")
    ctx.store.record_audit(principal.name, "access.denied",
                           exam or request.path_params.get("slug"),
                           {"method": request.method,
                            "route": getattr(route, "path", request.url.path),
                            "required_role": needed.value}, "refused")


@router.get("/me", response_model=schemas.Me, responses=responses(401))
@requires(Role.reader)
def me(request: Request) -> Any:
    """Who the token is: its name, role and the exams it may see (null: every exam). The
    page shows it, and offers only what the role allows."""
    return caller(request).as_dict()
