"""The blind solve (VERIFY): the prompt that asks a model to answer stored questions without
their key, and the reading of its reply.

The solver sees each question and its choices in an order of their own (a permutation drawn
from the question's text, the same every time the question is solved, so a re-solve after a
crash asks the same thing), never the key or the explanation. Its letter is mapped back to
the stored choice: the verdict compares that choice with the key (storage.verdicts).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
import math
from typing import Any, Mapping, Sequence

from examforge.errors import OutputInvalid, Rejection
from examforge.languages import DEFAULT_LANGUAGE, language as language_of

# The line the prompt starts with: what the mock recognises a solve request by.
SOLVE_HEADER = "Blind solve of multiple-choice questions"
LETTERS = "ABCD"
# max_tokens of a solve call: the reply is {"answers": [{"n": 1, "choice": "B"}, ...]}, about
# 10 tokens per question; the allowance leaves room for a model that adds spaces.
SOLVE_TOKENS_OVERHEAD = 40
SOLVE_TOKENS_PER_QUESTION = 20
# Questions per solve call at most (a committed batch is QUESTIONS_PER_CALL, normally fewer).
SOLVE_MAX_QUESTIONS = 25

SYSTEM = ("You are an expert examiner. Answer each multiple-choice question with the letter of "
          "its single best choice; where course material is given before questions, answer "
          "them as that material says. Reply with JSON only, in the form "
          '{"answers": [{"n": 1, "choice": "A"}, ...]}, one entry per question, in order.')


# Added to SYSTEM when a solve holds items of other types (examforge.item_types): how to
# answer each, by the hint after its number. A solve of four-choice questions only is sent
# SYSTEM as it was.
TYPED_SYSTEM = (
    " A question marked (select all that apply) has two or more correct choices: answer "
    '{"n": 2, "choices": ["A", "C"]}. One marked (true or false) is a statement: answer '
    '{"n": 3, "value": true} or false. One marked (short answer): answer {"n": 4, "answer": '
    '"a few words"}. One marked (number), with its unit when it has one: answer {"n": 5, '
    '"value": 42.5}, in that unit.')
MULTI_LETTERS = "ABCDEF"
# How each type is marked after its number.
HINTS = {"multi": "select all that apply", "truefalse": "true or false",
         "short": "short answer", "numeric": "number"}


@dataclass(frozen=True)
class SolveItem:
    """A question as the solver sees it: its text, and its choices in the shown order; its
    item type (examforge.item_types) and, for a numeric one, its unit."""

    question: str
    choices: tuple[str, ...]  # as stored
    order: tuple[int, ...]  # order[i]: the stored index of the choice shown at letter i
    type: str = "mcq"
    unit: str | None = None


def shown_order(question: str, choices: Sequence[str]) -> tuple[int, ...]:
    """The order the choices are shown in: a permutation drawn from the question's text and
    choices, unrelated to where the key is stored."""
    seed = hashlib.sha256(json.dumps([question, list(choices)]).encode()).digest()
    order = list(range(len(choices)))
    random.Random(seed).shuffle(order)
    return tuple(order)


def item(question: str, choices: Sequence[str], kind: str = "mcq",
         unit: str | None = None) -> SolveItem:
    return SolveItem(question, tuple(choices), shown_order(question, choices), kind, unit)


# The line that shows the course material the questions after it cite (until the next one).
MATERIAL_PREFIX = "Material for the questions below: "


# The line after the header that names the language of the questions (not for English).
LANGUAGE_PREFIX = "The questions and their choices are in "


def build_messages(items: Sequence[SolveItem], passages: Sequence[str | None] = (),
                   language: str = DEFAULT_LANGUAGE) -> list[dict[str, str]]:
    """The solve request: the questions, numbered from 1, each with its reordered choices,
    and nothing of their keys. With `passages` (the text each question cites, or None), a
    material line before a run of questions shows the passage they cite, once for the run
    (the caller orders the items so that those citing one passage are together): on one
    line, since the material can hold anything, a line reading like a question or a choice
    included. A `language` other than English is named after the header: what the solver
    reads (the material is shown as it is, in whatever language it was written)."""
    lines = [f"{SOLVE_HEADER}: {len(items)}"]
    if language != DEFAULT_LANGUAGE:
        lines.append(f"{LANGUAGE_PREFIX}{language_of(language).label}; answer with the "
                     "letters A to D shown before them.")
    lines.append("")
    shown: str | None = None
    for n, it in enumerate(items, 1):
        passage = passages[n - 1] if n - 1 < len(passages) else None
        text = " ".join(passage.split()) if passage else None
        if text and text != shown:
            lines.append(f"{MATERIAL_PREFIX}{text}")
            lines.append("")
        elif shown and not text:
            lines.append(f"{MATERIAL_PREFIX}none")
            lines.append("")
        shown = text
        hint = HINTS.get(it.type)
        if hint == "number" and it.unit:
            hint = f"number, in {it.unit}"
        lines.append(f"Question {n}{f' ({hint})' if hint else ''}: {it.question}")
        for letter, index in zip(MULTI_LETTERS if it.type == "multi" else LETTERS, it.order):
            lines.append(f"{letter}. {it.choices[index]}")
        lines.append("")
    lines.append("Answer every question with JSON as the system message says.")
    typed = any(it.type != "mcq" for it in items)
    return [{"role": "system", "content": SYSTEM + (TYPED_SYSTEM if typed else "")},
            {"role": "user", "content": "\n".join(lines)}]


# What an answer of another item type takes beyond an mcq's letter, in tokens: a multi's
# list of letters, a short answer's few words, a number's digits.
TYPED_EXTRA_TOKENS = {"multi": 15, "truefalse": 0, "short": 40, "numeric": 10}


def max_tokens(questions: int, items: Sequence[SolveItem] = ()) -> int:
    """max_tokens of a solve of `questions` four-choice questions, or of `items`."""
    extra = sum(TYPED_EXTRA_TOKENS.get(it.type, 0) for it in items)
    return SOLVE_TOKENS_OVERHEAD + SOLVE_TOKENS_PER_QUESTION * questions + extra


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_answers(content: str | None, items: Sequence[SolveItem]) -> list[Any]:
    """What the solver answered for each item, None where it gave no readable answer: the
    stored index of the choice it picked (mcq), the stored indices it picked (multi, a
    frozenset), True or False, its short answer (a string) or its number (a float). Raises
    OutputInvalid when the reply holds no answer at all (not JSON, or no `answers` list)."""
    try:
        data = json.loads(_FENCE.sub("", (content or "").strip()))
    except ValueError:
        raise OutputInvalid(Rejection.malformed_json, "the solve reply is not JSON") from None
    answers = data.get("answers") if isinstance(data, dict) else None
    if not isinstance(answers, list):
        raise OutputInvalid(Rejection.wrong_schema, "the solve reply has no answers list")
    picked: list[Any] = [None] * len(items)
    for pos, a in enumerate(answers):
        if not isinstance(a, dict):
            continue
        n = a.get("n", pos + 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(items):
            continue
        if items[n - 1].type != "mcq":
            picked[n - 1] = _typed_answer(items[n - 1], a)
            continue
        choice = a.get("choice")
        if not isinstance(choice, str):
            continue
        letter = choice.strip().upper()[:1]
        if letter and letter in LETTERS[:len(items[n - 1].order)]:
            picked[n - 1] = items[n - 1].order[LETTERS.index(letter)]
    return picked


def _typed_answer(it: SolveItem, a: dict[str, Any]) -> Any:
    """The solver's answer to an item of a type other than mcq, None when unreadable."""
    if it.type == "multi":
        letters = a.get("choices")
        if not isinstance(letters, list) or not letters:
            return None
        shown = MULTI_LETTERS[:len(it.order)]
        picks = set()
        for letter in letters:
            letter = letter.strip().upper()[:1] if isinstance(letter, str) else ""
            if not letter or letter not in shown:
                return None
            picks.add(it.order[shown.index(letter)])
        return frozenset(picks)
    value = a.get("answer") if it.type == "short" else a.get("value")
    if it.type == "truefalse":
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        return value if isinstance(value, bool) else None
    if it.type == "short":
        return " ".join(value.split())[:200] or None if isinstance(value, str) else None
    if isinstance(value, str):  # "42.5" for 42.5
        try:
            value = float(value.replace(",", ""))
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        return None
    return float(value)


def agrees(kind: str, answer_index: int, answer: Mapping[str, Any], given: Any,
           normalise: Any) -> bool:
    """Whether the solver's answer `given` (as `parse_answers` reads it) matches the key:
    the same choice, the same set of choices, the same truth value, an accepted answer
    after normalisation (`normalise`: examforge.output.normalise), or a number within the
    tolerance (examforge.item_types.within)."""
    from examforge.item_types import within

    if given is None:
        return False
    if kind == "mcq":
        return bool(given == answer_index)
    if kind == "multi":
        return set(given) == set(answer.get("correct", ()))
    if kind == "truefalse":
        return bool(given is answer.get("value"))
    if kind == "short":
        return normalise(given) in {normalise(a) for a in answer.get("accepted", ())}
    return within(answer, float(given))


def stored_answer(kind: str, given: Any) -> str | None:
    """The solver's answer to an item of a type other than mcq as stored
    (question.solved_answer, JSON), shown beside a disputed key."""
    if kind == "mcq" or given is None:
        return None
    value = sorted(given) if isinstance(given, frozenset) else given
    return json.dumps({"given": value}, ensure_ascii=False)
