"""The bank interface: the format table, the contract checks, and lazy consumption."""

from __future__ import annotations

import io
from typing import Iterator

import pytest
from bank_samples import hostile_exam, hostile_questions

from examforge.banks import FORMATS, BankChapter, BankExam, BankQuestion, write_bank


def _q(chapter: str, number: int, text: str = "Q?") -> BankQuestion:
    return BankQuestion(chapter, number, text, ("a", "b", "c", "d"), 0, "why")


EXAM = BankExam("ex", "Exam", (BankChapter("a", "A", 1), BankChapter("b", "B", 2)))


def test_formats_name_their_file_suffix():
    assert {name: f.suffix for name, f in FORMATS.items()} == {"moodle-xml": ".xml", "gift": ".gift.txt", "anki": ".apkg"}


def test_unknown_format_is_a_value_error():
    with pytest.raises(ValueError, match="unknown bank format 'pdf'"):
        write_bank("pdf", EXAM, [], io.BytesIO())


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_returns_the_count_and_accepts_an_empty_bank(fmt):
    assert write_bank(fmt, hostile_exam(), hostile_questions(), io.BytesIO()) == 39
    out = io.BytesIO()
    assert write_bank(fmt, EXAM, [], out) == 0
    assert out.getvalue()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("questions, message", [
    ([_q("zz", 1)], "no chapter 'zz'"),
    ([_q("a", 1), _q("b", 1), _q("a", 2)], "comes back after another chapter"),
    ([_q("a", 2), _q("a", 2)], "numbers must increase"),
    ([_q("a", 2), _q("a", 1)], "numbers must increase"),
])
def test_writers_refuse_a_stream_that_breaks_the_contract(fmt, questions, message):
    with pytest.raises(ValueError, match=message):
        write_bank(fmt, EXAM, questions, io.BytesIO())


@pytest.mark.parametrize("bad, message", [
    (lambda: BankQuestion("a", 1, "nul \x00", ("a", "b", "c", "d"), 0, ""), "cannot be exported"),
    (lambda: BankQuestion("a", 1, "q", ("a", "b", "c", "d"), 0, "unit sep \x1f"),
     "cannot be exported"),
    (lambda: BankQuestion("a", 1, "q", ("a", "b", "c"), 0, ""), "exactly 4 choices"),  # type: ignore[arg-type]
    (lambda: BankQuestion("a", 1, "q", ("a", "b", "c", "d"), 4, ""), "answer_index"),
    (lambda: BankQuestion("a", 0, "q", ("a", "b", "c", "d"), 0, ""), "number"),
    (lambda: BankExam("Bad Slug", "t", ()), "must match"),
    (lambda: BankExam("ex", "t", (BankChapter("a", "A", 1), BankChapter("a", "B", 2))),
     "not unique"),
    (lambda: BankChapter("a_b", "t", 1), "must match"),
])
def test_values_refuse_what_no_format_can_carry(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def _one_at_a_time(questions: list[BankQuestion], out: io.BytesIO) -> Iterator[BankQuestion]:
    """Fails unless every question has reached `out` before the next one is asked for:
    a writer that first builds a list (or any look-ahead) stops here."""
    written = out.tell()
    for k, q in enumerate(questions):
        if k:
            assert out.tell() > written, f"question {k} not written before question {k + 1} was read"
            written = out.tell()
        yield q


@pytest.mark.parametrize("fmt", ["moodle-xml", "gift"])
def test_text_writers_write_each_question_before_reading_the_next(fmt):
    out = io.BytesIO()
    assert write_bank(fmt, hostile_exam(), _one_at_a_time(hostile_questions(), out), out) == 39
