"""The usage log: every chat request the mock answered, with what it would have been billed.

A reply is billed when the mock generated a completion for it (a 200), whether or not the
client read it: real providers bill a non-streamed completion the client hung up on. Error
replies, refusals by a limit and dropped connections are not billed. ``delivered`` says
whether the whole reply reached the client's socket. ``cached_tokens`` is the part of a
prompt read from the prompt cache (``mockllm.cache``), billed at the cached price.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class UsageRecord:
    time: float  # Unix time the reply was decided
    chapter: str
    model: str
    status: int | None  # None: no HTTP reply at all (the connection was reset)
    outcome: str
    prompt_tokens: int
    completion_tokens: int
    billed: bool
    delivered: bool
    request_id: str
    finish_reason: str | None = None
    max_tokens: int | None = None
    batch_id: str | None = None
    custom_id: str | None = None
    # Of prompt_tokens, those read from the prompt cache (billed at the cached price).
    cached_tokens: int = 0
    # The tier the reply reported (default, flex, priority); None when the request was not read.
    service_tier: str | None = None

    @property
    def batch(self) -> bool:
        return self.batch_id is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageRecord:
        """A record from its ``to_dict`` form (a line of ``GET /_usage``); derived keys are dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def to_dict(self) -> dict[str, Any]:
        # "paid" is "billed" under the name the batch tests use: a line the provider charges for.
        return {**dataclasses.asdict(self), "batch": self.batch, "paid": self.billed}


class UsageLog:
    """The records and their billed totals."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self.billed_calls = 0
        self.billed_undelivered_calls = 0
        self.billed_prompt_tokens = 0
        self.billed_completion_tokens = 0
        self.billed_cached_tokens = 0
        self.billed_batch_tokens = 0
        self.billed_flex_tokens = 0
        self.billed_tokens_by_chapter: Counter[str] = Counter()

    @property
    def billed_tokens(self) -> int:
        return self.billed_prompt_tokens + self.billed_completion_tokens

    def add(self, record: UsageRecord) -> None:
        self.records.append(record)
        if not record.billed:
            return
        tokens = record.prompt_tokens + record.completion_tokens
        self.billed_calls += 1
        self.billed_undelivered_calls += not record.delivered
        self.billed_prompt_tokens += record.prompt_tokens
        self.billed_completion_tokens += record.completion_tokens
        self.billed_cached_tokens += record.cached_tokens
        self.billed_tokens_by_chapter[record.chapter] += tokens
        if record.batch:
            self.billed_batch_tokens += tokens
        elif record.service_tier == "flex":
            self.billed_flex_tokens += tokens

    def totals(self) -> dict[str, Any]:
        """The billed totals, as they appear in the stats."""
        return {
            "billed_calls": self.billed_calls,
            "billed_undelivered_calls": self.billed_undelivered_calls,
            "billed_prompt_tokens": self.billed_prompt_tokens,
            "billed_completion_tokens": self.billed_completion_tokens,
            "billed_cached_tokens": self.billed_cached_tokens,
            "billed_tokens": self.billed_tokens,
            "billed_batch_tokens": self.billed_batch_tokens,
            "billed_flex_tokens": self.billed_flex_tokens,
            "billed_tokens_by_chapter": dict(self.billed_tokens_by_chapter),
        }

    def to_list(self) -> list[dict[str, Any]]:
        return [record.to_dict() for record in self.records]

    def bill_usd(self, prompt_per_mtok: float, completion_per_mtok: float,
                 cached_prompt_per_mtok: float, *, batch_factor: float = 1.0, flex_factor: float = 1.0) -> float:
        """What the billed calls cost at these prices, as a provider bills them: a prompt's
        uncached tokens at the prompt price, its cached tokens at the cached price, a batch
        line's cost times ``batch_factor`` and a flex call's times ``flex_factor`` (OpenAI: 0.5
        for both). Computed here on its own (not with examforge's Price), so a test can compare
        the two."""
        total = 0.0
        for r in self.records:
            if r.billed:
                factor = batch_factor if r.batch else flex_factor if r.service_tier == "flex" else 1.0
                total += factor * ((r.prompt_tokens - r.cached_tokens) * prompt_per_mtok
                                   + r.cached_tokens * cached_prompt_per_mtok
                                   + r.completion_tokens * completion_per_mtok) / 1_000_000
        return total
