"""Shared fixtures for the question-bank tests: an exam whose text holds everything a model
may write, and the strict decoding of the HTML the writers produce."""

from __future__ import annotations

import re
from typing import Iterator

from examforge.banks import BankChapter, BankExam, BankQuestion

HOSTILE = [
    "Is 1 < 2 && 3 > 2? <b>not bold</b> &amp; &lt; stays literal",
    "CDATA end ]]> and ]] > and ]]]]> inside",
    "GIFT specials ~ = # { } : and \\ backslash, \\n is not a newline, \\: \\\\ ::name::",
    "Quotes \" and ' and `back` ticks",
    "Line one\nline two\n\nafter a blank line",
    "Windows\r\nbreaks and a lone\rreturn",
    "فارسی: کدام گزینه درست است؟",
    "العربية: ما هو الجواب الصحيح؟",
    "Русский: какой ответ верный?",
    "中文：哪个答案是正确的？日本語もテスト。한국어",
    "Emoji 🎓🧪👩🏽‍🔬 and ZWJ, math ∑ x² ≤ ∞",
    "[html] at the start, then [plain]",
    "%50% looks like a GIFT weight",
    "// looks like a comment",
    "$CATEGORY: looks like a category",
    "#### looks like general feedback",
    "Tabs\there and  double  spaces",
    "{=right ~wrong} a whole GIFT answer block",
    "-> arrow and => and %",
]


def hostile_exam() -> BankExam:
    return BankExam(
        slug="hostile-exam",
        title="Exam <&> \"quoted\" / slash // double: colon",
        chapters=(
            BankChapter("ch-2", "Second / chapter {x} \\n", position=2),
            BankChapter("ch-1", "First & <chapter> ]]> :: deck sep", position=1),
            BankChapter("empty", "Chapter with no questions", position=3),
        ),
    )


def hostile_questions() -> list[BankQuestion]:
    """Ordered by chapter position, then number. Every hostile text appears as question,
    choice, explanation and tag."""
    out = []
    for chapter in ("ch-1", "ch-2"):
        for i, text in enumerate(HOSTILE):
            others = [HOSTILE[(i + k) % len(HOSTILE)] for k in (1, 2, 3)]
            choices = [f"{text} (choice)", *(f"{o} (choice {k})" for k, o in enumerate(others))]
            answer = (i + len(chapter)) % 4
            choices[0], choices[answer] = choices[answer], choices[0]
            out.append(BankQuestion(
                chapter_id=chapter,
                number=i + 1,
                question=f"Q{i + 1}: {text}",
                choices=tuple(choices),  # type: ignore[arg-type]
                answer_index=answer,
                explanation="" if i == 3 else f"Because: {text}",
                tags=() if i % 5 == 0 else ("difficulty:hard", f"topic:{text[:20]}", "bloom:apply"),
            ))
    # Same text as another question: identity, not content, must tell them apart.
    twin = out[1]
    out.append(BankQuestion("ch-2", len(HOSTILE) + 1, twin.question, twin.choices,
                            twin.answer_index, twin.explanation, twin.tags))
    return out


def normalised(text: str) -> str:
    """What a reader gets back: line breaks of any convention are one '\\n'."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


_ENTITY_RE = re.compile(r"&(amp|lt|gt);")
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">"}


_LANGUAGE_DIV_RE = re.compile(r'<div lang="([a-zA-Z-]+)"(?: dir="rtl")?>(.*)</div>', re.S)


def strict_unhtml(fragment: str) -> str:
    """Decode the writers' HTML, refusing anything they should not have produced: a tag other
    than <br> (inside the one `<div lang dir>` a chapter in another language than English is
    wrapped in), a raw '<' or '>', or an entity other than &amp; &lt; &gt;."""
    wrapped = _LANGUAGE_DIV_RE.fullmatch(fragment)
    if wrapped:
        fragment = wrapped.group(2)
    pieces = fragment.split("<br>")
    decoded = []
    for piece in pieces:
        assert "<" not in piece and ">" not in piece, f"unescaped markup in {fragment!r}"
        stripped = _ENTITY_RE.sub("", piece)
        assert "&" not in stripped, f"unexpected entity in {fragment!r}"
        decoded.append(_ENTITY_RE.sub(lambda m: _ENTITIES[m.group(1)], piece))
    return "\n".join(decoded)


def lazily(questions: list[BankQuestion], log: list[int]) -> Iterator[BankQuestion]:
    """Yield the questions one by one, recording in `log` how many were produced."""
    for q in questions:
        log.append(len(log) + 1)
        yield q
