"""The store: every state change of an exam goes through here, in one transaction each.

The unit of work is a slice of a chapter: a fixed range of its question numbers (see
`storage.models.Slice`); a chapter is done when all of its slices are.

The rules it enforces:
- a slice is worked on only by the holder of its lease (owner token + expiry on the database
  clock); claims are conditional UPDATEs, so two workers can never both win;
- a batch of questions is committed only while the lease is still held (fencing): a worker that
  was frozen past its lease changes zero rows and its call is recorded as wasted;
- UNIQUE(exam, chapter_id, number) makes a double commit impossible even if the rest failed
  (slices' ranges are disjoint), and UNIQUE(exam, chapter_id, norm_hash) makes storing one
  question twice impossible, whichever slices race;
- every paid call is a row written before the request is sent, so a crash leaves it in_flight
  and the next claim explains it as wasted.

It is split by concept, one module each: `planning` (what the producer records and enqueues),
`leases` (claims, the heartbeat, hand-backs), `ledger` (paid calls, budgets, committed
batches), `recovery` (what the reconciler finds), `reports` (status and exports), `imports`
(questions paid for elsewhere), `runs` (the HTTP API's runs and stored syllabi), `verdicts` (questions withdrawn from
the numbering, the blind solve's verdicts), `review` (a person's approve, reject and edit,
with versions and history), `access` (the API's named tokens and the audit) and
`housekeeping` (pruning finished exams), on top of `base`
(the tables, the database clock and the lease fence) and `types` (the value types they take
and return, re-exported here).
"""

from __future__ import annotations

from storage.access import Access, AuditRow, TokenRow
from storage.base import ACTIVE_STATES, BUDGET_PAUSE_PREFIX, E, K, Q, S, slice_where
from storage.batches import Batches
from storage.grounding import Grounding
from storage.housekeeping import Housekeeping
from storage.identity import Identity
from storage.imports import Imports
from storage.planning import DEFAULT_SLICE_QUESTIONS, EnqueuePlan, Planning, SliceRef
from storage.models import RequeueReason
from storage.recovery import LostAudit, Orphan, Recovery, SliceKey
from storage.reports import Reports
from storage.review import ChapterReview, Review
from storage.runs import RunActivity, RunEvent, RunRow, Runs
from storage.verdicts import Judged, Pending, Verdicts, Withdrawal
from storage.models import Verdict, Withdrawn
from storage.types import (BatchRow, CallPlan, ChapterView, Claimed, Committed, FirstCall, NoRoom, NotClaimed,
                           NotClaimedReason, Planner, SendCheck, Steer, Usage, owner_of,
                           submission_of)


class Store(Planning, Recovery, Reports, Imports, Housekeeping, Runs, Identity, Batches,
            Grounding, Review, Access):
    """All database access for exams, chapters, questions and calls."""


__all__ = ["ACTIVE_STATES", "Access", "AuditRow", "TokenRow", "BUDGET_PAUSE_PREFIX", "BatchRow", "Batches", "ChapterReview", "Review", "DEFAULT_SLICE_QUESTIONS", "CallPlan", "FirstCall",
           "ChapterView", "Claimed", "Committed", "E", "EnqueuePlan", "Grounding", "K", "LostAudit",
           "NoRoom", "NotClaimed", "NotClaimedReason", "Orphan", "Planner", "Q",
           "RequeueReason", "RunActivity", "RunEvent", "RunRow", "S", "SendCheck", "SliceKey", "SliceRef",
           "Judged", "Pending", "Steer", "Store", "Usage", "Verdict", "Withdrawal", "Withdrawn", "owner_of",
           "slice_where", "submission_of"]
