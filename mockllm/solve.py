"""Blind solves (examforge's VERIFY): a chat request whose user message starts with
examforge's solve header (`examforge.verify.SOLVE_HEADER`) lists questions with their choices
in a shown order, and no key. The mock answers each truthfully: the correct choice of a
question it wrote is the one good practice among its choices (`questions.true_index`), never
what any key said. ``solver_error_rate`` of the answers pick a wrong choice instead, drawn
per question text and seed, so that a question solved again gets the same answer. A question
shown after a line of course material (`Material for the questions below: ...`) is answered
the same way; such questions are counted.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass

from examforge.verify import LETTERS, MATERIAL_PREFIX, SOLVE_HEADER
from mockllm import corpora
from mockllm.questions import true_index

_QUESTION = re.compile(r"^Question (\d+): (.*)$")
_MATERIAL = re.compile("^" + re.escape(MATERIAL_PREFIX) + "(.*)$")
_CHOICE = re.compile(r"^([A-D])\. (.*)$")


@dataclass(frozen=True)
class Solved:
    content: str
    answers: int
    errors: int  # answers the solver's own error rate made wrong
    unknown: int  # questions the mock did not write (answered A)
    passages: int = 0  # questions shown after a line of course material


def is_solve(text: str) -> bool:
    return text.startswith(SOLVE_HEADER)


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def solve(text: str, seed: int, error_rate: float) -> Solved:
    """The reply content of a solve request: {"answers": [{"n": 1, "choice": "B"}, ...]}."""
    listed: list[tuple[int, str, list[str]]] = []
    passages = 0
    material = False
    for line in text.splitlines():
        m = _MATERIAL.match(line)
        if m:  # the material does not change the truthful answer
            material = m.group(1) != "none"
            continue
        q = _QUESTION.match(line)
        if q:
            listed.append((int(q.group(1)), q.group(2), []))
            passages += material
            continue
        c = _CHOICE.match(line)
        if c and listed:
            listed[-1][2].append(c.group(2))
    answers, errors, unknown = [], 0, 0
    for n, question, choices in listed:
        truth = true_index(choices)
        if truth is None:  # written in another language (mockllm.corpora)
            found = [i for i, c in enumerate(choices) if c in corpora.GOOD]
            truth = found[0] if len(found) == 1 else None
        if truth is None:
            unknown += 1
            truth = 0
        pick = truth
        if error_rate > 0 and _rng("solve", seed, question).random() < error_rate:
            wrong = [i for i in range(len(choices)) if i != truth] or [truth]
            pick = _rng("solve-wrong", seed, question).choice(wrong)
            errors += 1
        answers.append({"n": n, "choice": LETTERS[pick]})
    return Solved(json.dumps({"answers": answers}), len(answers), errors, unknown, passages)
