"""What a question bank is made of, and the checks every writer relies on.

The writers see only these three frozen values, never the store: the caller maps its rows to
them. `checked` is the one place that enforces what the caller promises (order, identity,
characters), so each writer can trust its input and stay about its format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

_ID_RE = re.compile(r"[a-z0-9-]+")
# Characters no bank format can carry: the C0 controls but tab, newline and carriage return
# (XML 1.0 forbids them; Anki separates fields with \x1f), DEL and the C1 block, lone
# surrogates (not UTF-8) and the two XML non-characters. The store already refuses the first
# ones (examforge.output); this is the writers' own guard.
_BAD_CHAR_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True)
class BankChapter:
    id: str  # [a-z0-9-], unique in the exam
    title: str
    position: int  # syllabus order
    language: str = "en"  # BCP 47, what its questions are written in (slice.language)

    def __post_init__(self) -> None:
        _check_id(self.id, "chapter id")
        _check_text(self.title, f"title of chapter {self.id}")


@dataclass(frozen=True)
class BankExam:
    slug: str  # [a-z0-9-]
    title: str
    chapters: tuple[BankChapter, ...]

    def __post_init__(self) -> None:
        _check_id(self.slug, "exam slug")
        _check_text(self.title, f"title of exam {self.slug}")
        ids = [c.id for c in self.chapters]
        if len(set(ids)) != len(ids):
            raise ValueError(f"exam {self.slug}: chapter ids are not unique: {ids}")


@dataclass(frozen=True)
class BankQuestion:
    chapter_id: str
    number: int  # 1..N within its chapter; (exam slug, chapter_id, number) is the identity
    question: str
    choices: tuple[str, str, str, str]
    answer_index: int  # 0..3
    explanation: str
    tags: tuple[str, ...] = ()  # e.g. ("difficulty:hard", "bloom:apply"); may be empty
    # Where it was written from ("guide.pdf, page 4, passage p3"; examforge.sources), or "".
    source: str = ""
    # What the blind solve said of its key (VERIFY: "agreed", "disputed", "pending"), or ""
    # when it was never verified.
    verdict: str = ""
    # Its item type (examforge.item_types) and, for a type other than mcq, its answer fields:
    # {"correct": [..]} (multi: `choices` holds its 4 to 6 choices), {"value": bool}
    # (truefalse), {"accepted": [..]} (short), {"value", "tolerance", "relative", "unit"}
    # (numeric); `choices` is empty and `answer_index` -1 but for a multi's choices.
    type: str = "mcq"
    answer: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"question {self.chapter_id}/{self.number}"
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 1:
            raise ValueError(f"{where}: number must be an int >= 1")
        if self.type != "mcq":
            _check_typed(self, where)
        else:
            if len(self.choices) != 4:
                raise ValueError(f"{where}: needs exactly 4 choices, has {len(self.choices)}")
            if isinstance(self.answer_index, bool) or self.answer_index not in (0, 1, 2, 3):
                raise ValueError(f"{where}: answer_index must be 0..3, is {self.answer_index!r}")
        for text in (self.question, *self.choices, self.explanation, *self.tags, self.source,
                     self.verdict, *self.answer.get("accepted", ()),
                     str(self.answer.get("unit") or "")):
            _check_text(text, where)

    @property
    def correct(self) -> tuple[int, ...]:
        """The indices of the correct choices: an mcq's one, a multi's set; () otherwise."""
        if self.type == "mcq":
            return (self.answer_index,)
        return tuple(self.answer.get("correct", ()))

    @property
    def feedback(self) -> str:
        """What a bank shows after the answer: the explanation, then the source and the
        verdict of the blind solve, each on a line of its own when there is one."""
        lines = [f"Source: {self.source}"] if self.source else []
        if self.verdict:
            lines.append(verdict_line(self.verdict))
        if not lines:
            return self.explanation
        tail = "\n".join(lines)
        return f"{self.explanation}\n\n{tail}" if self.explanation else tail


# The feedback line of each verdict (storage.models.Verdict's values).
VERDICT_LINES = {
    "agreed": "Verdict: agreed (an independent blind solve chose this key)",
    "disputed": "Verdict: disputed (an independent blind solve chose another answer)",
    "pending": "Verdict: pending (the blind solve has not answered yet)",
}


def verdict_line(verdict: str) -> str:
    return VERDICT_LINES.get(verdict, f"Verdict: {verdict}")


def _check_typed(q: BankQuestion, where: str) -> None:
    """What a writer relies on of an item of another type (examforge.item_types checked it
    when it was stored, or edited)."""
    from examforge.item_types import ITEM_TYPES, MULTI_CHOICES

    if q.type not in ITEM_TYPES:
        raise ValueError(f"{where}: unknown item type {q.type!r}")
    if q.type == "multi":
        low, high = MULTI_CHOICES
        correct = q.answer.get("correct", ())
        if not low <= len(q.choices) <= high or len(correct) < 2 or any(
                not 0 <= i < len(q.choices) for i in correct):
            raise ValueError(f"{where}: a multi needs {low} to {high} choices and 2 or more "
                             "correct ones")
    elif q.choices:
        raise ValueError(f"{where}: a {q.type} item has no choices")
    elif q.type == "truefalse" and not isinstance(q.answer.get("value"), bool):
        raise ValueError(f"{where}: a truefalse item needs its value")
    elif q.type == "short" and not q.answer.get("accepted"):
        raise ValueError(f"{where}: a short item needs an accepted answer")
    elif q.type == "numeric" and not isinstance(q.answer.get("value"), (int, float)):
        raise ValueError(f"{where}: a numeric item needs its value")


def _check_id(value: str, what: str) -> None:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r} must match [a-z0-9-]+")


def _check_text(value: str, where: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{where}: text must be a str, is {type(value).__name__}")
    bad = _BAD_CHAR_RE.search(value)
    if bad:
        raise ValueError(f"{where}: character {bad.group()!r} cannot be exported")


def checked(exam: BankExam, questions: Iterable[BankQuestion]
            ) -> Iterator[tuple[BankChapter, BankQuestion]]:
    """Each question with its chapter, lazily, refusing what would break a bank: an unknown
    chapter, a chapter that comes back after another one started (formats group by chapter),
    or a number that does not increase within its chapter (a duplicate identity)."""
    chapters = {c.id: c for c in exam.chapters}
    finished: set[str] = set()
    current: BankChapter | None = None
    last_number = 0
    for q in questions:
        chapter = chapters.get(q.chapter_id)
        if chapter is None:
            raise ValueError(f"question {q.chapter_id}/{q.number}: no chapter {q.chapter_id!r} "
                             f"in exam {exam.slug}")
        if chapter is not current:
            if chapter.id in finished:
                raise ValueError(f"question {q.chapter_id}/{q.number}: chapter {chapter.id} "
                                 "comes back after another chapter; questions must be grouped "
                                 "by chapter")
            if current is not None:
                finished.add(current.id)
            current, last_number = chapter, 0
        if q.number <= last_number:
            raise ValueError(f"question {q.chapter_id}/{q.number}: numbers must increase "
                             f"within a chapter (after {last_number})")
        last_number = q.number
        yield chapter, q
