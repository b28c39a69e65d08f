"""The endpoints. Handlers are plain `def`s: FastAPI runs them in its thread pool, and a
client that goes away does not interrupt one (the database is synchronous, like the CLI's)."""

from __future__ import annotations

import json
import logging
import queue
import tempfile
import threading
from typing import IO, Annotated, Any, Iterator

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import DBAPIError

from examforge.banks import BankChapter, BankExam, write_bank
from examforge.errors import (Conflict, ExamforgeError, ExportInterrupted, NothingApproved,
                              UnknownExam)
from examforge.syllabus import NAME_PATTERN, Syllabus, check_name, load_syllabus, parse_syllabus
from producer.access import Role, audited
from producer.api import audit, auth, review, schemas
from producer.api.auth import caller, public, requires
from producer.api.events import stream
from producer.api.problems import problem, responses
from producer.api.runs import client_of, parse_key, run_view, start_run
from producer.batches import cancel_batches
from producer.export import (
    FORMATS,
    TABLE_FORMATS,
    bank_questions,
    default_name,
    nothing_approved,
    table_writer,
)
from producer.syllabi import file_syllabus, resolve
from producer.views import status_dict, summary_dict, when
from storage.db import database_error
from storage.reports import EXAM_CURSOR_PATTERN, EXAM_PAGE

router = APIRouter()
log = logging.getLogger("examforge.api")

Slug = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64,
                           description="The exam's slug ([a-z0-9-], up to 64)")]
RunId = Annotated[int, Path(ge=1, le=schemas.MAX_ID, description="The run's id")]
MEDIA_TYPES = {"jsonl": "application/x-ndjson", "json": "application/json", "csv": "text/csv"}


def ctx(request: Request) -> Any:
    return request.app.state.ctx


Ctx = Annotated[Any, Depends(ctx)]


def _syllabus_schema() -> dict[str, Any]:
    """The syllabus's JSON schema for the spec, its one $ref inlined."""
    schema = Syllabus.model_json_schema()
    defs = schema.pop("$defs", {})
    schema["properties"]["chapters"]["items"] = defs["Chapter"]
    return schema


@router.get("/healthz", response_model=schemas.Health, tags=["probes"],
            responses=responses(503))
@public
def healthz(c: Ctx) -> Any:
    """The database answers, and the broker (not used by serve --local)."""

    try:
        with c.store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        return problem(503, f"database: {database_error(exc, c.store.engine.url)}")
    broker = "not used"
    if c.work.mode == "celery":
        try:
            c.work.check()
        except ExamforgeError as exc:
            return problem(503, f"broker: {exc}")
        broker = "ok"
    return {"status": "ok", "database": "ok", "broker": broker}


@router.get("/metrics", tags=["probes"], responses=responses(401),
            response_class=Response,
            openapi_extra={"responses": {"200": {"content": {"text/plain": {
                "schema": {"type": "string"}}}}}})
@requires(Role.reader, every_exam=True)
def metrics(c: Ctx) -> Response:
    """Prometheus metrics, read from the database at each scrape (what may have moved since
    the last one: producer.api.metrics)."""
    assert c.metrics is not None
    return Response(c.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/exams", response_model=schemas.ExamList, tags=["exams"],
            responses=responses(401, 422))
@requires(Role.reader)
def list_exams(c: Ctx, request: Request,
               limit: Annotated[int, Query(ge=1, le=1000,
                                           description="Exams on the page.")] = EXAM_PAGE,
               after: Annotated[str | None, Query(
                   pattern=EXAM_CURSOR_PATTERN, max_length=106,
                   description="The `next` of the page before (opaque: send it as it "
                               "came).")] = None
               ) -> Any:
    """The exams in the database, newest first, a page at a time (`next`: the cursor of the
    next page, null on the last); then, on the last page, the syllabi never run (state new):
    stored ones, and the files of EXAMS_DIR (a file that does not load is left out here; GET
    /exams/SLUG says why). A token with exams lists those only."""
    principal = caller(request)
    only = None if principal.exams is None else sorted(principal.exams)
    page = c.store.exam_page(limit=limit, after=after, only=only)
    items = [{**summary_dict(e), "source": _source(c, e.exam)} for e in page.items]
    if page.next is None:
        items += [e for e in _never_run(c) if principal.sees(e["exam"])]
    return {"items": items, "next": page.next}


def _never_run(c: Any) -> list[dict[str, Any]]:
    """The syllabi stored or in EXAMS_DIR whose exam is not in the database, by slug."""
    new: dict[str, tuple[str, list[int], float, str]] = {}
    for slug, (body, changed) in c.store.stored_syllabi(unrun=True).items():
        data = json.loads(body)
        new[slug] = (data["title"], [ch["questions"] for ch in data["chapters"]], changed,
                     "api")
    files = _file_syllabi(c.settings)
    recorded = c.store.recorded(sorted(files))
    for slug, (title, targets, changed) in files.items():
        if slug not in recorded:
            new[slug] = (title, targets, changed, "file")  # a file wins, as everywhere
    items = []
    for slug in sorted(new):
        title, targets, changed, source = new[slug]
        items.append({"exam": slug, "title": title, "state": "new",
                      "chapters": {"done": 0, "total": len(targets)},
                      "questions": {"done": 0, "target": sum(targets)},
                      "cost_usd": 0.0, "updated_at": when(changed), "source": source})
    return items


def _file_syllabi(settings: Any) -> dict[str, tuple[str, list[int], float]]:
    """The syllabi of EXAMS_DIR that load: slug -> (title, chapter targets, file's mtime)."""

    out: dict[str, tuple[str, list[int], float]] = {}
    root = settings.exams_dir
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        try:
            path = file_syllabus(settings, folder.name) if folder.is_dir() else None
            if path is None:
                continue
            syllabus = load_syllabus(path, max_questions=settings.max_questions_per_chapter)
        except (ExamforgeError, OSError):
            continue
        out[folder.name] = (syllabus.title, [ch.questions for ch in syllabus.chapters],
                            path.stat().st_mtime)
    return out


def _source(c: Any, slug: str) -> str:
    try:
        return "file" if file_syllabus(c.settings, slug) is not None else "api"
    except Exception:  # a symlink out of EXAMS_DIR: not a usable file
        return "api"


@router.put("/exams/{slug}", response_model=schemas.ExamStored, status_code=200, tags=["exams"],
            responses={201: {"description": "Created", "model": schemas.ExamStored},
                       **responses(401, 409, 413, 422)},
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/json": {"schema": _syllabus_schema()}}}})
@requires(Role.operator)
async def put_exam(slug: Slug, request: Request, c: Ctx) -> Any:
    """Store the exam's syllabus (the JSON of syllabus.json, validated by the same code, with
    the same messages): 201 when created, 200 when replaced. Refused (409) for an exam whose
    syllabus is a file in EXAMS_DIR."""
    raw = await request.body()  # whole already: BodyLimit read it, up to 1 MB
    return await run_in_threadpool(_audited, c, request, "syllabus.put", slug,
                                   {"bytes": len(raw)}, _put_exam, c, slug, raw)


def _audited(c: Any, request: Request, action: str, exam: str | None,
             details: dict[str, Any] | None, act: Any, *args: Any) -> Any:
    """`act(*args)`, recorded in the audit as the caller's: a problem it answers with is
    `refused`, an error it raises `failed`."""
    with audited(c.store, caller(request).name, action, exam, details) as note:
        answer = act(*args)
        status = getattr(answer, "status_code", 200)
        if status >= 400:
            note["outcome"] = "refused"
            note["details"]["status"] = status
        return answer


def _put_exam(c: Any, slug: str, raw: bytes) -> Any:
    if file_syllabus(c.settings, slug) is not None:
        raise Conflict(f"exam {slug} has a syllabus file in EXAMS_DIR; edit that file instead")
    syllabus = parse_syllabus(raw, "request body",
                              max_questions=c.settings.max_questions_per_chapter)
    created = c.store.put_syllabus(slug, syllabus.model_dump_json(exclude_none=True))
    content = {"exam": slug, "title": syllabus.title, "chapters": len(syllabus.chapters),
               "questions": sum(ch.questions for ch in syllabus.chapters)}
    return JSONResponse(content, status_code=201 if created else 200,
                        headers={"Location": f"/exams/{slug}"})


@router.put("/exams/{slug}/sources/{name:path}", response_model=schemas.SourceStored,
            status_code=200, tags=["exams"],
            responses={201: {"description": "Created", "model": schemas.SourceStored},
                       **responses(401, 404, 409, 413, 422)},
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}}})
@requires(Role.operator)
async def put_source(slug: Slug, name: str, request: Request, c: Ctx) -> Any:
    """Upload a source file of an API exam (a chapter's `sources` names it: `notes/ch1.md`,
    `guide.pdf`): the file's bytes as the body, at most 1 MB. It is checked as enqueue
    checks a file (type, text, an encrypted or scanned PDF, the page cap, the work of reading
    it) and kept in the database: the server never reads a path a client names. 201 when
    created, 200 when replaced; 404 for an exam with no syllabus (put it first); 413 past 1 MB
    or past API_UPLOAD_TOTAL_BYTES for the exam's uploads together; 422 for a name that is
    not a plain relative path (`..`, an absolute path)."""
    raw = await request.body()  # whole already: BodyLimit read it, up to 1 MB
    return await run_in_threadpool(_audited, c, request, "source.put", slug,
                                   {"source": name[:255], "bytes": len(raw)}, _put_source, c,
                                   slug, name, raw)


def _put_source(c: Any, slug: str, name: str, raw: bytes) -> Any:
    from examforge.errors import SourceError
    from examforge.sources import MAX_UPLOAD_BYTES, cached_sections, file_hash, parse_entry
    from producer.grounding import uploaded_label

    try:
        spec = parse_entry(name)
    except ValueError as exc:
        raise SourceError(f"source {name[:200]!r} of exam {slug}: {exc}") from None
    if spec.pages is not None:
        raise SourceError(f"source {name!r}: upload the file; its pages are chosen in the "
                          "syllabus (`guide.pdf#pages=3-9`)")
    if file_syllabus(c.settings, slug) is not None:
        raise Conflict(f"exam {slug} has a syllabus file in EXAMS_DIR; put its sources in "
                       "its folder instead")
    resolve(c.settings, slug, c.store)  # 404 (UnknownExam) before any work: PUT the syllabus
    if len(raw) > MAX_UPLOAD_BYTES:
        return problem(413, f"{uploaded_label(slug, name)}: {len(raw)} bytes, larger than "
                            f"the {MAX_UPLOAD_BYTES} allowed")
    total = c.store.sources_size(slug, excluding=name) + len(raw)
    if total > c.settings.api_upload_total_bytes:
        return problem(413, f"{uploaded_label(slug, name)}: the exam's uploads would hold "
                            f"{total} bytes, more than API_UPLOAD_TOTAL_BYTES="
                            f"{c.settings.api_upload_total_bytes}")
    # Refused now, not at the run; the text is kept for the run to reuse.
    cached_sections(spec, raw, uploaded_label(slug, name), c.store)
    created = c.store.put_source(slug, name, raw)
    return JSONResponse({"exam": slug, "source": name, "bytes": len(raw),
                         "sha256": file_hash(raw)}, status_code=201 if created else 200)


@router.delete("/exams/{slug}/sources/{name:path}", status_code=204, tags=["exams"],
               responses=responses(401, 404, 409, 422))
@requires(Role.operator)
def delete_source(slug: Slug, name: str, c: Ctx, request: Request) -> Response:
    """Remove an uploaded source. 404 when the exam has no upload by that name; 409 while a
    run of the exam is open (its work reads the sources)."""
    return _audited(c, request, "source.delete", slug, {"source": name[:255]},  # type: ignore[no-any-return]
                    _delete_source, c, slug, name)


def _delete_source(c: Any, slug: str, name: str) -> Response:
    from producer.grounding import uploaded_label

    if c.store.source_file(slug, name) is None:
        return problem(404, f"{uploaded_label(slug, name)}: no such upload")
    if any(run.exam == slug for run in c.store.open_runs()) and c.store.exam_exists(slug) \
            and not c.store.status(slug).finished:
        raise Conflict(f"{uploaded_label(slug, name)}: a run of exam {slug} is open and reads "
                       "its sources; cancel it or wait for it to end")
    c.store.delete_source(slug, name)
    return Response(status_code=204)


@router.get("/exams/{slug}/sources", response_model=schemas.SourceList, tags=["exams"],
            responses=responses(401, 422))
@requires(Role.reader)
def list_sources(slug: Slug, c: Ctx) -> Any:
    """The sources uploaded for an API exam: name, size, hash."""
    return {"items": [{"name": r["name"], "bytes": r["size"], "sha256": r["sha256"][:16]}
                      for r in c.store.source_names(slug)]}


@router.get("/exams/{slug}", response_model=schemas.ExamStatus, tags=["exams"],
            responses=responses(401, 404, 422))
@requires(Role.reader)
def get_exam(slug: Slug, c: Ctx) -> Any:
    """The exam's status (`status --json`); a syllabus stored and never run is `new`."""
    if c.store.exam_exists(slug):
        return status_dict(c.store.status(slug))
    syllabus = resolve(c.settings, slug, c.store)
    zero = {"total": len(syllabus.chapters), "pending": 0, "running": 0, "done": 0,
            "failed": 0, "cancelled": 0}
    return {"exam": slug, "title": syllabus.title, "state": "new", "pause_reason": None,
            "pause_code": None, "chapters": zero,
            "questions": {"done": 0, "target": sum(ch.questions for ch in syllabus.chapters)},
            "cost_usd": 0.0, "budget_usd": None, "verify": syllabus.verify,
            "language": syllabus.language,
            "chapter_list": [{"id": ch.id, "title": ch.title, "state": "new",
                              "questions": {"done": 0, "target": ch.questions},
                              "language": ch.language or syllabus.language}
                             for ch in syllabus.chapters]}


@router.post("/exams/{slug}/runs", response_model=schemas.RunOut, status_code=202,
             tags=["runs"], responses=responses(400, 401, 404, 413, 422, 503))
@requires(Role.operator)
def post_run(slug: Slug, c: Ctx, request: Request,
             idempotency_key: Annotated[str | None, Header(
                 alias="Idempotency-Key",
                 description="Required; the same key and body return the same run")] = None,
             body: Annotated[schemas.RunRequest | None, Body()] = None) -> Any:
    """Start generating what the exam is missing; answers at once with the run (202).
    `{"batch": true}` generates it through the provider's Batch API (the run then reports
    its batches, and what it waits on in `state_detail`)."""
    key = parse_key(idempotency_key)
    if key is None:
        return problem(400, "the Idempotency-Key header is required (a string of up to 255 "
                            "printable ASCII characters, one per distinct request)")
    budget = body.budget_usd if body is not None else None
    batch = body.batch if body is not None else None
    verify = body.verify if body is not None else None
    who = caller(request).name
    details = {"budget_usd": budget, "batch": batch, "verify": verify}
    with audited(c.store, who, "run.start", slug, details) as note:
        run, created = start_run(c, slug, key, budget,
                                 client_of(request.headers.get("authorization"), c.auth),
                                 batch=batch, verify=verify, started_by=who)
        note["details"].update(run=run.id, repeat=not created)
    if budget is not None and created:
        # The budget is the exam's from now on: its own row, so `audit` finds every change.
        c.store.record_audit(who, "budget.set", slug, {"budget_usd": budget, "run": run.id},
                             "ok")
    return JSONResponse(run_view(c, run), status_code=202,
                        headers={"Location": f"/runs/{run.id}"})


@router.get("/exams/{slug}/runs", response_model=schemas.RunList, tags=["runs"],
            responses=responses(401, 404, 422))
@requires(Role.reader)
def list_runs(slug: Slug, c: Ctx) -> Any:
    """The exam's runs, newest first (the last 20)."""
    runs = c.store.exam_runs(slug)
    if not runs and not c.store.exam_exists(slug):
        _require_known(c, slug)
    return {"items": [run_view(c, r) for r in runs]}


def _require_known(c: Any, slug: str) -> None:
    resolve(c.settings, slug, c.store)  # raises UnknownExam


def _run(c: Any, run_id: int) -> Any:
    run = c.store.run(run_id)
    if run is None:
        raise UnknownExam(f"no run {run_id}")
    return run


@router.get("/runs/{run_id}", response_model=schemas.RunOut, tags=["runs"],
            responses=responses(401, 404, 422))
@requires(Role.reader)
def get_run(run_id: RunId, c: Ctx) -> Any:
    return run_view(c, _run(c, run_id))


@router.post("/runs/{run_id}/cancel", response_model=schemas.RunOut, tags=["runs"],
             responses=responses(401, 404, 409, 422))
@requires(Role.operator)
def cancel_run(run_id: RunId, c: Ctx, request: Request) -> Any:
    """Cancel the run: its exam's unfinished slices are cancelled at once, so no new call
    starts. A call already in flight (at most one per running slice) is paid for either way:
    its holder keeps the lease until its reply is committed, and then stops; the stream's
    `cancelled` event comes once those calls have settled. Stored questions stay. Cancelling a cancelled run changes nothing; a run
    that ended otherwise is 409. Closing a connection never cancels anything: only this
    does."""
    run = _run(c, run_id)
    with audited(c.store, caller(request).name, "run.cancel", run.exam, {"run": run_id}) as note:
        view = run_view(c, run)
        if view["state"] == "cancelled":
            note["details"]["already"] = True
            return view
        if view["state"] in ("done", "failed"):
            raise Conflict(f"run {run_id} has ended ({view['state']}): nothing to cancel")
        c.store.cancel_run(run)
        # Its exam's provider batches too (batch mode): marked first, so that a provider
        # that cannot be reached now is asked by the batch runner's next poll.
        cancel_batches(c.settings, c.store, run.exam)
    return run_view(c, run)


@router.get("/runs/{run_id}/events", tags=["runs"], response_class=Response,
            responses={**responses(401, 404, 422),
                       200: {"description": "An event stream", "content": {
                           "text/event-stream": {"schema": {
                               "type": "object",
                               "properties": {"event": {"type": "string"},
                                              "data": {"type": "string"},
                                              "id": {"type": "string"},
                                              "retry": {"type": "integer"}}}}}},
                       204: {"description": "The final event was already received"}})
@requires(Role.reader)
def run_events(run_id: RunId, c: Ctx,
               last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None
               ) -> Response:
    """Server-Sent Events: `progress` per stored batch (data: done, target, cost_usd), then
    one `done`, `failed` or `cancelled` (data: the run) and the end. Ids come from the
    database: reconnect to any replica with Last-Event-ID and nothing is missed."""
    return stream(c, _run(c, run_id), last_event_id)


@router.get("/exams/{slug}/questions", response_model=schemas.QuestionPage, tags=["questions"],
            responses=responses(401, 404, 422))
@requires(Role.reader)
def questions(slug: Slug, c: Ctx,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              after: Annotated[int, Query(ge=0, le=schemas.MAX_ID,
                                          description="The last id of the previous page")] = 0
              ) -> Any:
    """Stored questions by id (keyset pagination: stable while generation runs)."""
    if not c.store.exam_exists(slug):
        _require_known(c, slug)  # a syllabus stored, never run: no questions yet
        return {"items": [], "next": None}
    rows = c.store.question_page(slug, after, limit)
    items = [{**r, "created_at": when(r["created_at"])} for r in rows]
    return {"items": items, "next": items[-1]["id"] if len(items) == limit else None}


# Bank formats: Moodle XML and GIFT are text; an .apkg has no registered media type (Anki
# itself serves it as octet-stream); a QTI package is a zip.
MEDIA_TYPES.update({"moodle-xml": "application/xml", "gift": "text/plain; charset=utf-8",
                    "anki": "application/octet-stream", "qti": "application/zip"})
_FORMAT_PATTERN = "^(" + "|".join(FORMATS) + ")$"  # names of [a-z-] only
_BINARY_BODY = {"schema": {"type": "string", "format": "binary"}}


@router.get("/exams/{slug}/export", tags=["questions"], response_class=Response,
            responses={**responses(401, 404, 409, 422), 200: {
                "description": "The questions, as a download (Content-Disposition names the "
                               "file as `producer export` would)",
                "content": {
                    "application/x-ndjson": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "array",
                                                    "items": {"type": "object"}}},
                    "text/csv": {"schema": {"type": "string"}},
                    "application/xml": {"schema": {"type": "string"}},
                    "text/plain": {"schema": {"type": "string"}},
                    "application/octet-stream": _BINARY_BODY,
                    "application/zip": _BINARY_BODY}}})
@requires(Role.reader)
def export(slug: Slug, request: Request, c: Ctx,
           format: Annotated[str, Query(
               pattern=_FORMAT_PATTERN,
               description="jsonl, json, csv, or a question bank: moodle-xml, gift, anki "
                           "(.apkg), qti (QTI 1.2 zip for Canvas)")] = "jsonl",
           approved_only: Annotated[bool, Query(
               description="Only the questions a reviewer approved (as export "
                           "--approved-only).")] = False,
           bom: Annotated[bool, Query(
               description="With format=csv: the file starts with a UTF-8 byte-order mark, "
                           "which spreadsheet programs need to read Persian, Arabic or "
                           "Russian text right (as export --bom); refused with another "
                           "format.")] = False) -> Response:
    """Every stored question but the rejected ones (export's writers: the same content as
    the CLI's), or with `approved_only` the approved ones. The table
    formats are streamed; a bank is built whole first (spooled to disk when large), so that a
    stored question no bank can hold is a 409 problem, not a download cut short.
    `approved_only` of an exam with no approved question is a 409 problem too: an empty
    bank is not a download."""
    check_name(slug, "exam slug")
    if bom and format != "csv":
        raise RequestValidationError([{"loc": ("query", "bom"), "type": "value_error",
                                       "msg": "a byte-order mark is for format=csv only"}])
    if not c.store.exam_exists(slug):
        raise UnknownExam(f"unknown exam {slug!r}: not in the database (start a run first)")
    if approved_only and not c.store.approved_in_bank(slug):
        raise NothingApproved(nothing_approved(slug))  # 409: an empty bank is no success
    headers = {"Content-Disposition":
               f'attachment; filename="{slug}{default_name(format).removeprefix("generated")}"'}
    if request.method == "HEAD":  # the headers a GET would have, and nothing read
        response = Response(media_type=MEDIA_TYPES[format], headers=headers)
        del response.headers["content-length"]
        return response
    if format in TABLE_FORMATS:
        return StreamingResponse(_stream_export(c.store, slug, format, approved_only, bom),
                                 media_type=MEDIA_TYPES[format], headers=headers)
    bank = _build_bank(c.store, slug, format, approved_only)
    size = bank.seek(0, 2)
    bank.seek(0)
    return StreamingResponse(_read_chunks(bank), media_type=MEDIA_TYPES[format],
                             headers={**headers, "Content-Length": str(size)})


def _build_bank(store: Any, slug: str, fmt: str, approved_only: bool = False) -> IO[bytes]:
    """The whole bank in a temporary file (memory up to 8 MB, then disk)."""
    title, chapters = store.outline(slug)
    exam = BankExam(slug, title, tuple(BankChapter(*chapter) for chapter in chapters))
    # Closed by _read_chunks once sent (or below on failure), not by a `with` here.
    out = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # noqa: SIM115
    try:
        rows = bank_questions(store.iter_questions(slug, approved_only=approved_only))
        write_bank(fmt, exam, rows, out)  # type: ignore[arg-type]
    except ValueError as exc:  # a stored row no bank can hold: say which, send nothing
        out.close()
        raise Conflict(f"export {fmt}: {exc}") from None
    except BaseException:
        out.close()
        raise
    return out  # type: ignore[return-value]


def _read_chunks(f: IO[bytes]) -> Iterator[bytes]:
    try:
        while chunk := f.read(65536):
            yield chunk
    finally:
        f.close()


class _Pipe:
    """A file the export writers write into, read on the other side as chunks."""

    def __init__(self, chunks: queue.Queue[bytes | None]) -> None:
        self.chunks = chunks
        self.buffer: list[str] = []
        self.size = 0

    def write(self, s: str) -> int:
        self.buffer.append(s)
        self.size += len(s)
        if self.size >= 65536:
            self.flush()
        return len(s)

    def flush(self) -> None:
        if self.buffer:
            self.chunks.put("".join(self.buffer).encode())
            self.buffer, self.size = [], 0


def _stream_export(store: Any, slug: str, fmt: str,
                   approved_only: bool = False, bom: bool = False) -> Iterator[bytes]:
    """The writer runs in a thread of its own, a bounded queue between it and the response:
    memory stays flat however many questions, as in the CLI's export."""
    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
    stop = threading.Event()
    failed: list[BaseException] = []

    def produce() -> None:
        pipe = _Pipe(chunks)
        try:
            def rows() -> Iterator[dict[str, object]]:
                for r in store.iter_questions(slug, approved_only=approved_only):
                    if stop.is_set():
                        return
                    yield r
            table_writer(fmt, bom)(rows(), pipe)
            pipe.flush()
        except BaseException as exc:  # noqa: BLE001 - raised on the response's side below
            failed.append(exc)
        finally:
            chunks.put(None)

    worker = threading.Thread(target=produce, name=f"export-{slug}", daemon=True)
    worker.start()
    try:
        while (chunk := chunks.get()) is not None:
            yield chunk
        if failed:
            # The status line and the first chunks are gone already: the one way left to say
            # the download is not whole is to break it off (no last chunk), which every
            # HTTP client reports as an incomplete body, instead of ending it as complete.
            log.error("export of %s stopped: %s", slug, failed[0], exc_info=failed[0],
                      extra={"exam": slug})
            raise ExportInterrupted(f"export of {slug} stopped: {failed[0]}") from failed[0]
    finally:
        stop.set()
        while worker.is_alive():  # let it end: it may be blocked on a full queue
            try:
                chunks.get_nowait()
            except queue.Empty:
                worker.join(timeout=0.05)


router.include_router(review.router)
router.include_router(auth.router)
router.include_router(audit.router)


def _head_routes() -> None:
    """HEAD wherever GET is (RFC 9110: the GET's headers without its body). Starlette adds
    HEAD to its own GET routes but FastAPI does not; each gets a HEAD route of its own, left
    out of the spec (it would double every GET operation there). The routes of the included
    routers (review, /me, /audit) get theirs here too: FastAPI keeps an included router as one
    entry of `routes`, so `auth.api_routes` walks into it. Not for the event stream:
    its headers promise an endless body, and a HEAD would hold a stream open for nothing."""
    for route in list(auth.api_routes(router)):  # the included routers' routes too
        if "GET" in (route.methods or ()) and route.path != "/runs/{run_id}/events":
            router.add_api_route(route.path, route.endpoint, methods=["HEAD"],
                                 include_in_schema=False, response_model=route.response_model,
                                 response_class=route.response_class,
                                 status_code=route.status_code, name=f"{route.name}_head")


_head_routes()
