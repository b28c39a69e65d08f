"""Submissions to a provider's Batch API (examforge.batching) and the exam's mode.

A submission is a `batch` row, written before anything reaches the provider. It holds the
slices it submits with the ordinary leases (owner `batch/<id>`, `owner_of`), and its calls are
ordinary call rows of that owner: the same fence, ledger and budget as the synchronous path.
The rows here are what `status`, `cancel`, the API and the page read (`exam_batches`,
`live_batches`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update

from storage.base import E, StoreBase
from storage.models import LIVE_BATCH_STATES, Batch, ExamMode

B = Batch.__table__  # type: ignore[attr-defined]

# The lease owner of a submission's slices and calls.
OWNER_PREFIX = "batch/"


def owner_of(submission: str) -> str:
    return f"{OWNER_PREFIX}{submission}"


def submission_of(owner: str | None) -> str | None:
    """The submission id an owner string names, or None for a synchronous worker."""
    if owner and owner.startswith(OWNER_PREFIX):
        return owner[len(OWNER_PREFIX):]
    return None


@dataclass(frozen=True)
class BatchRow:
    """A submission as status, cancel, the API and the page read it."""

    id: str
    exam: str
    state: str  # storage.models.BatchState
    provider_batch_id: str | None
    provider_status: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    model: str | None
    requests: int
    bytes: int
    request_total: int
    request_completed: int
    request_failed: int
    created_at: float
    submitted_at: float | None
    expires_at: float | None
    finished_at: float | None
    polled_at: float | None
    lease_owner: str | None
    lease_expires_at: float | None
    create_attempts: int
    cancel_requested: bool
    detail: str | None
    usage: dict[str, Any] | None

    @property
    def live(self) -> bool:
        return self.state in LIVE_BATCH_STATES

    @property
    def owner(self) -> str:
        """The lease owner of its slices and calls."""
        return owner_of(self.id)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_row(cls, row: Any) -> "BatchRow":
        values = dict(row._mapping)
        values["usage"] = json.loads(values["usage"]) if values.get("usage") else None
        values["cancel_requested"] = bool(values["cancel_requested"])
        return cls(**{name: values[name] for name in cls.__dataclass_fields__})


class Batches(StoreBase):
    """The exam's mode and its submissions."""

    def set_exam_mode(self, slug: str, mode: ExamMode | str) -> bool:
        """Set how the exam is generated from now on; False if there is no such exam."""
        value = ExamMode(mode).value
        with self._write() as conn:
            return conn.execute(update(E).where(E.c.slug == slug).values(
                mode=value, updated_at=self._now)).rowcount == 1

    def exam_mode(self, slug: str) -> ExamMode:
        """The exam's mode (`sync` for an exam that is not in the database)."""
        with self._read() as conn:
            mode = conn.execute(select(E.c.mode).where(E.c.slug == slug)).scalar_one_or_none()
        return ExamMode(mode or ExamMode.sync.value)

    def batch_exams(self) -> list[str]:
        """Active exams in batch mode, and any exam with a live submission (a submission
        outlives a switch back to sync mode: its lines are paid for, so they are still
        collected)."""
        live = select(B.c.exam).where(B.c.state.in_(LIVE_BATCH_STATES))
        with self._read() as conn:
            return sorted(set(conn.execute(select(E.c.slug).where(
                E.c.mode == ExamMode.batch.value)).scalars()) | set(
                conn.execute(live.distinct()).scalars()))

    def exam_batches(self, slug: str) -> list[BatchRow]:
        """The exam's submissions, newest first."""
        with self._read() as conn:
            rows = conn.execute(select(B).where(B.c.exam == slug)
                                .order_by(B.c.created_at.desc(), B.c.id)).all()
        return [BatchRow.from_row(r) for r in rows]

    def live_batches(self, slug: str | None = None) -> list[BatchRow]:
        """Submissions not ended yet (preparing, uploaded, creating or submitted), of the exam
        or of every exam, oldest first."""
        query = select(B).where(B.c.state.in_(LIVE_BATCH_STATES))
        if slug is not None:
            query = query.where(B.c.exam == slug)
        with self._read() as conn:
            rows = conn.execute(query.order_by(B.c.created_at, B.c.id)).all()
        return [BatchRow.from_row(r) for r in rows]

    def batch(self, submission: str) -> BatchRow | None:
        with self._read() as conn:
            row = conn.execute(select(B).where(B.c.id == submission)).one_or_none()
        return None if row is None else BatchRow.from_row(row)

    def request_batch_cancel(self, slug: str) -> int:
        """Mark the exam's live submissions for cancelling at the provider (the batch runner
        does it at its next pass). Returns how many were marked."""
        with self._write() as conn:
            return conn.execute(update(B).where(
                B.c.exam == slug, B.c.state.in_(LIVE_BATCH_STATES),
                B.c.cancel_requested.is_(False)).values(cancel_requested=True)).rowcount
