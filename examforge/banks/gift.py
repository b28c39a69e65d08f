r"""Moodle's GIFT text format.

One block per question, blocks separated by a blank line (Moodle splits on blank lines and
trims every line):

    // examforge: <exam slug>/<chapter id>/<number>
    // [tag:difficulty:hard]
    ::<name>::[html]<question>{
    \t=[html]<right choice>
    \t~[html]<wrong choice>
    \t####[html]<explanation>
    }

Escaping, as Moodle's qformat_gift reads it (escapedchar_pre/post): text is `as_html` first
(so it holds no line break: those are `<br>`), then a backslash goes before each of
`\ ~ = # { } :`, the backslash itself first.

Every text starts with an explicit `[html]`: Moodle reads a leading `[html]`, `[plain]`,
`[moodle]` or `[markdown]` as the text's format, so a question beginning with such a word
would otherwise lose it, and an answer beginning with `%50%` would otherwise be read as a
50% weight (GIFT has no escape for `%`).

Tags: current Moodle reads `[tag:...]` from the comment lines of a question's block
(`extract_idnumber_and_tags_from_comment`); older versions ignore them as comments. A tag
cannot hold `<`, `>`, a backtick or a line break there, so those become spaces, and `]` is
written `\]`. One tag per comment line, so a tag ending in a backslash cannot swallow the next.

Categories: Moodle never unescapes a `$CATEGORY:` line, but its escape pre-pass still runs
on it (`\\` becomes `\`, `\:` a placeholder), so the path is written raw with every
backslash doubled, which that pre-pass turns back into the title.

Shuffle: GIFT cannot say; Moodle applies the site's default for new questions.
"""

from __future__ import annotations

import re
from typing import BinaryIO, Iterable

from examforge.banks.model import BankChapter, BankExam, BankQuestion, checked
from examforge.banks.moodle_xml import category_path
from examforge.banks.text import as_html, one_line, question_name

_SPECIAL_RE = re.compile(r"([\\~=#{}:])")
_TAG_DROP_RE = re.compile(r"[<>`\x00-\x1f\x7f]")


def escape(text: str) -> str:
    """GIFT-escape text: a backslash before each special character; line breaks as `\\n`."""
    text = _SPECIAL_RE.sub(r"\\\1", text)
    return text.replace("\r\n", "\\n").replace("\r", "\\n").replace("\n", "\\n")


def rich(text: str) -> str:
    """Plain text as GIFT rich text: explicit HTML format, then escaped."""
    return "[html]" + escape(as_html(text))


def tag(value: str) -> str:
    """A tag as Moodle reads it from `[tag:...]`."""
    return " ".join(_TAG_DROP_RE.sub(" ", value).split()).replace("]", "\\]")


def typed_answers(q: BankQuestion) -> list[str]:
    """The answer lines of an item of another type than mcq, in GIFT's own forms: weighted
    choices (`~%50%`, the weights Moodle XML gets: examforge.banks.moodle_xml.fractions),
    `T` or `F`, `=%100%answer` for each accepted answer (the explicit weight, so that an
    answer cannot be read as one), `#value:tolerance` (absolute, as Moodle's)."""
    from examforge.banks.moodle_xml import fractions, number
    from examforge.item_types import absolute_tolerance

    if q.type == "multi":
        return [f"~%{weight}%{rich(choice)}" for choice, weight in zip(q.choices, fractions(q))]
    if q.type == "truefalse":
        return ["T" if q.answer["value"] else "F"]
    if q.type == "short":
        # Plain text: Moodle compares a short answer's text as typed, HTML is not rendered.
        # `*` is a wildcard in a Moodle short answer: `\\*` (escaped again for GIFT) a star.
        return [f"=%100%{escape(a.replace('*', chr(92) + '*'))}" for a in q.answer["accepted"]]
    return [f"#{number(q.answer['value'])}:{number(absolute_tolerance(q.answer))}"]


def _category(exam: BankExam, chapter: BankChapter) -> str:
    return f"$CATEGORY: {category_path(exam, chapter).replace(chr(92), chr(92) * 2)}\n\n"


def _question(exam: BankExam, q: BankQuestion) -> str:
    lines = [f"// examforge: {exam.slug}/{q.chapter_id}/{q.number}"]
    lines.extend(f"// [tag:{t}]" for t in map(tag, q.tags) if t)
    lines.append(f"::{escape(question_name(q.chapter_id, q.number))}::{rich(q.question)}{{")
    if q.type == "mcq":
        for index, choice in enumerate(q.choices):
            mark = "=" if index == q.answer_index else "~"
            lines.append(f"\t{mark}{rich(choice)}")
    else:
        lines.extend(f"\t{answer}" for answer in typed_answers(q))
    if q.feedback:  # the explanation, and the source it was written from
        lines.append(f"\t####{rich(q.feedback)}")
    lines.append("}")
    return "\n".join(lines) + "\n\n"


def write(exam: BankExam, questions: Iterable[BankQuestion], out: BinaryIO) -> int:
    """Stream the bank as GIFT: one question in memory at a time."""
    # A comment-only block: Moodle skips it, and an empty bank is still a GIFT file.
    header = f"// {exam.slug}: {one_line(exam.title)} (examforge question bank)\n\n"
    out.write(header.encode("utf-8"))
    count = 0
    current: BankChapter | None = None
    for chapter, q in checked(exam, questions):
        if chapter is not current:
            out.write(_category(exam, chapter).encode("utf-8"))
            current = chapter
        out.write(_question(exam, q).encode("utf-8"))
        count += 1
    return count
