"""Counters, stats, fault draws and the question history of one mock.

Only ever touched from the event loop thread (``MockServer`` hops onto it).
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from typing import Any

from examforge.output import normalise
from mockllm import corpora, questions
from mockllm.config import MockConfig
from mockllm.faults import OK
from mockllm.limits import RateLimiter
from mockllm.prompt import ChatPrompt
from mockllm.replies import Content, Item
from mockllm.cache import PromptCache
from mockllm.usage import UsageLog, UsageRecord

RETRY_AFTER_TOLERANCE_S = 0.05
_LIMITER_FIELDS = frozenset({"rpm", "tpm", "burst_fraction"})


class MockState:
    """Config, counters and fault draws; only ever touched from the event loop thread."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self._seed_draws()
        # Lifetime state, deliberately kept across /_reset so texts never repeat.
        self.serials: Counter[str] = Counter()
        self.first_served: dict[str, dict[str, Any]] = {}
        self.served: dict[str, dict[int, str]] = {}  # chapter -> serial -> text, as delivered
        self._reword_debt: dict[str, float] = {}  # fractions of a rewording carried over
        self._reword_variants: Counter[str] = Counter()
        self.completion_seq = 0
        self.wrong_schema_seq = 0
        # Live state, also kept across /_reset (requests may be in flight).
        self.inflight = 0
        self.inflight_by_chapter: Counter[str] = Counter()
        self._zero_stats()

    def _seed_draws(self) -> None:
        self.rng = random.Random(self.config.seed)
        # A separate stream, so turning rewording on leaves the seeded fault draws unchanged.
        self.reword_rng = random.Random(f"reword:{self.config.seed}")
        # Flex refusals draw from their own stream too: the fault draws stay as they were.
        self.flex_rng = random.Random(f"flex:{self.config.seed}")
        self.latency_rng = random.Random(f"latency:{self.config.seed}")

    def _zero_stats(self) -> None:
        self.started = time.monotonic()
        self.calls_total = 0
        self.batch_calls_total = 0
        self.calls_by_chapter: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.outcomes_by_chapter: dict[str, Counter[str]] = {}
        self.max_inflight = self.inflight
        self.max_inflight_by_chapter: dict[str, int] = {k: v for k, v in self.inflight_by_chapter.items() if v}
        self.retry_after_violations: list[dict[str, Any]] = []
        self.questions_served_by_chapter: Counter[str] = Counter()
        self.not_before: dict[str, float] = {}
        self.admitted_at: list[float] = []
        self.rate_limited_by_type: Counter[str] = Counter()
        self.rewordings: list[dict[str, Any]] = []
        self.rewordings_by_chapter: Counter[str] = Counter()
        self.rewordings_avoided_by_chapter: Counter[str] = Counter()
        self.cut_at_max_tokens = 0
        self.schema_prevented = 0
        # Blind solves answered (mockllm.solve), the questions in them, and the answers the
        # solver's error rate made wrong.
        self.solves = 0
        self.solved_questions = 0
        self.solver_errors = 0
        self.solved_with_passage = 0
        self.batch_creates_lost = 0
        self.batch_uploads_failed = 0
        self.usage = UsageLog()
        self.prompt_cache = PromptCache()
        self.limiter = self._new_limiter()

    def _new_limiter(self) -> RateLimiter:
        return RateLimiter(self.config.rpm, self.config.tpm, self.config.burst_fraction)

    def reset(self) -> None:
        """Zero the stats, the usage log and the buckets, drop scripts, re-seed the draws."""
        self._zero_stats()
        self.config.script.clear()
        self._seed_draws()

    def update_config(self, updates: dict[str, Any]) -> MockConfig:
        """Apply a partial config update (validated as a whole before it takes effect)."""
        self.config = self.config.updated(updates)
        if "seed" in updates:
            self._seed_draws()
        if _LIMITER_FIELDS & set(updates):
            self.limiter = self._new_limiter()
        return self.config

    # ---- calls and outcomes

    def begin_call(self, key: str, requester: str | None = None) -> None:
        """Count an HTTP chat call, track concurrency and check the Retry-After promise made
        to its requester (the chapter, or the part of it a slice asks for)."""
        self.calls_total += 1
        self.calls_by_chapter[key] += 1
        self.inflight += 1
        self.inflight_by_chapter[key] += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self.max_inflight_by_chapter[key] = max(self.max_inflight_by_chapter.get(key, 0), self.inflight_by_chapter[key])
        self._check_retry_after(requester or key)

    def begin_batch_call(self, key: str) -> None:
        """Count a request of a batch (no connection, so no concurrency or Retry-After)."""
        self.calls_total += 1
        self.batch_calls_total += 1
        self.calls_by_chapter[key] += 1

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

    def promise_retry_after(self, key: str, seconds: float) -> None:
        self.not_before[key] = time.monotonic() + seconds

    def record_admission(self) -> None:
        self.admitted_at.append(time.monotonic() - self.started)

    def record_rate_limited(self, limit_type: str) -> None:
        self.rate_limited_by_type[limit_type] += 1

    def record_usage(self, record: UsageRecord) -> None:
        self.usage.add(record)

    # ---- questions

    def mint_items(self, prompt: ChatPrompt, count: int) -> list[Item]:
        """The questions of one reply: new serials, and ``reword_rate`` of them paraphrases."""
        key = prompt.key
        position = self.config.answer_position
        reworded = self._rewordings_due(key, count, prompt.avoid)
        items = []
        for _ in range(count - len(reworded)):
            self.serials[key] += 1
            serial = self.serials[key]
            made = (questions.make_question(key, prompt.title, serial, position)
                    if prompt.language == "en" else
                    corpora.make_question(prompt.language, key, prompt.title, serial, position))
            items.append(Item(self._keyed(made, key, serial), serial))
        for of_serial in reworded:
            variant = self._reword_variants[key]
            self._reword_variants[key] += 1
            again = (questions.reword(key, prompt.title, of_serial, variant, position)
                     if prompt.language == "en" else
                     corpora.reword(prompt.language, key, prompt.title, of_serial, variant,
                                    position))
            question = self._keyed(again, key, of_serial)
            items.insert(self.reword_rng.randrange(len(items) + 1), Item(question, of_serial, of_serial))
        return items

    def _keyed(self, question: dict[str, Any], key: str, serial: int) -> dict[str, Any]:
        """The question with a wrong key for ``wrong_key_rate`` of the serials."""
        return questions.with_wrong_key(question, key, serial, self.config.seed,
                                        self.config.wrong_key_rate)

    def _rewordings_due(self, key: str, count: int, avoid: frozenset[str] = frozenset()) -> list[int]:
        """Which served serials this reply paraphrases: a running share of ``reword_rate``.

        How the mock models a model's repeats (a modelling choice, documented in README):
        each question of a reply is, with probability ``reword_rate``, one the model has
        written before, drawn with weight 1/serial, so its first, most obvious questions come
        back most often, as a model's favourites do. A question the prompt's "do not repeat"
        list shows is avoided with probability ``avoid_compliance`` (a new question is
        written instead): a model told what to avoid mostly avoids it, and never avoids what
        it was not shown. The mock does not remember what it served in deciding this, beyond
        the draw itself: a real model has no memory across calls either."""
        rate = self.config.reword_rate
        if rate <= 0 or count <= 0:
            return []
        self._reword_debt[key] = self._reword_debt.get(key, 0.0) + count * rate
        due = int(self._reword_debt[key] + 1e-9)
        self._reword_debt[key] -= due
        served = self.served.get(key, {})
        serials = sorted(served)
        due = min(due, count, len(serials))
        if not due:
            return []
        weights = [1.0 / s for s in serials]
        picked: list[int] = []
        for serial in self.reword_rng.choices(serials, weights, k=due):
            if serial in picked:
                continue
            if normalise(served[serial]) in avoid and self.reword_rng.random() < self.config.avoid_compliance:
                self.rewordings_avoided_by_chapter[key] += 1
                continue
            picked.append(serial)
        return picked

    def next_completion_id(self) -> str:
        self.completion_seq += 1
        return f"chatcmpl-mock-{self.completion_seq}"

    def next_wrong_schema_variant(self) -> int:
        self.wrong_schema_seq += 1
        return self.wrong_schema_seq - 1

    def record_delivery(self, key: str, content: Content) -> None:
        """Remember what reached the client: served questions and paraphrases of them."""
        served = self.served.setdefault(key, {})
        self.questions_served_by_chapter[key] += len(content.fresh)
        for item in content.fresh:
            served[item.serial] = item.question["question"]
        if content.fresh and key not in self.first_served:
            self.first_served[key] = copy.deepcopy(content.fresh[0].question)
        for item in content.rewordings:
            self.rewordings_by_chapter[key] += 1
            self.rewordings.append({
                "chapter": key,
                "of_serial": item.of_serial,
                "question": item.question["question"],
                "original": served.get(item.serial),
            })

    # ---- stats

    def max_admitted_in(self, window_s: float) -> int:
        """The most requests admitted within any ``window_s`` seconds (a sliding window)."""
        best, start = 0, 0
        times = self.admitted_at
        for end, t in enumerate(times):
            while t - times[start] >= window_s:
                start += 1
            best = max(best, end - start + 1)
        return best

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready copy of the stats (``GET /_stats``), zeroed by ``/_reset``.

        Calls: ``calls_total`` (HTTP chat calls and batch requests), ``batch_calls_total``,
        ``calls_by_chapter``, ``outcomes`` and ``outcomes_by_chapter`` (see ``mockllm.faults``),
        ``inflight``, ``max_inflight``, ``max_inflight_by_chapter``, ``retry_after_violations``
        (a chapter called again before the Retry-After of its injected 429 or the retry-after-ms
        of its rate limit: ``{"chapter", "early_by_s"}``; for a request naming its part of the
        chapter, a slice's "Question numbers", the chapter reads ``"exam/chapter#101-150"``).
        Content: ``questions_served_by_chapter`` (new well-formed questions delivered),
        ``rewordings_by_chapter`` and ``rewordings`` (each delivered paraphrase:
        ``{"chapter", "of_serial", "question", "original"}``), ``rewordings_avoided_by_chapter``
        (paraphrases drawn of a question the prompt listed, written as new ones instead),
        ``cut_at_max_tokens``, ``schema_prevented`` (faults drawn for a request under a JSON
        schema that a constrained decoder cannot produce, served as ``ok``: see
        ``mockllm.faults.SCHEMA_PREVENTED``). Blind solves (mockllm.solve): ``solves`` (replies with
        answers), ``solved_questions`` (answers in them), ``solver_errors`` (of those, the ones
        ``solver_error_rate`` made wrong), ``solved_with_passage`` (questions shown with a
        passage of the course material).
        Rate limits: ``admitted_total``, ``admitted_at`` (seconds since the reset at which each
        request passed the limiter), ``max_admitted_in_1s`` (the busiest 1-second window),
        ``rate_limited_by_type`` (``requests``/``tokens``).
        Spend: ``billed_calls``, ``billed_undelivered_calls``, ``billed_prompt_tokens``,
        ``billed_completion_tokens``, ``billed_tokens``, ``billed_batch_tokens``, ``billed_flex_tokens``,
        ``billed_tokens_by_chapter``.
        Batch faults: ``batch_creates_lost`` (creates whose reply was dropped, the batch made),
        ``batch_uploads_failed`` (batch uploads refused with a 500, nothing stored).
        """
        return {
            "calls_total": self.calls_total,
            "batch_calls_total": self.batch_calls_total,
            "calls_by_chapter": dict(self.calls_by_chapter),
            "outcomes": dict(self.outcomes),
            "outcomes_by_chapter": {key: dict(counts) for key, counts in self.outcomes_by_chapter.items()},
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "max_inflight_by_chapter": dict(self.max_inflight_by_chapter),
            "retry_after_violations": [dict(v) for v in self.retry_after_violations],
            "questions_served_by_chapter": dict(self.questions_served_by_chapter),
            "rewordings_by_chapter": dict(self.rewordings_by_chapter),
            "rewordings_avoided_by_chapter": dict(self.rewordings_avoided_by_chapter),
            "rewordings": [dict(r) for r in self.rewordings],
            "cut_at_max_tokens": self.cut_at_max_tokens,
            "schema_prevented": self.schema_prevented,
            "solves": self.solves,
            "solved_questions": self.solved_questions,
            "solver_errors": self.solver_errors,
            "solved_with_passage": self.solved_with_passage,
            "batch_creates_lost": self.batch_creates_lost,
            "batch_uploads_failed": self.batch_uploads_failed,
            "admitted_total": len(self.admitted_at),
            "admitted_at": [round(t, 4) for t in self.admitted_at],
            "max_admitted_in_1s": self.max_admitted_in(1.0),
            "rate_limited_by_type": dict(self.rate_limited_by_type),
            **self.usage.totals(),
        }

    def latency(self, base_s: float) -> float:
        """A reply's latency: `base_s`, spread by `latency_spread` (its own seeded draws)."""
        spread = self.config.latency_spread
        if spread <= 0:
            return base_s
        return base_s * self.latency_rng.uniform(1 - spread, 1 + spread)
