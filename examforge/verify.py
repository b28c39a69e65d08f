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
from typing import Sequence

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


@dataclass(frozen=True)
class SolveItem:
    """A question as the solver sees it: its text, and its choices in the shown order."""

    question: str
    choices: tuple[str, ...]  # as stored
    order: tuple[int, ...]  # order[i]: the stored index of the choice shown at letter i


def shown_order(question: str, choices: Sequence[str]) -> tuple[int, ...]:
    """The order the choices are shown in: a permutation drawn from the question's text and
    choices, unrelated to where the key is stored."""
    seed = hashlib.sha256(json.dumps([question, list(choices)]).encode()).digest()
    order = list(range(len(choices)))
    random.Random(seed).shuffle(order)
    return tuple(order)


def item(question: str, choices: Sequence[str]) -> SolveItem:
    return SolveItem(question, tuple(choices), shown_order(question, choices))


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
        lines.append(f"Question {n}: {it.question}")
        for letter, index in zip(LETTERS, it.order):
            lines.append(f"{letter}. {it.choices[index]}")
        lines.append("")
    lines.append("Answer every question with JSON as the system message says.")
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "\n".join(lines)}]


def max_tokens(questions: int) -> int:
    return SOLVE_TOKENS_OVERHEAD + SOLVE_TOKENS_PER_QUESTION * questions


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_answers(content: str | None, items: Sequence[SolveItem]) -> list[int | None]:
    """The stored index of the choice the solver picked for each item, None where it gave
    no readable answer. Raises OutputInvalid when the reply holds no answer at all (not
    JSON, or no `answers` list)."""
    try:
        data = json.loads(_FENCE.sub("", (content or "").strip()))
    except ValueError:
        raise OutputInvalid(Rejection.malformed_json, "the solve reply is not JSON") from None
    answers = data.get("answers") if isinstance(data, dict) else None
    if not isinstance(answers, list):
        raise OutputInvalid(Rejection.wrong_schema, "the solve reply has no answers list")
    picked: list[int | None] = [None] * len(items)
    for pos, a in enumerate(answers):
        if not isinstance(a, dict):
            continue
        n = a.get("n", pos + 1)
        choice = a.get("choice")
        if not isinstance(n, int) or not 1 <= n <= len(items) or not isinstance(choice, str):
            continue
        letter = choice.strip().upper()[:1]
        if letter and letter in LETTERS[:len(items[n - 1].order)]:
            picked[n - 1] = items[n - 1].order[LETTERS.index(letter)]
    return picked
