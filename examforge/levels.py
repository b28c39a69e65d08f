"""A chapter's difficulty mix and Bloom levels: what each call asks for, what each question gets.

A syllabus chapter may say `difficulty: hard`, or a mix `{"easy": 0.3, "medium": 0.5,
"hard": 0.2}`, and `bloom: [apply, analyze]` (examforge.syllabus). A mix is honoured over the
chapter, not hoped for per call:

- `schedule` gives every question number of the chapter a level, so that any prefix 1..n of
  the chapter holds each level within one question of its share of n. A slice's range (or the
  whole chapter) therefore has the counts its share says, and the slices of a chapter,
  computing the same schedule, add up to the chapter's counts without talking to each other.
- each call asks for the counts its slice still lacks (`ask`): what the schedule gives its
  range, less what it has stored per level, spread over the call's questions. A model that
  labels a batch otherwise than asked is corrected by the next calls, which ask for more of
  what is missing.
- a question comes back labelled by the model; a level of the chapter's mix is kept as the
  model gave it, and a label the chapter does not allow, or none, gets the level the call asked
  for that is still most wanted (`resolve`): the call asked for it, so it is the best claim
  there is. A Bloom level the chapter does not list is dropped
  (None), unless the chapter lists only one.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from examforge.output import Question
from examforge.syllabus import BLOOM_LEVELS, DIFFICULTIES


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """`total` split over the keys in proportion to `weights` (largest remainders, ties to the
    earlier key): the counts add up to `total` exactly."""
    positive = {k: w for k, w in weights.items() if w > 0}
    if total <= 0 or not positive:
        return {k: 0 for k in weights}
    scale = sum(positive.values())
    quotas = {k: total * w / scale for k, w in positive.items()}
    counts = {k: int(q) for k, q in quotas.items()}
    left = total - sum(counts.values())
    order = sorted(positive, key=lambda k: (-(quotas[k] - counts[k]), list(weights).index(k)))
    for k in order[:left]:
        counts[k] += 1
    return {k: counts.get(k, 0) for k in weights}


@functools.lru_cache(maxsize=64)
def _levels(shares: tuple[tuple[str, float], ...], n: int) -> tuple[str, ...]:
    """The level of numbers 1..n: each next number goes to the level furthest below its
    share of the prefix so far (ties to the earlier level), which keeps every prefix within
    one question of its shares."""
    counts = dict.fromkeys((k for k, _ in shares), 0)
    out = []
    for i in range(1, n + 1):
        level = max(shares, key=lambda kv: kv[1] * i - counts[kv[0]])[0]
        counts[level] += 1
        out.append(level)
    return tuple(out)


def schedule(shares: Mapping[str, float], first: int, count: int) -> Counter[str]:
    """How many of numbers `first` .. `first + count - 1` of a chapter the mix gives each
    level (every level of the mix present, possibly at 0)."""
    levels = _levels(tuple(shares.items()), first + count - 1)
    counts = Counter(dict.fromkeys(shares, 0))
    counts.update(levels[first - 1:])
    return counts


def ask(shares: Mapping[str, float], first: int, target: int, stored: Mapping[str, int],
        want: int) -> dict[str, int]:
    """The counts per level the next call of a slice (numbers `first` .. `first + target -
    1`, `stored` of them per level) asks for, `want` questions in all."""
    wanted = schedule(shares, first, target)
    missing = {k: max(0, wanted[k] - stored.get(k, 0)) for k in shares}
    if sum(missing.values()) >= want:
        return apportion(want, missing)
    # The model labelled earlier batches otherwise than asked: what is missing first, the
    # rest by the shares.
    extra = apportion(want - sum(missing.values()), shares)
    return {k: missing[k] + extra[k] for k in shares}


@dataclass(frozen=True)
class Levels:
    """What one call asked for: the counts per difficulty (None: the chapter sets none) and
    the Bloom levels the chapter allows (empty: none)."""

    difficulty: dict[str, int] | None = None
    bloom: tuple[str, ...] = ()
    # The counts per item type it asks for (examforge.item_types; None: four-choice
    # questions only), and how many of its true/false statements are to be true.
    types: dict[str, int] | None = None
    true_count: int = 0

    def resolve(self, questions: Sequence[Question]) -> list[Question]:
        """The questions with the levels they are stored with (see the module docstring)."""
        import dataclasses

        if self.difficulty is None and not self.bloom:
            # Nothing was asked: whatever the model volunteered is not stored.
            return [dataclasses.replace(q, difficulty=None, bloom=None) for q in questions]
        # Any level of the chapter's mix, not only those this call asked for: a label the
        # model gives honestly is kept, and the next calls make up for it.
        allowed = set(self.difficulty or {})
        left = Counter(self.difficulty or {})
        for q in questions:
            if q.difficulty in allowed:
                left[q.difficulty] -= 1
        out = []
        for q in questions:
            difficulty = None
            if self.difficulty is not None:
                difficulty = q.difficulty if q.difficulty in allowed else None
                if difficulty is None:
                    # The most wanted of what was asked (ties to the earlier level).
                    difficulty = max(self.difficulty, key=lambda k: left[k])
                    left[difficulty] -= 1
            bloom = q.bloom if q.bloom in self.bloom else (
                self.bloom[0] if len(self.bloom) == 1 else None)
            out.append(dataclasses.replace(q, difficulty=difficulty, bloom=bloom))
        return out


def known_levels(q: Question) -> Question:
    """`q` keeping only labels of the two vocabularies (an imported file's, say)."""
    import dataclasses

    return dataclasses.replace(q, difficulty=q.difficulty if q.difficulty in DIFFICULTIES else None,
                               bloom=q.bloom if q.bloom in BLOOM_LEVELS else None)


def ask_types(counts: Mapping[str, int], first: int, target: int, stored: Mapping[str, int],
              want: int) -> tuple[dict[str, int], int]:
    """The counts per item type the next call of a slice asks for (as `ask` spreads
    difficulties: each number of the chapter has its type, so the slices add up to the
    chapter's counts exactly), and how many of its true/false statements are to be true:
    half, the odd one going to whichever the slice has fewer of (`stored` counts them as
    `truefalse:true` and `truefalse:false`)."""
    from examforge.item_types import shares

    asked = {k: n for k, n in ask(shares(counts), first, target, stored, want).items() if n}
    tf = asked.get("truefalse", 0)
    trues, falses = stored.get("truefalse:true", 0), stored.get("truefalse:false", 0)
    # As many true as makes the slice's true and false statements as even as can be.
    true_count = max(0, min(tf, (trues + falses + tf + 1) // 2 - trues))
    if trues > falses:
        true_count = max(0, min(tf, (trues + falses + tf) // 2 - trues))
    return asked, true_count


def lacking_types(counts: Mapping[str, int], first: int, target: int,
                  stored: Mapping[str, int]) -> dict[str, int] | None:
    """How many of each item type a slice may still store: what the schedule gives its range
    less what it holds. None when that cannot fill the slice (its counts are off: a
    question withdrawn by the blind solve, a mix changed by `--regenerate`): then any type
    is taken, so that a slice never waits for a type it will not be asked for."""
    from examforge.item_types import shares

    wanted = schedule(shares(counts), first, target)
    lacking = {k: max(0, wanted[k] - stored.get(k, 0)) for k in wanted}
    held = sum(stored.get(k, 0) for k in wanted)
    if sum(lacking.values()) < target - held:
        return None
    return lacking


def keep_types(questions: Sequence[Question],
               lacking: Mapping[str, int] | None) -> tuple[list[Question], int]:
    """The questions a slice lacking `lacking` per type takes, in reply order, and how many
    were beyond it (Rejection.surplus_type)."""
    if lacking is None:
        return list(questions), 0
    left = dict(lacking)
    kept = []
    for q in questions:
        if left.get(q.type, 0) > 0:
            left[q.type] -= 1
            kept.append(q)
    return kept, len(questions) - len(kept)


def type_counts(questions: Sequence[Question]) -> Counter[str]:
    """What `questions` add to a slice's stored counts per type (and true/false values)."""
    from examforge.item_types import load

    out: Counter[str] = Counter()
    for q in questions:
        out[q.type] += 1
        if q.type == "truefalse":
            out[f"truefalse:{'true' if load(q.answer).get('value') else 'false'}"] += 1
    return out
