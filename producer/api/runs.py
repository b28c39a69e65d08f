"""Runs: POST /exams/SLUG/runs and what GET /runs/ID says of one.

The Idempotency-Key rules (the IETF httpapi Idempotency-Key draft):
- the key is required (400 without it);
- the same key with the same request (exam and body) returns the run the first one made,
  whatever happened since, and never starts more work: a double click, a client's retry and
  two requests at once on two replicas (the UNIQUE key in the database decides) all get one
  run;
- the same key with another request gets 422;
- a key is remembered API_IDEMPOTENCY_TTL_S (at least 24 h) from its first request; older
  keys are forgotten by every POST and by `producer prune`, and the same key then starts a
  new run.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from examforge.errors import UnknownExam
from producer.views import when
from storage.models import FINAL_RUN_STATES
from storage.runs import RunRow, run_state

if TYPE_CHECKING:
    from producer.api.app import Context

MAX_KEY_LENGTH = 255


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


def fingerprint(slug: str, budget_usd: float | None) -> str:
    """What a request asked, as a hash: the key's request must match it."""
    blob = json.dumps({"exam": slug, "budget_usd": budget_usd}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def run_view(ctx: Context, run: RunRow) -> dict[str, Any]:
    """GET /runs/ID: the run as its exam's rows have it now (re-read: it may have been
    cancelled since `run` was read). A final state is recorded the first time it is seen."""
    store = ctx.store
    run = store.run(run.id) or run
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
        if state in FINAL_RUN_STATES and run.state is None and run.launched_at is not None:
            store.record_run_state(run.id, state)
        questions = {"done": report.questions.done, "target": report.questions.target}
        c = report.chapters
        chapters = {"total": c.total, "pending": c.pending, "running": c.running,
                    "done": c.done, "failed": c.failed, "cancelled": c.cancelled}
        budget, spent = report.budget_usd, report.spent_usd
        changed = max(filter(None, (run.updated_at, report.updated_at, activity.last_at)))
    return {"id": run.id, "exam": run.exam, "state": state, "pause_reason": reason,
            "questions": questions, "chapters": chapters, "cost_usd": activity.cost_usd,
            "budget_usd": budget, "spent_usd": spent, "created_at": when(run.created_at),
            "updated_at": when(changed)}


def start_run(ctx: Context, slug: str, key: str, budget_usd: float | None
              ) -> tuple[RunRow, bool]:
    """The run of `key` for this request, starting its work if it is new (True)."""
    from producer.syllabi import resolve

    store = ctx.store
    syllabus = resolve(ctx.settings, slug, store)  # UnknownExam: 404, before any write
    store.forget_idempotency_keys(ctx.settings.api_idempotency_ttl_s)
    existing = store.exam_runs(slug, limit=50)
    run, created = store.create_run(slug, key, fingerprint(slug, budget_usd), budget_usd)
    if not created:
        return run, False
    try:
        ctx.work.check()
        # Earlier runs of the exam that have ended are recorded as such before this one
        # changes the exam's rows (a raised target must not reopen a finished run).
        for older in existing:
            if older.state is None:
                run_view(ctx, older)
        store.prepare_run(slug)
        ctx.work.start(slug, syllabus, budget_usd)
    except BaseException:
        store.delete_run(run.id)  # nothing was handed on: the key may be sent again
        raise
    store.mark_launched(run.id)
    return store.run(run.id) or run, True
