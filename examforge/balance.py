"""Where each question's correct answer goes: balanced over positions, fixed by its identity.

Models favour some positions (the mock's `answer_position` plays one that always puts the
answer first; real models lean towards B and C). A bank whose answer is "A" half the time
teaches test-taking, not the subject. So every stored question's choices are reordered when
it is committed, from its identity alone (exam, chapter, number): the database, every export
and every re-export agree, and a second export of the same bank in a text format is
byte-for-byte the same (the .apkg and the QTI zip also hold the time they were made).

Why balanced blocks rather than a random position per question: a seeded random draw is
uniform only on average; a 20-question chapter would often come out 8/3/5/4. Here the
numbers of a chapter are taken in blocks of four (1-4, 5-8, ...) and each block puts its
answers at a permutation of the four positions, the permutation drawn from the block's
identity. Every position then holds the answer exactly N/4 times in a chapter of N questions
(within one, when N is not a multiple of four), and a bank of C chapters within C. Which
question of a block gets which position still looks random to a reader; a platform that
shuffles choices itself (Moodle, Canvas) changes nothing of this.

The wrong choices are ordered by a keyed hash of their text, not by where the model put
them, so the reorder is idempotent: importing an exported bank, or balancing twice, gives
the same order.

What a reorder must not break:
- an explanation that names a choice by letter ("option B is wrong because ..."): such
  references are rewritten to the new letters (`_LETTER_REF_RE`, conservative on purpose);
  the prompt also asks the model not to write them;
- a choice that refers to the others by position ("All of the above", "Both A and C", "همه
  موارد", in any language examforge knows: examforge.languages): the question keeps the
  order it came in, since no other order keeps its meaning. The prompt asks for none, and
  a model's are refused (examforge.output.positional_reason); an imported bank's are kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from functools import lru_cache

from examforge.languages import positional_in_any
from examforge.output import Question, normalise

LETTERS = "ABCD"
BLOCK = 4  # positions, so a block of numbers that is a permutation of them is balanced
# "option B", "answer (C)", "choice D", "choices A and B" are not matched as a pair on
# purpose; "(B)" alone is. A capital letter standing by itself is too common to touch.
_LETTER_REF_RE = re.compile(
    r"(?P<lead>\b(?i:options?|choices?|answers?|alternatives?)\s*\(?|\()"
    r"(?P<letter>[A-D])(?=\)|\b)")


def _may_refer(text: str) -> bool:
    """Whether `text` has what every match of _LETTER_REF_RE starts with (a parenthesis or
    one of its words): substring tests in C, a tenth of the regex's scan of a text with
    none, which is most explanations."""
    if "(" in text:
        return True
    lower = text.lower()
    return any(word in lower for word in ("option", "choice", "answer", "alternative"))


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def answer_position(exam: str, chapter_id: str, number: int) -> int:
    """The position (0..3) of the correct answer of question `number` of a chapter."""
    block, offset = divmod(number - 1, BLOCK)
    return _block_order(exam, chapter_id, block)[offset]


@lru_cache(maxsize=4096)
def _block_order(exam: str, chapter_id: str, block: int) -> tuple[int, ...]:
    """The answer positions of a block's four numbers (a seeded shuffle: drawn once for the
    block's four questions, which a commit usually stores together)."""
    order = list(range(BLOCK))
    _rng("answer-positions", exam, chapter_id, block).shuffle(order)
    return tuple(order)


def positional(q: Question) -> bool:
    """Whether a choice refers to the others by position, so that no reorder keeps it true.
    The choices are checked as one text, joined by a NUL: no pattern matches across it (it
    is neither a word character nor a space, and no phrase holds it), and folding leaves it
    and its neighbours alone, so the answer is each choice's; one fold and one pass of the
    gates instead of four."""
    return positional_in_any("\x00".join(q.choices))


def _wrong_key(exam: str, chapter_id: str, number: int, text: str) -> bytes:
    return hashlib.sha256("\x1f".join(
        ("wrong-choices", exam, chapter_id, str(number), normalise(text))).encode()).digest()


def balanced(q: Question, exam: str, chapter_id: str, number: int) -> Question:
    """`q` with its choices in the balanced order of its identity; letter references in the
    explanation follow their choices. A question with positional choices is returned as is."""
    if q.type != "mcq":
        return _balanced_multi(q, exam, chapter_id, number) if q.type == "multi" else q
    if positional(q):
        return q
    right = q.choices[q.answer_index]
    wrong = sorted((c for i, c in enumerate(q.choices) if i != q.answer_index),
                   key=lambda c: _wrong_key(exam, chapter_id, number, c))
    position = answer_position(exam, chapter_id, number)
    choices = [*wrong[:position], right, *wrong[position:]]
    # old index -> new index, by identity of the choice (choices are distinct texts).
    moved = {old: choices.index(text) for old, text in enumerate(q.choices)}
    explanation = q.explanation
    if _may_refer(explanation):
        explanation = _LETTER_REF_RE.sub(
            lambda m: m.group("lead") + LETTERS[moved[LETTERS.index(m.group("letter"))]],
            explanation)
    return dataclasses.replace(q, choices=tuple(choices),  # type: ignore[arg-type]
                               answer_index=position,
                               explanation=explanation)


def _balanced_multi(q: Question, exam: str, chapter_id: str, number: int) -> Question:
    """A multiple-response item's choices in an order drawn from its identity and their
    texts (so, as for an mcq's wrong choices, balancing twice changes nothing), its correct
    set following them; the number of correct choices is varied by the prompt, not here.
    Positional choices, or an explanation naming a choice by letter, keep the order."""
    import json

    if positional(q) or (_may_refer(q.explanation) and _LETTER_REF_RE.search(q.explanation)):
        return q
    correct = set(json.loads(q.answer or "{}").get("correct", ()))
    order = sorted(range(len(q.choices)),
                   key=lambda i: _wrong_key(exam, chapter_id, number, q.choices[i]))
    answer = {"correct": sorted(order.index(i) for i in correct)}
    return dataclasses.replace(q, choices=tuple(q.choices[i] for i in order),  # type: ignore[arg-type]
                               answer=json.dumps(answer, sort_keys=True))
