"""Submissions to a provider's Batch API (runner.batching) and the exam's mode.

A submission is a `batch` row, written before anything reaches the provider. It holds the
slices it submits with the ordinary leases (owner `batch/<id>`, `owner_of`), and its calls are
ordinary call rows of that owner: the same fence, ledger and budget as the synchronous path.
The rows here are what `status`, `cancel`, the API and the page read (`exam_batches`,
`live_batches`)."""

from __future__ import annotations

import json
from typing import Any, Sequence

from sqlalchemy import case, func, insert, or_, select, update

from examforge.errors import SliceReason
from storage.base import ACTIVE_STATES, IN_FLIGHT_CALL, E, K, S
from storage.base import slice_where
from storage.leases import Leases
from storage.types import OWNER_PREFIX, BatchRow, Usage, owner_of
from storage.models import (LIVE_BATCH_STATES, Batch, BatchState, CallOutcome, CallReason,
                            ChapterState, ExamMode, ExamState)

B = Batch.__table__  # type: ignore[attr-defined]

class Batches(Leases):
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
        return [BatchRow.from_row(r._mapping) for r in rows]

    def live_batches(self, slug: str | None = None) -> list[BatchRow]:
        """Submissions not ended yet (preparing, uploaded, creating or submitted), of the exam
        or of every exam, oldest first."""
        query = select(B).where(B.c.state.in_(LIVE_BATCH_STATES))
        if slug is not None:
            query = query.where(B.c.exam == slug)
        with self._read() as conn:
            rows = conn.execute(query.order_by(B.c.created_at, B.c.id)).all()
        return [BatchRow.from_row(r._mapping) for r in rows]

    def batch(self, submission: str) -> BatchRow | None:
        with self._read() as conn:
            row = conn.execute(select(B).where(B.c.id == submission)).one_or_none()
        return None if row is None else BatchRow.from_row(row._mapping)

    def request_batch_cancel(self, slug: str) -> int:
        """Mark the exam's live submissions for cancelling at the provider (the batch runner
        does it at its next pass). Returns how many were marked."""
        with self._write() as conn:
            return conn.execute(update(B).where(
                B.c.exam == slug, B.c.state.in_(LIVE_BATCH_STATES),
                B.c.cancel_requested.is_(False)).values(cancel_requested=True)).rowcount

    def note_batch_status(self, submission: str, provider_status: str) -> bool:
        """The provider's status of a submitted batch, as a cancel's reply gave it (the
        runner's next poll records the rest); no lease needed: a status only."""
        with self._write() as conn:
            return conn.execute(update(B).where(
                B.c.id == submission, B.c.state == BatchState.submitted.value).values(
                provider_status=provider_status[:32])).rowcount == 1

    # ------------------------------------------------------------------ the runner's side
    def new_submission(self, submission: str, exam: str, submitter: str, lease_s: float,
                       model: str | None) -> None:
        """Step 1 of the protocol: the submission's row, before anything else, with the
        submitter's lease on it."""
        with self._write() as conn:
            conn.execute(insert(B).values(
                id=submission, exam=exam, state=BatchState.preparing.value, model=model,
                created_at=self._now, lease_owner=submitter,
                lease_expires_at=self._now + lease_s, create_attempts=0,
                cancel_requested=False))

    def submission_step(self, submission: str, submitter: str, lease_s: float,
                        **values: Any) -> bool:
        """Record a step of a submission (and renew the submitter's lease), only while the
        submitter's lease is live: False when it lapsed (someone may be recovering it)."""
        if "create_attempts" in values and values["create_attempts"] == "+1":
            values["create_attempts"] = B.c.create_attempts + 1
        with self._write() as conn:
            return conn.execute(update(B).where(
                B.c.id == submission, B.c.lease_owner == submitter,
                B.c.lease_expires_at > self._now).values(
                lease_expires_at=self._now + lease_s, **values)).rowcount == 1

    def release_submission(self, submission: str, submitter: str) -> None:
        """The submitter is done with the submission for now (a poll, a step): anyone may
        take it next."""
        with self._write() as conn:
            conn.execute(update(B).where(B.c.id == submission, B.c.lease_owner == submitter)
                         .values(lease_owner=None, lease_expires_at=None))

    def take_submission(self, submission: str, submitter: str, lease_s: float
                        ) -> BatchRow | None:
        """Take a live submission's lease when nobody holds a live one (its submitter died,
        or it waits for its next poll); None when someone does or it has ended."""
        with self._write() as conn:
            taken = conn.execute(update(B).where(
                B.c.id == submission, B.c.state.in_(LIVE_BATCH_STATES),
                or_(B.c.lease_owner.is_(None), B.c.lease_expires_at <= self._now)).values(
                lease_owner=submitter, lease_expires_at=self._now + lease_s)).rowcount
            if taken != 1:
                return None
            row = conn.execute(select(B).where(B.c.id == submission)).one()
        return BatchRow.from_row(row._mapping)

    def batch_candidates(self, slug: str, max_attempts: int, limit: int
                         ) -> list[tuple[str, int]]:
        """Slices of an active batch-mode exam that a round may claim now: pending or
        running with no live lease, out of backoff; syllabus order. (The claim checks all of
        it again, and fails a slice at its attempt cap: no reconciler may be running, as in
        `run --batch`.) `max_attempts` is kept for the callers; the cap is the claim's."""
        with self._read() as conn:
            rows = conn.execute(
                select(S.c.chapter_id, S.c.slice_no).join(E, E.c.slug == S.c.exam).where(
                    S.c.exam == slug, E.c.state == ExamState.active.value,
                    E.c.mode == ExamMode.batch.value, S.c.state.in_(ACTIVE_STATES),
                    or_(S.c.lease_owner.is_(None), S.c.lease_expires_at <= self._now),
                    or_(S.c.not_before_at.is_(None), S.c.not_before_at <= self._now))
                .order_by(S.c.position, S.c.chapter_id, S.c.slice_no).limit(limit)).all()
        return [(r.chapter_id, r.slice_no) for r in rows]

    def next_batch_wait(self, slug: str) -> float | None:
        """Seconds until the earliest backoff of the exam's pending slices ends (None: no
        slice waits on one)."""
        with self._read() as conn:
            return conn.execute(select(func.min(S.c.not_before_at - self._now)).where(
                S.c.exam == slug, S.c.state.in_(ACTIVE_STATES),
                S.c.not_before_at > self._now)).scalar_one_or_none()

    def batch_yield(self, slug: str, chapter_id: str, slice_no: int) -> tuple[int, int]:
        """(questions asked, questions stored) over the slice's batch calls the provider
        answered: how many of what a round asks come back as repeats of this chapter."""
        with self._read() as conn:
            row = conn.execute(select(func.coalesce(func.sum(K.c.requested), 0),
                                      func.coalesce(func.sum(K.c.questions_stored), 0)).where(
                K.c.exam == slug, K.c.chapter_id == chapter_id, K.c.slice_no == slice_no,
                K.c.worker.like(OWNER_PREFIX + "%"),
                K.c.outcome.in_((CallOutcome.used.value, CallOutcome.wasted.value)))).one()
        return int(row[0]), int(row[1])

    def renew_batch_slices(self, owner: str, lease_s: float) -> int:
        """A poll renews a submitted batch's leases on its slices, lapsed or not: a slice
        whose owner is still this submission was taken by nobody (a claim replaces the
        owner), so the provider's answers can still be committed."""
        with self._write() as conn:
            return conn.execute(update(S).where(
                S.c.lease_owner == owner,
                S.c.state.in_((ChapterState.running.value, ChapterState.cancelled.value)))
                .values(lease_expires_at=self._now + lease_s)).rowcount

    def submission_calls(self, owner: str) -> list[Any]:
        """The calls a submission recorded (call.worker == owner), by id."""
        with self._read() as conn:
            return list(conn.execute(select(
                K.c.id, K.c.exam, K.c.chapter_id, K.c.slice_no, K.c.outcome, K.c.requested,
                K.c.first_number, K.c.prompt_tokens, K.c.max_tokens, K.c.cost_usd,
                K.c.prompt_tokens, K.c.completion_tokens, K.c.cached_tokens)
                .where(K.c.worker == owner).order_by(K.c.id)).all())

    def batch_enqueued_tokens(self, slug: str) -> int:
        """The tokens the exam's batch calls in flight enqueue at the provider (each line's
        prompt and max_tokens): what its live batches hold against BATCH_MAX_TOKENS."""
        with self._read() as conn:
            return int(conn.execute(select(
                func.coalesce(func.sum(K.c.prompt_tokens + func.coalesce(K.c.max_tokens, 0)),
                              0))
                .where(K.c.exam == slug, IN_FLIGHT_CALL,
                       K.c.worker.like(f"{OWNER_PREFIX}%"))).scalar_one())

    def held_slices(self, owner: str) -> list[tuple[str, str, int]]:
        """The slices `owner` holds the lease of (exam, chapter_id, slice_no)."""
        with self._read() as conn:
            return [(r.exam, r.chapter_id, r.slice_no) for r in conn.execute(
                select(S.c.exam, S.c.chapter_id, S.c.slice_no).where(S.c.lease_owner == owner)
                .order_by(S.c.exam, S.c.position, S.c.chapter_id, S.c.slice_no))]

    def release_held(self, owner: str, slices: Sequence[tuple[str, str, int]], *,
                     retry_in_s: float = 0.0, error: tuple[SliceReason, str] | None = None,
                     count_attempt: bool = True) -> int:
        """Give back the slices a submission holds, for a later round: a running one to
        pending (not before `retry_in_s`; its attempt taken back unless `count_attempt`), a
        cancelled one let go; `error` (a code and its detail) is recorded as why. Slices it
        no longer holds are left alone."""
        released = 0
        with self._write() as conn:
            for exam, chapter_id, slice_no in slices:
                values: dict[str, Any] = {
                    "state": case((S.c.state == ChapterState.running.value,
                                   ChapterState.pending.value), else_=S.c.state),
                    "lease_owner": None, "lease_expires_at": None,
                    "not_before_at": self._now + retry_in_s if retry_in_s > 0 else None,
                    "updated_at": self._now}
                if error is not None:
                    values.update(last_error_code=error[0].value, last_error=error[1][:1000],
                                  last_error_at=self._now)
                if not count_attempt:
                    values["attempts_since_progress"] = case(
                        (S.c.attempts_since_progress > 0, S.c.attempts_since_progress - 1),
                        else_=0)
                released += conn.execute(update(S).where(
                    *slice_where(exam, chapter_id, slice_no), S.c.lease_owner == owner)
                    .values(**values)).rowcount
        return released

    def abandon_submission(self, submission: str, why: str, *, retry_in_s: float = 0.0
                           ) -> int:
        """A submission that never reached the provider (its file was never uploaded, or a
        create was refused): its calls booked failed and not sent ($0, reservations
        released), its slices given back for the next round (the attempt not counted), and
        the row marked abandoned. Returns the calls booked."""
        owner = owner_of(submission)
        slices = self.held_slices(owner)
        booked = 0
        for call in self.submission_calls(owner):
            if call.outcome == CallOutcome.in_flight.value:
                self.finish_call(call.id, CallOutcome.failed, CallReason.unexpected,
                                 f"not sent: {why}", usage=Usage())
                booked += 1
        self.release_held(owner, slices, retry_in_s=retry_in_s,
                          error=(SliceReason.not_sent, why), count_attempt=False)
        with self._write() as conn:
            conn.execute(update(B).where(B.c.id == submission).values(
                state=BatchState.abandoned.value, finished_at=self._now, detail=why[:1000],
                lease_owner=None, lease_expires_at=None))
        return booked

    def finish_submission(self, submission: str, *, provider_status: str | None,
                          detail: str | None, usage: dict[str, Any] | None,
                          counts: dict[str, int] | None = None) -> None:
        """Every line of the provider's batch is booked: the submission is done."""
        values: dict[str, Any] = {"state": BatchState.done.value, "finished_at": self._now,
                                  "provider_status": provider_status,
                                  "detail": detail[:1000] if detail else None,
                                  "usage": json.dumps(usage) if usage else None,
                                  "lease_owner": None, "lease_expires_at": None}
        if counts:
            values.update(request_total=counts.get("total", 0),
                          request_completed=counts.get("completed", 0),
                          request_failed=counts.get("failed", 0))
        with self._write() as conn:
            conn.execute(update(B).where(B.c.id == submission).values(**values))

    def drop_submission(self, submission: str) -> None:
        """A submission that recorded no call at all (nothing fitted): no trace is needed."""
        with self._write() as conn:
            held = conn.execute(select(func.count()).select_from(K).where(
                K.c.worker == owner_of(submission))).scalar_one()
            if held == 0:
                conn.execute(B.delete().where(B.c.id == submission))

    def now(self) -> float:
        """The database's clock."""
        with self._read() as conn:
            return float(conn.execute(select(self._now)).scalar_one())
