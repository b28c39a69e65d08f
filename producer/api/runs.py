"""Runs: POST /exams/SLUG/runs and what GET /runs/ID says of one.

The Idempotency-Key rules (the IETF httpapi Idempotency-Key draft):
- the key is required (400 without it);
- the same key with the same request (exam and body) returns the run the first one made,
  whatever happened since, and never starts more work (beyond launching it if it never
  was): a double click, a client's retry and two requests at once on two replicas (the
  UNIQUE key in the database decides) all get one run;
- the same key with another request gets 422;
- keys are the client's: each bearer token has its own (`client_of`), so two clients that
  pick the same key never meet;
- a run is stored before its work is handed on, and never deleted: a repeat of its key, or
  the periodic sweep of any replica (`sweep`), launches a run whose hand-off never happened
  (its server died, the broker refused); a claim in the database keeps it to one hand-off
  at a time;
- a key is remembered API_IDEMPOTENCY_TTL_S (at least 24 h) from its first request; older
  keys are forgotten by every POST and by `producer prune`, and the same key then starts a
  new run.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from examforge.errors import (BrokerUnavailable, ExamforgeError, InfrastructureError,
                              RunNotLaunched, UnknownExam)
from examforge.syllabus import Syllabus
from producer.api.context import Context
from producer.syllabi import resolve
from producer.views import batch_dict, when
from storage.models import FINAL_RUN_STATES, RunState
from storage.report_types import waiting_text
from storage.runs import RunRow, run_state

MAX_KEY_LENGTH = 255
log = logging.getLogger("examforge.api")


def parse_key(value: str | None) -> str | None:
    """The key of an Idempotency-Key header: the draft makes it a Structured Field string
    ("..."); a bare token is accepted too. None if missing or unusable."""
    if value is None:
        return None
    key = value.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable() or not key.isascii():
        return None
    return key


def fingerprint(slug: str, budget_usd: float | None, batch: bool = False,
                verify: str | None = None) -> str:
    """What a request asked, as a hash: the key's request must match it. `batch` is the
    mode the request resolves to (its `batch`, else LLM_BATCH), in the hash only when true,
    and `verify` only when given, so that the runs stored before them keep their
    fingerprints."""
    asked: dict[str, Any] = {"exam": slug, "budget_usd": budget_usd}
    if batch:
        asked["batch"] = True
    if verify is not None:
        asked["verify"] = verify
    blob = json.dumps(asked, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def run_batches(ctx: Context, run: RunRow, report: Any) -> list[Any]:
    """The exam's provider batches that are the run's: created since the run was, and before
    a later launched run of the exam was (its batches are that run's), newest first."""
    later = [r.created_at for r in ctx.store.exam_runs(run.exam, limit=50)
             if r.id > run.id and r.launched_at is not None]
    until = min(later) if later else None
    return [b for b in report.batches
            if b.created_at >= run.created_at and (until is None or b.created_at < until)]


def waiting_detail(batches: list[Any]) -> str | None:
    """What a run waits on while its exam's slices are held by live provider batches."""
    live = [b for b in batches if b.live]
    if not live:
        return None
    if len(live) == 1:
        return waiting_text(live[0])
    return (f"waiting on {len(live)} provider batches: "
            + "; ".join(waiting_text(b).removeprefix("waiting on the provider's batch ")
                        for b in reversed(live)))


def run_view(ctx: Context, run: RunRow) -> dict[str, Any]:
    """GET /runs/ID: the run as its exam's rows have it now (re-read: it may have been
    cancelled since `run` was read). A final state is recorded the first time it is seen."""
    store = ctx.store
    run = store.run(run.id) or run
    if run.final_view is not None:  # what it said when it ended; later runs change nothing
        return {"started_by": _started_by(run), **json.loads(run.final_view)}
    try:
        report = store.status(run.exam)
    except UnknownExam:  # its request has not recorded the exam yet
        report = None
    activity = store.run_activity(run)
    if report is None:
        state, reason = ("cancelled" if run.cancelled_at else run.state or "queued"), None
        questions = {"done": 0, "target": 0}
        chapters = {"total": 0, "pending": 0, "running": 0, "done": 0, "failed": 0,
                    "cancelled": 0}
        budget, spent, changed = run.budget_usd, 0.0, run.updated_at
    else:
        state, reason = run_state(run, report, activity)
        changed = max(filter(None, (run.updated_at, report.updated_at, activity.last_at)))
        questions = {"done": report.questions.done, "target": report.questions.target}
        c = report.chapters
        chapters = {"total": c.total, "pending": c.pending, "running": c.running,
                    "done": c.done, "failed": c.failed, "cancelled": c.cancelled}
        budget, spent = report.budget_usd, report.spent_usd
    batches = [] if report is None else run_batches(ctx, run, report)
    detail = waiting_detail(batches) if state in ("queued", "running", "paused") else None
    if detail is None and state == "running" and run.batch and report is not None and \
            not report.chapters.running:
        detail = "batch mode: between two provider batches (the next round is submitted " \
                 "at the next batch pass)"
    code = report.pause_code if report is not None and reason is not None else None
    view = {"id": run.id, "exam": run.exam, "state": state, "pause_reason": reason,
            "pause_code": code,
            "questions": questions, "chapters": chapters, "cost_usd": activity.cost_usd,
            "budget_usd": budget, "spent_usd": spent, "created_at": when(run.created_at),
            "updated_at": when(changed), "batch": run.batch, "state_detail": detail,
            "started_by": _started_by(run),
            "batches": [batch_dict(b) for b in batches]}
    if report is not None and state in FINAL_RUN_STATES and (
            run.launched_at is not None or run.cancelled_at is not None) and (
            state != RunState.cancelled.value or not store.calls_in_flight(run)) and \
            not any(b.live for b in batches):
        # Kept as it is now, the first time it is seen final (a cancelled run's once its
        # calls in flight have settled: its cost is final then), stamped with the time the
        # run last changed: every later read, on any replica and any stream, is the same,
        # whatever later runs of the exam do. Not while a batch of the run is live: its
        # last lines are being booked (the view then lists it as ended).
        store.record_run_state(run.id, state, at=changed, view=json.dumps(view))
        kept = store.run(run.id)
        if kept is not None and kept.final_view is not None:
            return {"started_by": _started_by(kept), **json.loads(kept.final_view)}
    return view


def _started_by(run: RunRow) -> str | None:
    """Who started the run: its token's name; for a run from before names (0030), the hash
    of its token, where one is known."""
    return run.started_by or run.client or None


def client_of(authorization: str | None, auth: bool) -> str:
    """Whose Idempotency-Keys a request's are: a hash of its bearer token (the middleware has
    checked it), '' when the server runs without auth. Never the token itself: the database
    must not hold a credential."""
    if not auth or not authorization:
        return ""
    token = authorization.partition(" ")[2].strip()
    return hashlib.sha256(b"examforge-client\0" + token.encode()).hexdigest()[:32]


def start_run(ctx: Context, slug: str, key: str, budget_usd: float | None,
              client: str = "", batch: bool | None = None, verify: str | None = None,
              started_by: str | None = None) -> tuple[RunRow, bool]:
    """The run of `client`'s `key` for this request (True if this request made it), its work
    handed on if it has not been yet: by this request, or by a repeat of the key when the
    first one died or the broker refused it. BrokerUnavailable (503) leaves the run queued."""
    store = ctx.store
    syllabus = resolve(ctx.settings, slug, store)  # UnknownExam: 404, before any write
    from producer.grounding import exam_material
    exam_material(ctx.settings, slug, syllabus, store)  # bad sources: 422, before any write
    store.forget_idempotency_keys(ctx.settings.api_idempotency_ttl_s)
    batch = ctx.settings.llm_batch if batch is None else batch
    run, created = store.create_run(slug, key, fingerprint(slug, budget_usd, batch, verify),
                                    budget_usd, client, batch=batch, verify=verify,
                                    started_by=started_by)
    if run.launched_at is None:
        try:
            launch(ctx, run, syllabus)
        except InfrastructureError as exc:
            raise RunNotLaunched(run.id, exc) from exc
    return store.run(run.id) or run, created


def launch(ctx: Context, run: RunRow, syllabus: Syllabus | None = None) -> bool:
    """Hand the run's work on (enqueue it, or start it in --local), once the run is claimed
    (`Store.claim_launch`, one holder at a time on any number of replicas); False if someone
    else holds the claim or the run needs no launch. A failure releases the claim and is
    raised: the run stays queued, and a repeat of its key or the next sweep tries again.
    A run is never deleted: a duplicate request may already hold its id.

    Handing on twice (a claim that lapsed while its holder was slow) is harmless: `sync_exam`
    and the slices' deterministic task ids make a second enqueue change nothing."""
    store = ctx.store
    if not store.claim_launch(run.id, ctx.settings.api_launch_grace_s):
        return False
    try:
        ctx.work.check()
        if syllabus is None:
            syllabus = resolve(ctx.settings, run.exam, store)
        # Earlier runs of the exam that have ended are recorded as such before this one
        # changes the exam's rows (a raised target must not reopen a finished run).
        for older in store.exam_runs(run.exam, limit=50):
            if older.id < run.id and older.state is None:
                run_view(ctx, older)
        store.prepare_run(run.exam)
        ctx.work.start(run.exam, syllabus, run.budget_usd, batch=run.batch,
                       verify=run.verify)
    except BaseException:
        store.release_launch(run.id)
        raise
    store.mark_launched(run.id)
    now = store.run(run.id)
    if now is not None and now.cancelled_at is not None:
        # Cancelled while its work was being handed on: prepare_run may have put the
        # cancelled slices back to work; cancel them again.
        store.cancel_run(now)
    return True


def sweep(ctx: Context) -> int:
    """What every API replica does every API_SWEEP_INTERVAL_S: launch the runs stored over
    API_LAUNCH_GRACE_S ago whose work was never handed on (their request died between storing
    the run and enqueuing, or the broker refused), and in --local resume the work of the
    runs that are launched and not finished (`LocalWork.resume`: one thread per exam per
    process). Returns how many runs it launched."""
    store = ctx.store
    launched = 0
    for run in store.unlaunched_runs(ctx.settings.api_launch_grace_s):
        try:
            launched += launch(ctx, run)
        except BrokerUnavailable as exc:  # the next sweep tries again; the others too
            log.warning("runs not launched: %s", exc)
            break
        except ExamforgeError as exc:
            log.warning("run %s not launched: %s", run.id, exc, extra={"exam": run.exam})
    if ctx.work.mode == "local":
        for slug in dict.fromkeys(r.exam for r in store.open_runs() if r.launched_at):
            ctx.work.resume(slug, store.unfinished_slices(slug))
    return launched
