"""The JSON forms of reports that the CLI (`--json`) and the HTTP API both print (no SQLAlchemy:
the plain-driver reads of producer/read_sqlite.py print them too)."""

from __future__ import annotations

from typing import Any

from producer.words import when
from storage.report_types import (BatchRow, ExamReport, ExamSummary, batch_counts, batch_status,
                                  waiting_text)
from storage.states import FILTERS


def status_dict(report: ExamReport) -> dict[str, Any]:
    """`status --json`: the report with its times as ISO strings."""
    data = report.as_dict()
    for c in data["chapter_list"]:
        c["last_error_at"], c["requeued_at"] = when(c["last_error_at"]), when(c["requeued_at"])
    for key in ("started_at", "finished_at", "updated_at"):
        data[key] = when(data[key])
    for e in data["recent_errors"]:
        e["at"] = when(e["at"])
    data["batches"] = [batch_dict(b) for b in report.batches]
    return data


def batch_dict(row: BatchRow) -> dict[str, Any]:
    """A submission to the provider's Batch API, as `status --json`, GET /exams/SLUG and
    GET /runs/ID show it: `id` is the provider's batch id (null until it is created),
    `submission` ours (the `batch/<id>` lease owner of its slices and calls)."""
    total, completed, failed = batch_counts(row)
    return {"id": row.provider_batch_id, "submission": row.id, "state": row.state,
            "status": batch_status(row), "provider_status": row.provider_status,
            "live": row.live,
            "requests": {"total": total, "completed": completed, "failed": failed},
            "created_at": when(row.created_at), "submitted_at": when(row.submitted_at),
            "expires_at": when(row.expires_at), "finished_at": when(row.finished_at),
            "polled_at": when(row.polled_at), "cancel_requested": row.cancel_requested,
            "detail": row.detail, "waiting": waiting_text(row) if row.live else None}


def summary_dict(e: ExamSummary) -> dict[str, Any]:
    """One item of `exams --json`."""
    return {"exam": e.exam, "title": e.title, "state": e.state,
            "chapters": {"done": e.chapters.done, "total": e.chapters.target},
            "questions": {"done": e.questions.done, "target": e.questions.target},
            "cost_usd": e.cost_usd, "updated_at": when(e.updated_at)}


def review_dict(store: Any, slug: str) -> dict[str, Any]:
    """`review SLUG --json`, which is GET /exams/SLUG/review: each chapter's questions by
    review state and each review filter's count, with totals over the chapters."""
    chapters = [c.as_dict() for c in store.review_summary(slug)]
    totals = {name: sum(c[name] or 0 for c in chapters)
              for name in ("questions", "unreviewed", "approved", "rejected", "disputed",
                           "stale")}
    if any(c["unverified"] is not None for c in chapters):
        totals["unverified"] = sum(c["unverified"] or 0 for c in chapters)
    counts = store.filter_counts(slug)
    for c in chapters:  # a chapter with no question yet has none to count
        c["filters"] = counts.get(c["chapter_id"], dict.fromkeys(FILTERS, 0))
    filters = {name: sum(c["filters"][name] for c in chapters) for name in FILTERS}
    return {"exam": slug, "chapters": chapters, "totals": totals, "filters": filters}
