"""The JSON forms of reports that the CLI (`--json`) and the HTTP API both print."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from storage.reports import ExamReport, ExamSummary


def when(epoch: float | None) -> str | None:
    """An epoch on the database's clock as ISO 8601 UTC, to the second."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def status_dict(report: ExamReport) -> dict[str, Any]:
    """`status --json`: the report with its times as ISO strings."""
    data = report.as_dict()
    for c in data["chapter_list"]:
        c["last_error_at"], c["requeued_at"] = when(c["last_error_at"]), when(c["requeued_at"])
    for key in ("started_at", "finished_at", "updated_at"):
        data[key] = when(data[key])
    for e in data["recent_errors"]:
        e["at"] = when(e["at"])
    return data


def summary_dict(e: ExamSummary) -> dict[str, Any]:
    """One item of `exams --json`."""
    return {"exam": e.exam, "title": e.title, "state": e.state,
            "chapters": {"done": e.chapters.done, "total": e.chapters.target},
            "questions": {"done": e.questions.done, "target": e.questions.target},
            "cost_usd": e.cost_usd, "updated_at": when(e.updated_at)}
