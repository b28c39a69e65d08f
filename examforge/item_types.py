"""The kinds of item a chapter asks for (its `types`), and each kind's shape and rules.

A chapter's questions are four-choice, single-answer ones (`mcq`) unless its syllabus entry
gives `types`: counts per kind that add up to its `questions` (examforge.syllabus). The five
kinds, as a reply gives them and as they are stored:

| type | reply fields | stored `choices` | stored `answer` (JSON) |
|---|---|---|---|
| `mcq` | `choices` (4), `answer_index` | the 4 choices | NULL (`answer_index`) |
| `multi` | `choices` (4-6), `correct` (indices, 2 or more, not all) | the choices | `{"correct": [..]}` |
| `truefalse` | `answer` (true or false) | `[]` | `{"value": true}` |
| `short` | `accepted` (1-5 answers) | `[]` | `{"accepted": [..]}` |
| `numeric` | `value`, `tolerance`, `relative`, `unit` | `[]` | `{"value", "tolerance", "relative", "unit"}` |

A stored item that is not an `mcq` has `answer_index` -1: an index into nothing, so that a
reader that forgets to look at `type` fails loudly rather than showing choice A as the key.

Each malformed form is refused with its own reason (examforge.errors.Rejection), so a model
that gets one kind wrong shows which in the ledger's notes.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from examforge.errors import Rejection

MCQ = "mcq"
ITEM_TYPES = (MCQ, "multi", "truefalse", "short", "numeric")
NO_INDEX = -1  # the answer_index of an item that is not an mcq
MULTI_CHOICES = (4, 6)  # the fewest and most choices of a `multi`
MAX_ACCEPTED = 5  # accepted answers of a `short`
MAX_SHORT_CHARS = 200  # one accepted answer
# What the prompt says each kind is, in the counts line of a call.
DESCRIPTIONS = {
    MCQ: "four choices, one correct",
    "multi": "select all that apply",
    "truefalse": "a statement that is true or false",
    "short": "a short answer",
    "numeric": "a numerical answer",
}


class TypeInvalid(ValueError):
    """Raised by `check_answer` for an item of a known type whose answer fields are not that
    type's form: `reason` is the type's own Rejection, `field` the field at fault."""

    def __init__(self, reason: Rejection, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.reason = reason
        self.field = field
        self.detail = detail


REASONS = {"multi": Rejection.bad_multi, "truefalse": Rejection.bad_truefalse,
           "short": Rejection.bad_short, "numeric": Rejection.bad_numeric}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def check_answer(kind: str, item: Mapping[str, Any],
                 normalise: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The stored choices and answer of an item of type `kind` (not `mcq`), from a reply's
    or an import's object; raises TypeInvalid. `normalise` is examforge.output.normalise
    (passed in: this module sits below it)."""
    reason = REASONS[kind]
    if kind == "multi":
        choices, correct = item.get("choices"), item.get("correct")
        low, high = MULTI_CHOICES
        if not isinstance(choices, list) or not low <= len(choices) <= high:
            raise TypeInvalid(reason, "choices", f"must be a list of {low} to {high} strings")
        if any(not isinstance(c, str) or not c.strip() for c in choices):
            raise TypeInvalid(reason, "choices", "every choice must be a non-empty string")
        if len({normalise(c) for c in choices}) != len(choices):
            raise TypeInvalid(reason, "choices", "two choices are the same")
        if not isinstance(correct, list) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(choices)
                for i in correct):
            raise TypeInvalid(reason, "correct",
                              f"must be a list of indices from 0 to {len(choices) - 1}")
        if len(set(correct)) != len(correct):
            raise TypeInvalid(reason, "correct", "an index is listed twice")
        if not 2 <= len(correct) < len(choices):
            raise TypeInvalid(reason, "correct",
                              "must name 2 or more correct choices, and not all of them")
        return tuple(c.strip() for c in choices), {"correct": sorted(correct)}
    if "choices" in item and item["choices"] not in (None, []):
        raise TypeInvalid(reason, "choices", f"a {kind} item has no choices")
    if kind == "truefalse":
        value = item.get("answer")
        if not isinstance(value, bool):
            raise TypeInvalid(reason, "answer", "must be true or false")
        return (), {"value": value}
    if kind == "short":
        accepted = item.get("accepted")
        if not isinstance(accepted, list) or not 1 <= len(accepted) <= MAX_ACCEPTED:
            raise TypeInvalid(reason, "accepted",
                              f"must be a list of 1 to {MAX_ACCEPTED} answers")
        if any(not isinstance(a, str) or not a.strip() or len(a) > MAX_SHORT_CHARS
               for a in accepted):
            raise TypeInvalid(reason, "accepted", "every answer must be a non-empty string "
                              f"of at most {MAX_SHORT_CHARS} characters")
        if len({normalise(a) for a in accepted}) != len(accepted):
            raise TypeInvalid(reason, "accepted", "two answers are the same")
        return (), {"accepted": [" ".join(a.split()) for a in accepted]}
    # numeric
    value, tolerance = _number(item.get("value")), _number(item.get("tolerance"))
    relative, unit = item.get("relative", False), item.get("unit")
    if value is None:
        raise TypeInvalid(reason, "value", "must be a finite number")
    if tolerance is None or tolerance < 0:
        raise TypeInvalid(reason, "tolerance", "must be a finite number, 0 or more")
    if relative is None:
        relative = False
    if not isinstance(relative, bool):
        raise TypeInvalid(reason, "relative", "must be true or false")
    if relative and tolerance >= 1:
        raise TypeInvalid(reason, "tolerance", "a relative tolerance must be below 1")
    if unit is not None and (not isinstance(unit, str) or len(unit) > 32):
        raise TypeInvalid(reason, "unit", "must be a string of at most 32 characters")
    unit = unit.strip() or None if isinstance(unit, str) else None
    return (), {"value": value, "tolerance": tolerance, "relative": relative, "unit": unit}


def dump(answer: Mapping[str, Any] | None) -> str | None:
    """The stored `answer` text: canonical JSON (sorted keys), so equal answers are equal
    texts."""
    return None if answer is None else json.dumps(answer, ensure_ascii=False,
                                                  sort_keys=True)


def load(text: str | None) -> dict[str, Any]:
    """A stored `answer` as a dict ({} for an mcq's NULL)."""
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def absolute_tolerance(answer: Mapping[str, Any]) -> float:
    """A numeric item's tolerance in the value's own units."""
    tolerance = float(answer.get("tolerance", 0.0))
    if answer.get("relative"):
        return abs(float(answer["value"])) * tolerance
    return tolerance


def within(answer: Mapping[str, Any], given: float) -> bool:
    """Whether `given` is the numeric item's value within its tolerance."""
    # A hair of slack on the bound: 0.1 + 0.2 is not 0.3 in binary floating point.
    slack = 1e-9 * max(1.0, abs(float(answer["value"])))
    return abs(given - float(answer["value"])) <= absolute_tolerance(answer) + slack


def key_text(kind: str, choices: tuple[str, ...] | list[str], answer_index: int,
             answer: Mapping[str, Any]) -> str:
    """The key of an item as text, for people and for the near-duplicate check: the correct
    choice, the correct choices, True or False, the first accepted answer, or the value."""
    if kind == MCQ:
        return choices[answer_index] if 0 <= answer_index < len(choices) else ""
    if kind == "multi":
        return "; ".join(choices[i] for i in answer.get("correct", ()) if i < len(choices))
    if kind == "truefalse":
        return "True" if answer.get("value") else "False"
    if kind == "short":
        return str((answer.get("accepted") or [""])[0])
    unit = f" {answer['unit']}" if answer.get("unit") else ""
    return f"{answer.get('value'):g}{unit}"


def shares(counts: Mapping[str, int]) -> dict[str, float]:
    """A chapter's counts per type as shares of its questions (examforge.levels.schedule
    spreads them over its numbers exactly, since each share times the total is whole)."""
    total = sum(counts.values())
    return {k: counts[k] / total for k in ITEM_TYPES if counts.get(k)}


def reply_fields(kind: str, answer: Mapping[str, Any]) -> dict[str, Any]:
    """A stored answer as the fields of a reply's item (and of an export's row, which an
    import reads back): {} for an mcq, `correct`, `answer` (true or false), `accepted`, or
    `value`, `tolerance`, `relative` and `unit`."""
    if kind == MCQ:
        return {}
    if kind == "multi":
        return {"correct": list(answer.get("correct", ()))}
    if kind == "truefalse":
        return {"answer": answer.get("value")}
    if kind == "short":
        return {"accepted": list(answer.get("accepted", ()))}
    return {name: answer.get(name) for name in ("value", "tolerance", "relative", "unit")}


def from_fields(kind: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """The stored answer of a row that carries `reply_fields` (the inverse)."""
    if kind == MCQ:
        return {}
    if kind == "truefalse":
        return {"value": row.get("answer")}
    names = {"multi": ("correct",), "short": ("accepted",),
             "numeric": ("value", "tolerance", "relative", "unit")}[kind]
    return {name: row.get(name) for name in names}


def with_key(kind: str, question: str, choices: tuple[str, ...] | list[str],
             answer_index: int, answer: Mapping[str, Any]) -> str:
    """An item's text with its key, for the near-duplicate check across types: what a
    true/false statement that restates an mcq's key is compared with. A true/false item's
    statement is its own (its value adds no words)."""
    if kind == "truefalse":
        return question
    return f"{question} {key_text(kind, choices, answer_index, answer)}"
