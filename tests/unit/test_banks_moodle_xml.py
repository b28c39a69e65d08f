"""Moodle XML: read back with ElementTree, the way Moodle's qformat_xml reads it."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET

from bank_samples import hostile_exam, hostile_questions, normalised, strict_unhtml

from examforge.banks import BankChapter, BankExam, BankQuestion, write_bank
from examforge.banks.moodle_xml import cdata


def split_category_path(path: str) -> list[str]:
    """Moodle's qformat_default::split_category_path: `/` separates, `//` is a slash."""
    return [name.replace("//", "/").strip() for name in re.split(r"(?<!/)/(?!/)", path)]


def _rich(element: ET.Element | None) -> str:
    assert element is not None and element.get("format") == "html"
    text = element.findtext("text")
    assert text is not None
    return strict_unhtml(text)


def read_bank(data: bytes) -> list[tuple[list[str], dict[str, object]]]:
    """(category path, question) for every multichoice question, in file order."""
    root = ET.fromstring(data)
    assert root.tag == "quiz"
    category: list[str] = []
    out = []
    for element in root:
        assert element.tag == "question"
        if element.get("type") == "category":
            path = element.findtext("category/text")
            assert path is not None
            category = split_category_path(path)
            continue
        assert element.get("type") == "multichoice"
        assert element.findtext("single") == "true"
        assert element.findtext("shuffleanswers") in ("true", "false")
        answers = element.findall("answer")
        fractions = [a.get("fraction") for a in answers]
        assert sorted(fractions) == ["0", "0", "0", "100"], fractions
        out.append((category, {
            "name": element.findtext("name/text"),
            "question": _rich(element.find("questiontext")),
            "choices": tuple(_rich(a) for a in answers),
            "answer_index": fractions.index("100"),
            "explanation": _rich(element.find("generalfeedback")),
            "tags": tuple(t.findtext("text") for t in element.findall("tags/tag")),
        }))
    return out


def test_every_question_choice_answer_explanation_and_tag_round_trips():
    exam, questions = hostile_exam(), hostile_questions()
    out = io.BytesIO()
    write_bank("moodle-xml", exam, iter(questions), out)
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
            "tags": q.tags,
        }


def test_one_category_per_chapter_and_names_are_unique():
    out = io.BytesIO()
    write_bank("moodle-xml", hostile_exam(), hostile_questions(), out)
    root = ET.fromstring(out.getvalue())
    categories = [q.findtext("category/text") for q in root if q.get("type") == "category"]
    assert len(categories) == 2  # the chapter without questions gets none
    names = [q.findtext("name/text") for q in root if q.get("type") == "multichoice"]
    assert len(set(names)) == len(names)


def test_category_names_with_slashes_at_their_edges_keep_them():
    exam = BankExam("ex", "/lead", (BankChapter("a", "trail/", 1),))
    out = io.BytesIO()
    write_bank("moodle-xml", exam, [BankQuestion("a", 1, "q", ("a", "b", "c", "d"), 0, "")], out)
    path = ET.fromstring(out.getvalue()).findtext("question/category/text")
    assert path is not None
    assert split_category_path(path) == ["$course$", "top", "/lead", "trail/"]


def test_cdata_splits_a_terminator_and_round_trips():
    for text in ["]]>", "a]]>b]]>c", "]]]]>", "]", "plain"]:
        element = ET.fromstring(f"<t>{cdata(text)}</t>")
        assert element.text == text
