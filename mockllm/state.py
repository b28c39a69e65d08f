"""Counters, stats and fault draws of one mock; touched only from the event loop thread."""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from typing import Any

from mockllm.config import MockConfig
from mockllm.faults import OK
from mockllm.prompt import ChatPrompt
from mockllm.replies import make_question

RETRY_AFTER_TOLERANCE_S = 0.05


class MockState:
    """Config, counters and fault draws; only ever touched from the event loop thread."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        # Lifetime state, deliberately kept across /_reset so texts never repeat.
        self.serials: Counter[str] = Counter()
        self.first_served: dict[str, dict[str, Any]] = {}
        self.completion_seq = 0
        self.wrong_schema_seq = 0
        # Live state, also kept across /_reset (requests may be in flight).
        self.inflight = 0
        self.inflight_by_chapter: Counter[str] = Counter()
        self._zero_stats()

    def _zero_stats(self) -> None:
        self.calls_total = 0
        self.calls_by_chapter: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.outcomes_by_chapter: dict[str, Counter[str]] = {}
        self.max_inflight = self.inflight
        self.max_inflight_by_chapter: dict[str, int] = {k: v for k, v in self.inflight_by_chapter.items() if v}
        self.retry_after_violations: list[dict[str, Any]] = []
        self.questions_served_by_chapter: Counter[str] = Counter()
        self.not_before: dict[str, float] = {}

    def reset(self) -> None:
        """Zero the stats, drop scripts and re-seed so a new run draws the same faults."""
        self._zero_stats()
        self.config.script.clear()
        self.rng = random.Random(self.config.seed)

    def update_config(self, updates: dict[str, Any]) -> MockConfig:
        """Apply a partial config update (validated as a whole before it takes effect)."""
        self.config = self.config.updated(updates)
        if "seed" in updates:
            self.rng = random.Random(self.config.seed)
        return self.config

    def begin_call(self, key: str) -> None:
        """Count a chat call, track concurrency and check the Retry-After promise."""
        self.calls_total += 1
        self.calls_by_chapter[key] += 1
        self.inflight += 1
        self.inflight_by_chapter[key] += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self.max_inflight_by_chapter[key] = max(self.max_inflight_by_chapter.get(key, 0), self.inflight_by_chapter[key])
        self._check_retry_after(key)

    def _check_retry_after(self, key: str) -> None:
        not_before = self.not_before.get(key)
        if not_before is None:
            return
        now = time.monotonic()
        if now < not_before - RETRY_AFTER_TOLERANCE_S:
            self.retry_after_violations.append({"chapter": key, "early_by_s": round(not_before - now, 3)})
        else:
            del self.not_before[key]

    def end_call(self, key: str) -> None:
        self.inflight -= 1
        self.inflight_by_chapter[key] -= 1
        if not self.inflight_by_chapter[key]:
            del self.inflight_by_chapter[key]

    def next_outcome(self, key: str) -> str:
        """Scripted outcome for this chapter if any, else a seeded random draw."""
        scripted = self.config.script.get(key)
        if scripted:
            outcome = scripted.pop(0)
            if not scripted:
                del self.config.script[key]
            return outcome
        config = self.config
        if config.fault_rate > 0 and config.faults and self.rng.random() < config.fault_rate:
            return self.rng.choice(config.faults)
        return OK

    def record_outcome(self, key: str, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.outcomes_by_chapter.setdefault(key, Counter())[outcome] += 1

    def promise_retry_after(self, key: str, seconds: int) -> None:
        self.not_before[key] = time.monotonic() + seconds

    def mint_questions(self, prompt: ChatPrompt, count: int) -> list[dict[str, Any]]:
        questions = []
        for _ in range(count):
            self.serials[prompt.key] += 1
            questions.append(make_question(prompt.chapter_id, prompt.title, self.serials[prompt.key]))
        return questions

    def next_completion_id(self) -> str:
        self.completion_seq += 1
        return f"chatcmpl-mock-{self.completion_seq}"

    def next_wrong_schema_variant(self) -> int:
        self.wrong_schema_seq += 1
        return self.wrong_schema_seq - 1

    def record_delivery(self, key: str, fresh: list[dict[str, Any]]) -> None:
        self.questions_served_by_chapter[key] += len(fresh)
        if fresh and key not in self.first_served:
            self.first_served[key] = copy.deepcopy(fresh[0])

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready copy of the stats."""
        return {
            "calls_total": self.calls_total,
            "calls_by_chapter": dict(self.calls_by_chapter),
            "outcomes": dict(self.outcomes),
            "outcomes_by_chapter": {key: dict(counts) for key, counts in self.outcomes_by_chapter.items()},
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "max_inflight_by_chapter": dict(self.max_inflight_by_chapter),
            "retry_after_violations": [dict(v) for v in self.retry_after_violations],
            "questions_served_by_chapter": dict(self.questions_served_by_chapter),
        }
