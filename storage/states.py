"""The states the tables store (storage.models), as str enums stored as plain strings, with
no SQLAlchemy: the reports' arithmetic (storage.report_types) and the plain-driver reads
of the commands that only read (producer/read_sqlite.py) compare them without importing
the tables."""

from __future__ import annotations

from enum import Enum


class ExamState(str, Enum):
    active = "active"
    # Nothing more is sent until a person acts: a rejected key, an exhausted quota, the budget
    # spent (pause_reason says which); `producer resume` (or a raised budget) clears it.
    paused = "paused"


class ExamMode(str, Enum):
    """How an exam's calls are sent (migration 0018)."""

    sync = "sync"  # one request at a time, by the chapter tasks (Celery or `producer run`)
    batch = "batch"  # in provider batches (runner.batching); no chapter task is published


class BatchState(str, Enum):
    """A submission's life (runner.batching). The first three are the submission protocol's
    steps: a submitter whose lease lapses in one of them is recovered by listing the
    provider's batches first (see README, "Batch mode")."""

    preparing = "preparing"  # recorded; slices claimed, calls recorded; nothing uploaded yet
    uploaded = "uploaded"  # the input file is at the provider (input_file_id)
    creating = "creating"  # the create call may have reached the provider
    submitted = "submitted"  # the provider's batch id is known: polled until it ends
    done = "done"  # the provider's batch ended and every line of it was booked
    abandoned = "abandoned"  # never created: its calls booked as not sent, $0


LIVE_BATCH_STATES = (BatchState.preparing.value, BatchState.uploaded.value,
                     BatchState.creating.value, BatchState.submitted.value)


class ChapterState(str, Enum):
    pending = "pending"
    running = "running"  # only while its lease is live; an expired lease reads as pending
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


class Withdrawn(str, Enum):
    """Why a question left its chapter's numbering (migration 0022): it stays in the database
    (for review) with `number` NULL and its old number in `withdrawn_number`, out of the
    slice's count and of every export, and its number is free for a replacement."""

    disputed = "disputed"  # the blind solve disagreed with its key (VERIFY=replace)
    rejected = "rejected"  # a reviewer rejected it


class Verdict(str, Enum):
    """What the blind solve said of a question's key (VERIFY; NULL: never verified)."""

    pending = "pending"  # stored, its solve not booked yet (sent, or to be sent)
    agreed = "agreed"  # the solver chose the key
    disputed = "disputed"  # the solver chose another choice


class VerifyPolicy(str, Enum):
    """An exam's blind-solve policy (exam.verify, migration 0029): recorded on the exam by
    `enqueue --verify`, `run --verify` or the API (the enqueuing process's VERIFY for a new
    exam that names none), and followed by every worker, whatever its own VERIFY says."""

    off = "off"  # no blind solve
    flag = "flag"  # each new question solved; a disputed one stays, marked
    # Each new question solved; a disputed one is withdrawn and replaced. (Not `replace`:
    # that name is str.replace on a str enum.)
    replace_disputed = "replace"


class CallOutcome(str, Enum):
    in_flight = "in_flight"  # recorded before the request is sent
    used = "used"  # its questions were committed
    wasted = "wasted"  # the provider answered (and billed) but nothing was kept
    failed = "failed"  # the provider failed the call (timeout, 429, 5xx, 4xx)
    # Not a request at all: questions paid for elsewhere and brought in by `producer import`
    # (model "import", cost 0). An outcome of its own, not `used`, so that `calls` and
    # `calls_used` keep counting requests the provider answered (what its invoice lists),
    # and the completion tokens per question learned from used calls for estimates are not
    # diluted by batches that cost no tokens. Outcomes are plain strings: no migration.
    imported = "imported"


class CallKind(str, Enum):
    """What a call asked for (migration 0022): NULL is generation, the call every figure of
    questions per call, tokens per question and sizing is learned from."""

    solve = "solve"  # a blind solve of stored questions (VERIFY, runner.verify)


class CallReason(str, Enum):
    """Why a call ended as it did, for the reasons that are the ledger's own. A call the
    provider failed (or whose reply was abandoned) records the provider error's kind instead
    (`examforge.errors.ErrorKind`: rate_limited, deadline, server_error, ...); the human text
    is in `detail` either way."""

    crash_before_commit = "crash_before_commit"  # its holder lost the lease mid-call
    lease_lost = "lease_lost"  # the reply came back after the lease was gone
    commit_failed = "commit_failed"  # the reply came back, the database refused the batch
    invalid_output = "invalid_output"  # the reply held no usable question (re-asked)
    unexpected = "unexpected"  # an error that is not the provider's (a bug, a shutdown)
    legacy = "legacy"  # recorded before reasons were a closed list: see `detail`


class RequeueReason(str, Enum):
    """Why the reconciler re-published a chapter (slice.requeue_code; requeue_reason holds
    the detail)."""

    worker_vanished = "worker_vanished"  # a worker took the message, then its lease expired
    broker_epoch_changed = "broker_epoch_changed"  # the broker lost every message it had
    message_lost = "message_lost"  # the queue lost this chapter's message, the epoch survived
    # Never enqueued (its `producer run` or `serve --local` died), and verdicts of its range
    # still pending: owed blind solves that no message would ever bring to a worker.
    verdicts_pending = "verdicts_pending"
    # A reviewer's rejection reopened a done slice during an open run (Store.unqueued_slices)
    # and no message was published for it.
    reopened = "reopened"
    legacy = "legacy"  # written before the code existed (migration 0024): see the detail


class ReviewState(str, Enum):
    """A question's review (Question.review)."""

    unreviewed = "unreviewed"  # as generated, or edited since it was approved
    approved = "approved"  # `export --approved-only` writes it
    rejected = "rejected"  # withdrawn from its chapter's numbering: the next enqueue replaces it
    # Approved or edited before its chapter was regenerated (`enqueue --regenerate`): kept,
    # not approved any more; `question.stale` names the change. Approve, edit or reject it.
    stale = "stale"


class RunState(str, Enum):
    """A run's state as the API reports it (derived from its exam's rows, see storage.runs)."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"
    paused = "paused"


FINAL_RUN_STATES = (RunState.done.value, RunState.failed.value, RunState.cancelled.value)


# The review's filters, in the order the page shows them (storage.review's `_bank_filter`).
FILTERS = ("disputed", "unreviewed", "edited", "stale", "approved", "rejected")
