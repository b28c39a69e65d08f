"""How much room (`max_tokens`) a call gets per question it asks.

A fixed allowance (LLM_MAX_TOKENS_PER_QUESTION, 400) is safe for any script but far above what
a reply uses (about 50 tokens a question in English): every call's budget reservation is its
worst case, so a budget near its end admits few calls at once, and a provider that charges
`max_tokens` to TPM at admission (OpenAI, Azure) lets through a fraction of its limit. Once the
database has seen enough calls, the allowance is the 95th percentile of the completion tokens
per question they used, times a margin, with a floor, and never above the fixed allowance. A
reply cut short anyway keeps its complete questions and is asked again with more room or for
fewer (runner.pipeline): truncation is the safety net, not a failure.

The history is read once per process and exam, and again every REFRESH_CALLS calls or
REFRESH_S seconds: never a query per call.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from examforge.settings import Settings

# Used calls that count as history: the exam's own once it has this many, else the model's
# (every exam of this database), else none (the fixed allowance).
HISTORY_MIN_CALLS = 10
# The newest calls read (the percentile follows the model and the prompts as they change).
HISTORY_CALLS = 200
PERCENTILE = 0.95
REFRESH_CALLS = 50
REFRESH_S = 60.0


class History(Protocol):
    def completion_history(self, slug: str, model: str | None, limit: int,
                           enough: int) -> tuple[list[float], str]: ...


@dataclass(frozen=True)
class Allowance:
    """max_tokens per question asked, and where it comes from (for logs and the ledger)."""

    per_question: int
    source: str  # "history of the exam (n calls)", "fixed", ...
    # The history's p95 with margin and floor, before the cap (None: the fixed allowance).
    sized: int | None = None

    def in_language(self, settings: Settings, tag: str | None) -> int:
        """`per_question` for a chapter written in `tag`: the fixed allowance, and the cap on
        a sized one, are LLM_MAX_TOKENS_PER_QUESTION times the language's reply_tokens (a
        Persian reply takes about three times an English one's tokens: capped at the English
        allowance, every call of a Persian chapter would be cut)."""
        fixed = fixed_allowance(settings, tag)
        return fixed if self.sized is None else min(fixed, self.sized)


def fixed_allowance(settings: Settings, tag: str | None) -> int:
    """LLM_MAX_TOKENS_PER_QUESTION for a chapter written in `tag` (None: English)."""
    from examforge.languages import language

    return math.ceil(settings.llm_max_tokens_per_question * language(tag).reply_tokens)


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (hand-written: one line, and no numpy in the worker)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def allowance(settings: Settings, history: list[float], source: str) -> Allowance:
    """The allowance `history` (completion tokens per question asked) gives."""
    fixed = settings.llm_max_tokens_per_question
    if settings.llm_max_tokens_sizing == "fixed":
        return Allowance(fixed, "fixed (LLM_MAX_TOKENS_SIZING)")
    if len(history) < HISTORY_MIN_CALLS:
        return Allowance(fixed, f"fixed: {len(history)} calls of history, "
                                f"{HISTORY_MIN_CALLS} needed")
    sized = max(settings.llm_max_tokens_floor,
                math.ceil(percentile(history, PERCENTILE) * settings.llm_max_tokens_margin))
    return Allowance(min(fixed, sized), f"p95 of the {source}'s last {len(history)} calls",
                     sized)


class Sizer:
    """Per process: the allowance of each (exam, model), read again every so often.

    `refresh` may read the database and is called outside any transaction (before a claim,
    before each call is prepared); `cached` never does, since it runs inside the store's
    transactions (a second connection there could wait on a pool its own transaction holds).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (exam, model) -> (allowance, read at, calls sized since)
        self._cache: dict[tuple[str, str | None], tuple[Allowance, float, int]] = {}
        # One reader per (exam, model) at a time: the threads that find it due together
        # (a process's first chapters) wait for that one read instead of each making it.
        self._reading: dict[tuple[str, str | None], threading.Lock] = {}

    def refresh(self, store: History, settings: Settings, exam: str,
                model: str | None) -> Allowance:
        """The allowance, read from the database when not read yet or due again."""
        key = (exam, model)
        with self._lock:
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:
            now = time.monotonic()
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None and cached[2] < REFRESH_CALLS \
                        and now - cached[1] < REFRESH_S:
                    return cached[0]
            if settings.llm_max_tokens_sizing == "fixed":
                found = allowance(settings, [], "")
            else:
                history, source = store.completion_history(exam, model, HISTORY_CALLS,
                                                           HISTORY_MIN_CALLS)
                found = allowance(settings, history, source)
            with self._lock:
                self._cache[key] = (found, now, 0)
            return found

    def cached(self, settings: Settings, exam: str, model: str | None) -> Allowance:
        """The allowance last read (the fixed one before any), counting one call sized."""
        with self._lock:
            cached = self._cache.get((exam, model))
            if cached is None:
                return allowance(settings, [], "")
            self._cache[(exam, model)] = (cached[0], cached[1], cached[2] + 1)
            return cached[0]
