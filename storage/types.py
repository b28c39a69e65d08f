"""The store's value types: what its methods take and return (claims, plans, usage, views,
submissions), in one module with no SQL in it, so that the runner, the store's modules and the
tests all name the same classes, and none of the store's modules needs to import another
only for a type. `storage.store` re-exports them for its callers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from examforge.languages import DEFAULT_LANGUAGE
from examforge.sources import Passage
from storage.base import fence_params, slice_where
# A submission (BatchRow) and the lease owner of its slices: with the reports' values, which
# import no SQLAlchemy (storage.report_types); named here as well.
from storage.report_types import OWNER_PREFIX, BatchRow, owner_of, submission_of

# What a prompt lists of the chapter's stored questions, by default (AVOID_QUESTIONS).
DEFAULT_AVOID_QUESTIONS = 40


@dataclass(frozen=True)
class Usage:
    """What one call consumed, as booked in the ledger."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    endpoint: str | None = None  # "primary" or "fallback"
    estimated: bool = False  # our own count: the provider sent none, or never replied
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    # The processing tier the reply says served the call (its cost is priced at it); None
    # when the reply named none, or there was no reply.
    service_tier: str | None = None


@dataclass(frozen=True)
class NoRoom:
    """A call's worst case does not fit in what is left of the exam's budget."""

    budget_usd: float
    spent_usd: float
    reserved_usd: float  # by the calls in flight (their real cost may turn out lower)
    needed_usd: float
    # Calls of the exam in flight under a live lease of their own holder (those of dead
    # holders were settled first): only these can free room by settling below their worst
    # case, so only these are worth waiting for.
    in_flight: int = 0

    @property
    def headroom_usd(self) -> float:
        return max(0.0, self.budget_usd - self.spent_usd - self.reserved_usd)


class SendCheck(str, Enum):
    """What `Ledger.may_send` found right before a recorded call goes out."""

    send = "send"
    cancelled = "cancelled"  # the slice was cancelled: the call was booked as not sent
    lost = "lost"  # the lease is gone: the call was booked as not sent


@dataclass(frozen=True)
class Committed:
    stored: int  # in the slice's range
    target: int  # the slice's
    # The next call, recorded in the commit's own transaction when the caller planned one.
    next_call: int | NoRoom | None = None
    # The questions of the batch that another slice of the chapter had stored first (dropped),
    # and the chapter's latest stored questions, all slices, read right after the commit
    # (PostgreSQL's one-round-trip commit: in it).
    duplicates: int = 0
    recent: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()  # the texts of the questions this commit stored
    near_duplicates: int = 0  # of `duplicates`, those dropped as near-duplicates
    surplus: int = 0  # new questions beyond what the slice lacked (not stored, not repeats)
    # The slice was cancelled while the call ran: its questions are stored, nothing more is
    # planned, and the lease is given up.
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return self.stored >= self.target


@dataclass(frozen=True)
class ChapterLevels:
    """A chapter's `difficulty` (as shares) and `bloom` from its slice row, and the slice's
    stored questions per difficulty when it was read (examforge.levels)."""

    difficulty: dict[str, float] | None = None
    bloom: tuple[str, ...] = ()
    stored: dict[str, int] = dataclasses.field(default_factory=dict)
    # The chapter's counts per item type (slice.types; None: all mcq), and the slice's
    # stored questions per type, with its true/false statements as `truefalse:true` and
    # `truefalse:false` (examforge.levels.type_counts).
    types: dict[str, int] | None = None
    stored_types: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_row(cls, difficulty: str | None, bloom: str | None,
                 types: str | None = None) -> "ChapterLevels":
        value = json.loads(difficulty) if difficulty else None
        shares = {value: 1.0} if isinstance(value, str) else value
        return cls(shares, tuple(json.loads(bloom)) if bloom else (),
                   types=json.loads(types) if types else None)


def count_types(pairs: Any) -> dict[str, int]:
    """A slice's stored questions per type (and true/false value), from (type, answer) rows."""
    counts: dict[str, int] = {}
    for kind, answer in pairs:
        kind = kind or "mcq"
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "truefalse":
            value = "true" if answer and json.loads(answer).get("value") else "false"
            counts[f"truefalse:{value}"] = counts.get(f"truefalse:{value}", 0) + 1
    return counts


@dataclass(frozen=True)
class ChapterView:
    """What a planner sees of a chapter, inside the transaction that frees its next call."""

    exam: str
    chapter_id: str
    exam_title: str
    title: str
    prompt: str | None
    stored: int  # in the slice's range
    target: int  # the slice's
    slice_no: int = 0
    first_number: int = 1
    chapter_target: int = 0
    recent: tuple[str, ...] = ()  # the chapter's latest stored questions, all slices
    levels: ChapterLevels = ChapterLevels()
    # The chapter's course material (examforge.sources), read by the claim: none without
    # sources.
    passages: tuple[Passage, ...] = ()
    # The language its questions are written in (a BCP 47 tag, slice.language).
    language: str = DEFAULT_LANGUAGE

    @property
    def next_number(self) -> int:
        """The number the next stored question of the slice gets."""
        return self.first_number + self.stored


@dataclass(frozen=True)
class FirstCall:
    """A slice's first call planned before its claim (Leases.fresh_view): the plan, and the
    fingerprint of the spec it was planned from, which the claim checks (PostgreSQL's
    `ef_spec_fp`, SQLite's `storage.leases.spec_fingerprint`)."""

    plan: CallPlan
    fingerprint: str
    # Whether the call is still wanted when the claim would record it (the worker is not
    # stopping); None: always. A plan no longer wanted is let go and `plan_first` decides.
    wanted: Callable[[], bool] | None = dataclasses.field(default=None, compare=False)


@dataclass(frozen=True)
class Steer:
    """What the next prompts list of the chapter's stored questions: at most `avoid` of them,
    chosen over the whole chapter (`chapter`, storage.neardup.steering) or the newest only
    (`recent`: what examforge did before)."""

    avoid: int = DEFAULT_AVOID_QUESTIONS
    mode: str = "chapter"


@dataclass(frozen=True)
class CallPlan:
    """A call to record (and reserve against the budget) before it is sent."""

    first_number: int
    requested: int
    prompt_tokens: int = 0
    max_tokens: int | None = None
    reserve_usd: float = 0.0
    model: str | None = None
    price_known: bool = True
    kind: str | None = None  # storage.models.CallKind; None for generation


# Called inside a write transaction (the claim, or a batch's commit) with the chapter as it now
# stands: returns the next call to record in that same transaction, or None for none (the
# chapter is complete, or the rate limiter asks to wait, which must happen outside it).
Planner = Callable[[ChapterView], "CallPlan | None"]


@dataclass(frozen=True)
class Claimed:
    exam: str
    chapter_id: str
    owner: str
    attempt: int
    target: int
    stored: int
    known: frozenset[str]
    exam_title: str
    title: str
    prompt: str | None
    attempts_since_progress: int = 1
    took_over_calls: int = 0
    # The first call, recorded in the claim's own transaction when the caller planned one:
    # its id, NoRoom (the budget has no room for it), or None (nothing planned).
    first_call: int | NoRoom | None = None
    # The slice: `target` and `stored` count its range, from `first_number`; `chapter_target`
    # is the whole chapter's. `recent`: the chapter's latest stored questions, all slices.
    slice_no: int = 0
    first_number: int = 1
    chapter_target: int = 0
    recent: tuple[str, ...] = ()
    # The chapter's levels (examforge.levels) and the slice's stored questions per difficulty.
    levels: ChapterLevels = ChapterLevels()
    # The exam's near-duplicate index epoch at the claim (storage.neardup): what the
    # one-round-trip commit's check trusts its in-memory index against.
    index_epoch: int | None = None
    # The chapter's passages, read by the claim when the slice has sources.
    passages: tuple[Passage, ...] = ()
    # The exam's blind-solve policy (exam.verify: off, flag, replace), read by the claim:
    # the holder follows it, whatever its own VERIFY says.
    verify: str = "off"
    # The chapter's language (slice.language): what its prompts ask for and replies are
    # validated in.
    language: str = DEFAULT_LANGUAGE

    def view(self, stored: int | None = None, target: int | None = None) -> ChapterView:
        return ChapterView(self.exam, self.chapter_id, self.exam_title, self.title, self.prompt,
                           self.stored if stored is None else stored,
                           self.target if target is None else target,
                           self.slice_no, self.first_number,
                           self.chapter_target or self.target, self.recent, self.levels,
                           self.passages, self.language)

    def where(self) -> tuple[Any, ...]:
        """The conditions that select this claim's slice row."""
        return slice_where(self.exam, self.chapter_id, self.slice_no)

    def fence_params(self) -> dict[str, Any]:
        """The bind parameters of this claim's lease fence (storage.base.lease_fence)."""
        return fence_params(self.exam, self.chapter_id, self.slice_no, self.owner)


class NotClaimedReason(str, Enum):
    done = "done"
    failed = "failed"
    cancelled = "cancelled"
    paused = "paused"  # the exam is paused
    busy = "busy"  # another worker holds a live lease
    backoff = "backoff"  # its backoff has not ended
    missing = "missing"  # no such chapter
    cap = "cap"  # it reached its attempt cap: failed now


@dataclass(frozen=True)
class NotClaimed:
    """Why a chapter was not claimed. `retry_in_s` is set when checking back later makes sense."""

    reason: NotClaimedReason
    retry_in_s: float | None = None
    detail: str = ""
    holder: str | None = None  # busy: the lease owner (a provider batch's: submission_of)
