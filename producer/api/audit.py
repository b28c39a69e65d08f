"""GET /audit: who did what that spends or changes access, newest first (admin only)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from examforge.syllabus import NAME_PATTERN
from producer.access import Role
from producer.api import schemas
from producer.api.auth import requires
from producer.api.problems import responses
from producer.audit import SINCE_PATTERN, audit_dict, since_epoch_s
from storage.access import AUDIT_CURSOR_PATTERN, AUDIT_PAGE

router = APIRouter(tags=["access"])


@router.get("/audit", response_model=schemas.AuditPage, responses=responses(401, 403, 422))
@requires(Role.admin)
def read_audit(request: Request,
               exam: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=64,
                                                 description="Only this exam's rows.")] = None,
               since: Annotated[str | None, Query(
                   pattern=SINCE_PATTERN, max_length=64,
                   description="Only rows since then: an ISO 8601 time in UTC or with its "
                               "offset (2026-12-01, 2026-12-01T09:00Z, "
                               "2026-12-01T09:00:00+01:00; no offset: UTC) or a duration "
                               "ago (30m, 12h, 7d).")] = None,
               limit: Annotated[int, Query(ge=1, le=1000,
                                           description="Rows on the page.")] = AUDIT_PAGE,
               after: Annotated[str | None, Query(
                   pattern=AUDIT_CURSOR_PATTERN, max_length=18,
                   description="The `next` of the page before (opaque: send it as it "
                               "came).")] = None
               ) -> Any:
    """Every run started, cancelled or resumed, budget set, syllabus or source put or
    deleted, and token added or revoked: who (a token's name, or cli:<user>), when, the
    exam, the details and the outcome. Newest first, a page at a time (`next`)."""
    store = request.app.state.ctx.store
    items, cursor = store.audit_page(exam=exam, since=since_epoch_s(since, store),
                                     limit=limit, after=after)
    return {"items": [audit_dict(r) for r in items], "next": cursor}
