"""The review endpoints: a chapter's questions with their verdict, source, levels and review
state, and approve, reject and edit (storage/review.py).

Every action names the version of the question it was made from, as `If-Match: "N"` (the
`ETag` a read gave) or `"version": N` in the body. A version that is no longer current is
`409` with the current `version` and `question` in the problem document: nothing changed,
never a silent overwrite. No version at all is `428`. A bulk approve (`POST /exams/SLUG/review/approve`)
names each question's version too, and answers each one as its own approve would: approved,
or 409 with its current version, never approved over a newer edit. Who acted is the API
client: its bearer token's name (for a token of API_TOKENS, a hash of it:
`producer.api.runs.client_of`), never the token itself.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from examforge.errors import InfrastructureError
from examforge.neardup import Checker, Scope
from examforge.syllabus import NAME_PATTERN
from producer.api import schemas
from producer.api.problems import problem, responses
from producer.access import Role
from producer.api.auth import caller, requires
from producer.views import review_dict, when
from storage.review import FILTERS

router = APIRouter(tags=["review"])
log = logging.getLogger("examforge.api")

Slug = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64,
                           description="The exam's slug ([a-z0-9-], up to 64)")]
ChapterId = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64,
                                description="The chapter's id ([a-z0-9-], up to 64)")]
QuestionId = Annotated[int, Path(ge=1, le=schemas.MAX_ID, description="The question's id")]
IfMatch = Annotated[str | None, Header(
    alias="If-Match", max_length=64,
    description='The version the change was made from: the ETag a read gave ("3"); or '
                "`version` in the body")]
# The version a change was made from, as its ETag: "3" (a weak W/"3", and a bare 3, read the
# same way), 1 up to 15 digits (below schemas.MAX_ID). The document states this pattern.
IF_MATCH_PATTERN = r'^(?:W/)?"?([1-9][0-9]{0,14})"?$'
IF_MATCH_RE = re.compile(IF_MATCH_PATTERN)
_ETAG = {"ETag": {"description": 'The question\'s version, quoted ("3")',
                  "schema": {"type": "string"}}}


_NO_COUNTS = dict.fromkeys(FILTERS, 0)  # a chapter with no question yet


def _ctx(request: Request) -> Any:
    return request.app.state.ctx


Ctx = Annotated[Any, Depends(_ctx)]


def question_out(q: dict[str, Any]) -> dict[str, Any]:
    """A review question as the API shows it: times in ISO 8601."""
    return {**q, "created_at": when(q["created_at"]), "reviewed_at": when(q["reviewed_at"])}


def _answer(q: dict[str, Any]) -> JSONResponse:
    return JSONResponse(question_out(q), headers={"ETag": f'"{q["version"]}"'})


def _version(if_match: str | None, body_version: int | None) -> int | JSONResponse:
    """The version a change names, or the problem to answer."""
    header: int | None = None
    if if_match is not None:
        match = IF_MATCH_RE.fullmatch(if_match.strip())
        if match is None:
            return problem(400, f'If-Match: {if_match[:64]!r} is not a version this API '
                                'gave (its ETag, e.g. "3")')
        header = int(match.group(1))
    if header is not None and body_version is not None and header != body_version:
        return problem(400, f"If-Match says version {header} and the body {body_version}: "
                            "give one version")
    version = header if header is not None else body_version
    if version is None:
        return problem(428, "say which version of the question you changed: If-Match with "
                            "its ETag, or `version` in the body (a read gives it)")
    return version


def _client(request: Request, c: Any) -> str:
    """Who acts, as the history names them: the token's name."""
    return caller(request).name


@router.get("/exams/{slug}/review", response_model=schemas.ReviewSummary,
            responses=responses(401, 404, 422))
@requires(Role.reader)
def review_summary(slug: Slug, c: Ctx) -> Any:
    """Each chapter's questions by review state (`review SLUG --json`): in the bank (up to
    the chapter's target), unreviewed, approved, rejected, and disputed by the blind solve
    (null when this database has no verdicts); and `filters`, what each filter of the
    chapter's questions shows, per chapter and in all."""
    return review_dict(c.store, slug)


FilterName = Literal["disputed", "unreviewed", "edited", "stale", "approved", "rejected"]
assert get_args(FilterName) == FILTERS  # the store's filters, spelled out for the spec
Filter = Annotated[FilterName | None, Query(
    alias="filter", description="Only the questions this filter shows: disputed, unreviewed, "
                                "edited, stale or approved (of the bank), or rejected; "
                                "none: every question")]


@router.get("/exams/{slug}/chapters/{chapter_id}/questions",
            response_model=schemas.ReviewChapter, responses=responses(401, 404, 422))
@requires(Role.reader)
def chapter_questions(slug: Slug, chapter_id: ChapterId, c: Ctx, only: Filter = None) -> Any:
    """The chapter's questions for review, by number, each with its verdict, source, levels,
    review state and version; then those withdrawn (rejected, or disputed under
    VERIFY=replace: out of the bank, kept for the record by the number they had). With
    `filter`, only those it shows; `counts` gives every filter's count either way."""
    title, items = c.store.chapter_questions(slug, chapter_id, only)
    counts = c.store.filter_counts(slug, chapter_id).get(chapter_id, _NO_COUNTS)
    return {"exam": slug, "chapter_id": chapter_id, "title": title, "filter": only,
            "counts": counts, "items": [question_out(q) for q in items]}


@router.get("/exams/{slug}/questions/{question_id}", response_model=schemas.ReviewQuestion,
            responses={**responses(401, 404, 422), 200: {"description": "The question",
                                                         "headers": _ETAG}})
@requires(Role.reader)
def get_question(slug: Slug, question_id: QuestionId, c: Ctx) -> Any:
    """One question with its review state; its `ETag` is its version."""
    return _answer(c.store.review_question(slug, question_id))


@router.get("/exams/{slug}/questions/{question_id}/history",
            response_model=schemas.ReviewHistory, responses=responses(401, 404, 422))
@requires(Role.reader)
def question_history(slug: Slug, question_id: QuestionId, c: Ctx) -> Any:
    """Every review action on the question, oldest first: who (the token's name), when, the
    version it made, and for an edit each field it changed, before and after (the first
    edit's `before` is the text as generated)."""
    items = [{**h, "at": when(h["at"])} for h in c.store.question_history(slug, question_id)]
    return {"items": items}


_ACTION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **responses(400, 401, 404, 409, 413, 422, 428),
    200: {"description": "The question as it is now", "headers": _ETAG}}


@router.post("/exams/{slug}/questions/{question_id}/approve",
             response_model=schemas.ReviewQuestion, responses=_ACTION_RESPONSES)
@requires(Role.reviewer)
def approve(slug: Slug, question_id: QuestionId, request: Request, c: Ctx,
            if_match: IfMatch = None,
            body: Annotated[schemas.ReviewAction | None, Body()] = None) -> Any:
    """Approve the question as it is at the version named: `export --approved-only` (and
    `?approved_only=true`) write it. 409 when it changed since."""
    version = _version(if_match, body.version if body else None)
    if isinstance(version, JSONResponse):
        return version
    return _answer(c.store.approve(slug, question_id, version, _client(request, c)))


@router.post("/exams/{slug}/questions/{question_id}/reject",
             response_model=schemas.ReviewQuestion, responses=_ACTION_RESPONSES)
@requires(Role.reviewer)
def reject(slug: Slug, question_id: QuestionId, request: Request, c: Ctx,
           if_match: IfMatch = None,
           body: Annotated[schemas.ReviewAction | None, Body()] = None) -> Any:
    """Reject the question as it is at the version named, with an optional `note`: it leaves
    its chapter's bank (never exported) and the next run or `enqueue` generates its number
    again, paid once. Final: a rejected question cannot be approved or edited."""
    version = _version(if_match, body.version if body else None)
    if isinstance(version, JSONResponse):
        return version
    answer = c.store.reject(slug, question_id, version, _client(request, c),
                            note=body.note if body else None)
    _hand_on_reopened(c, slug)
    return _answer(answer)


@router.post("/exams/{slug}/review/approve", response_model=schemas.BulkApproveOut,
             responses=responses(400, 401, 404, 413, 422))
@requires(Role.reviewer)
def approve_many(slug: Slug, request: Request, c: Ctx,
                 body: Annotated[schemas.BulkApprove, Body()]) -> Any:
    """Approve many questions in one request (the page's "approve all shown"), each at the
    version it was read at, as its own `approve` would: `items` answers each one, in the
    order sent, with `status` 200 (approved), 409 (it changed since that version, or left
    the bank: not approved, with its current `version` and `question`) or 404. Nothing is
    ever approved over a newer edit; the others are approved all the same."""
    seen: set[int] = set()
    for item in body.items:
        if item.id in seen:
            return problem(400, f"question {item.id} is named twice: name each question once")
        seen.add(item.id)
    done = c.store.approve_many(slug, [(item.id, item.version) for item in body.items],
                                _client(request, c))
    items = [_approval_out(a) for a in done]
    return {"items": items, "approved": sum(1 for a in done if a.status == 200)}


def _approval_out(a: Any) -> dict[str, Any]:
    q = a.question
    result = {200: "approved", 404: "not_found"}.get(a.status, "conflict")
    return {"id": a.id, "status": a.status, "result": result,
            "version": q["version"] if q else None, "detail": a.detail,
            "question": question_out(q) if q else None}


def _hand_on_reopened(c: Any, slug: str) -> None:
    """A rejection (or an edit that voided a verdict) during an open run: the slice it
    reopened is handed on (published, or given to this process's run in --local), so the
    run generates the number (or solves the question again) and ends.
    Without an open run the next run or `enqueue` generates it. A failure is the
    reconciler's (or the --local sweep's) to repair: the rejection is committed."""
    refs = [(chapter_id, slice_no) for _, chapter_id, slice_no in c.store.unqueued_slices(slug)]
    if not refs:
        return
    try:
        c.work.resume(slug, refs)
    except InfrastructureError as exc:
        log.warning("reopened slices not handed on: %s (the reconciler will)", exc,
                    extra={"exam": slug})


@router.patch("/exams/{slug}/questions/{question_id}", response_model=schemas.ReviewQuestion,
              responses=_ACTION_RESPONSES)
@requires(Role.reviewer)
def edit(slug: Slug, question_id: QuestionId, request: Request, c: Ctx,
         body: Annotated[schemas.ReviewEdit, Body()], if_match: IfMatch = None) -> Any:
    """Edit the question as it is at the version named: the fields given (`question`,
    `choices`, `answer_index`, `explanation`, `difficulty`, `bloom`) replace the stored ones,
    validated as a generated question is; the history keeps each one's value before. An
    approved question edited is unreviewed again. 409 when it changed since, and when its
    new text is one the bank has, exactly or nearly (`duplicate_of` names that question). A
    changed text, choice or key makes its verdict `pending`: it is solved again."""
    version = _version(if_match, body.version)
    if isinstance(version, JSONResponse):
        return version
    changes = {name: getattr(body, name) for name in body.model_fields_set
               if name != "version"}
    scope = c.settings.near_dup_scope
    checker = None if scope == "off" else Checker(c.settings.near_dup_threshold, Scope(scope))
    answer = c.store.edit(slug, question_id, version, _client(request, c), changes,
                          near_dup=checker)
    if answer["verdict"] == "pending":  # to be solved again: during a run, by the run
        _hand_on_reopened(c, slug)
    return _answer(answer)
