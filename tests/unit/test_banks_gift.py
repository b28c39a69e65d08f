"""GIFT: read back with a strict reader written here, which refuses an unescaped special
character or an unknown escape instead of guessing, and mirrors how Moodle splits blocks,
comments, tags and categories."""

from __future__ import annotations

import io
import re

import pytest
from bank_samples import hostile_exam, hostile_questions, normalised, strict_unhtml

from examforge.banks import BankChapter, BankExam, BankQuestion, write_bank

SPECIAL = set("~=#{}:")
ESCAPES = {"\\": "\\", "~": "~", "=": "=", "#": "#", "{": "{", "}": "}", ":": ":", "n": "\n"}


class GiftError(Exception):
    pass


class Cursor:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.i):
            raise GiftError(f"expected {token!r} at {self.i}: {self.text[self.i:self.i + 40]!r}")
        self.i += len(token)

    def at(self, token: str) -> bool:
        return self.text.startswith(token, self.i)

    def read(self, stop: str) -> str:
        """Unescaped text up to the structural token `stop` (not consumed). Any other
        unescaped special character, a raw line break or an unknown escape is an error."""
        out = []
        while not self.at(stop):
            if self.i >= len(self.text):
                raise GiftError(f"missing {stop!r}")
            c = self.text[self.i]
            if c == "\\":
                nxt = self.text[self.i + 1:self.i + 2]
                if nxt not in ESCAPES:
                    raise GiftError(f"unknown escape \\{nxt} at {self.i}")
                out.append(ESCAPES[nxt])
                self.i += 2
                continue
            if c in SPECIAL or c == "\n":
                context = self.text[max(0, self.i - 20):self.i + 20]
                raise GiftError(f"unescaped {c!r} at {self.i}: {context!r}")
            out.append(c)
            self.i += 1
        return "".join(out)


def rich(raw: str) -> str:
    if not raw.startswith("[html]"):
        raise GiftError(f"no explicit [html] format: {raw[:30]!r}")
    return strict_unhtml(raw[len("[html]"):])


def read_tag(line: str) -> str:
    """`// [tag:...]`, where only `\\]` is an escape (Moodle's tag regex)."""
    body = line[len("// [tag:"):]
    out, i = [], 0
    while i < len(body):
        if body.startswith("\\]", i) and i + 2 < len(body):
            out.append("]")
            i += 2
        elif body[i] == "]":
            if i != len(body) - 1:
                raise GiftError(f"text after a tag: {line!r}")
            return "".join(out)
        else:
            if body[i] in "<>`":
                raise GiftError(f"{body[i]!r} in a tag: {line!r}")
            out.append(body[i])
            i += 1
    raise GiftError(f"unterminated tag: {line!r}")


def read_category(line: str) -> list[str]:
    """Moodle's pre-pass turns `\\\\` into `\\` on a category line (and nothing is unescaped
    after); every backslash here must be part of such a pair."""
    raw = line[len("$CATEGORY: "):]
    if re.search(r"(?<!\\)(\\\\)*\\(?!\\)", raw):
        raise GiftError(f"odd backslash in category: {line!r}")
    path = raw.replace("\\\\", "\\")
    return [n.replace("//", "/").strip() for n in re.split(r"(?<!/)/(?!/)", path)]


def read_question(lines: list[str]) -> dict[str, object]:
    tags = [read_tag(line) for line in lines if line.startswith("// [tag:")]
    for line in lines:
        if line.strip() != line or not line.strip():
            # Moodle trims lines; only the leading tab of answer lines is allowed.
            if not line.startswith("\t") or line[1:].strip() != line[1:]:
                raise GiftError(f"whitespace Moodle would trim: {line!r}")
    body = [line for line in lines if not line.startswith("//")]
    c = Cursor("\n".join(body))
    c.expect("::")
    name = c.read("::")
    c.expect("::")
    question = rich(c.read("{"))
    c.expect("{")
    choices, right, explanation = [], [], ""
    while True:
        c.expect("\n\t")
        if c.at("####"):
            c.expect("####")
            explanation = rich(c.read("\n"))
            c.expect("\n}")
            break
        if c.at("}"):
            raise GiftError("tab before }")
        mark = c.text[c.i]
        if mark not in "=~":
            raise GiftError(f"answer without = or ~: {c.text[c.i:c.i + 20]!r}")
        c.i += 1
        if mark == "=":
            right.append(len(choices))
        choices.append(rich(c.read("\n")))
        if c.at("\n}"):
            c.expect("\n}")
            break
    if c.i != len(c.text):
        raise GiftError(f"text after the answers: {c.text[c.i:]!r}")
    if len(right) != 1 or len(choices) != 4:
        raise GiftError(f"{len(choices)} choices, right ones {right}")
    return {"name": name, "question": question, "choices": tuple(choices),
            "answer_index": right[0], "explanation": explanation, "tags": tuple(tags)}


def read_bank(data: bytes) -> list[tuple[list[str], dict[str, object]]]:
    text = data.decode("utf-8")
    if "\r" in text:
        raise GiftError("carriage return in the file")
    # Blocks are separated by blank lines. Not str.splitlines: it also splits on U+2028 and
    # friends, which PHP's file() does not.
    blocks = [b.split("\n") for b in text.split("\n\n") if b.strip()]
    category: list[str] = []
    out = []
    for lines in blocks:
        if any(not line.strip() for line in lines):
            raise GiftError(f"blank line inside a block: {lines!r}")
        content = [line for line in lines if not line.startswith("//")]
        if not content:
            continue  # a comment-only block, which Moodle skips
        if content[0].startswith("$CATEGORY:"):
            if len(content) != 1:
                raise GiftError(f"category block with more lines: {lines!r}")
            category = read_category(content[0])
            continue
        out.append((category, read_question(lines)))
    return out


def _moodle_tag(tag: str) -> str:
    return " ".join(re.sub(r"[<>`]", " ", tag).split())


def test_every_question_choice_answer_explanation_and_tag_round_trips():
    exam, questions = hostile_exam(), hostile_questions()
    out = io.BytesIO()
    write_bank("gift", exam, iter(questions), out)
    read = read_bank(out.getvalue())
    assert len(read) == len(questions)
    titles = {c.id: c.title for c in exam.chapters}
    for (category, got), q in zip(read, questions):
        assert category == ["$course$", "top", exam.title, titles[q.chapter_id]]
        assert got == {
            "name": f"{q.chapter_id}-{q.number:04d}",
            "question": normalised(q.question),
            "choices": tuple(normalised(c) for c in q.choices),
            "answer_index": q.answer_index,
            "explanation": normalised(q.explanation),
            "tags": tuple(_moodle_tag(t) for t in q.tags),
        }


def test_tags_moodle_cannot_read_lose_only_the_unreadable_characters():
    exam = BankExam("ex", "Ex", (BankChapter("a", "A", 1),))
    tags = ("a]b", "ends\\", "<b>x</b>", "two\nlines", "back`tick")
    out = io.BytesIO()
    write_bank("gift", exam, [BankQuestion("a", 1, "q", ("a", "b", "c", "d"), 0, "", tags)], out)
    [(_, got)] = read_bank(out.getvalue())
    assert got["tags"] == ("a]b", "ends\\", "b x /b", "two lines", "back tick")


def test_category_backslashes_survive_moodles_pre_pass():
    exam = BankExam("ex", "C:\\path \\n \\\\ \\: end\\", (BankChapter("a", "A/B", 1),))
    out = io.BytesIO()
    write_bank("gift", exam, [BankQuestion("a", 1, "q", ("a", "b", "c", "d"), 0, "")], out)
    [(category, _)] = read_bank(out.getvalue())
    assert category == ["$course$", "top", exam.title, "A/B"]


@pytest.mark.parametrize("bad", [
    "::n::[html]a: b{\n\t=[html]x\n\t~[html]y\n\t~[html]z\n\t~[html]w\n}",   # unescaped :
    "::n::[html]a{\n\t=[html]x = y\n\t~[html]y\n\t~[html]z\n\t~[html]w\n}",  # unescaped =
    "::n::[html]a \\q{\n\t=[html]x\n\t~[html]y\n\t~[html]z\n\t~[html]w\n}",  # unknown escape
    "::n::a{\n\t=[html]x\n\t~[html]y\n\t~[html]z\n\t~[html]w\n}",            # no [html]
    "::n::[html]a{\n\t=[html]x\n\t~[html]y\n\t~[html]z\n}",                  # three choices
])
def test_the_reader_is_strict(bad):
    with pytest.raises(GiftError):
        read_bank(bad.encode())
