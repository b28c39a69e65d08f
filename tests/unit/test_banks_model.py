"""The bank interface: the format table, the contract checks, and lazy consumption."""

from __future__ import annotations

import io
import random
from typing import Iterator

import pytest
from bank_samples import hostile_exam, hostile_questions

from examforge.banks import FORMATS, BankChapter, BankExam, BankQuestion, write_bank


def _q(chapter: str, number: int, text: str = "Q?") -> BankQuestion:
    return BankQuestion(chapter, number, text, ("a", "b", "c", "d"), 0, "why")


EXAM = BankExam("ex", "Exam", (BankChapter("a", "A", 1), BankChapter("b", "B", 2)))


def test_formats_name_their_file_suffix():
    assert {name: f.suffix for name, f in FORMATS.items()} == {
        "moodle-xml": ".xml", "gift": ".gift.txt", "anki": ".apkg", "qti": ".qti.zip"}


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
    (lambda: BankQuestion("a", 1, "q", ("a", "b", "c"), 0, ""), "exactly 4 choices"),
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
            assert out.tell() > written, f"question {k} not written before {k + 1} was read"
            written = out.tell()
        yield q


@pytest.mark.parametrize("fmt", ["moodle-xml", "gift"])
def test_text_writers_write_each_question_before_reading_the_next(fmt):
    out = io.BytesIO()
    assert write_bank(fmt, hostile_exam(), _one_at_a_time(hostile_questions(), out), out) == 39


def _big_bank(chapters: int, per_chapter: int) -> tuple[BankExam, list[BankQuestion]]:
    rng = random.Random(7)

    def words() -> str:  # incompressible enough that deflate emits output as it goes
        return " ".join(f"{rng.getrandbits(48):x}" for _ in range(30))

    exam = BankExam("big", "Big", tuple(BankChapter(f"c{i}", f"C{i}", i) for i in range(chapters)))
    questions = [BankQuestion(f"c{i}", n, words(), (words(), words(), words(), words()), n % 4,
                              words())
                 for i in range(chapters) for n in range(1, per_chapter + 1)]
    return exam, questions


def test_qti_writes_each_finished_chapter_before_reading_the_rest():
    exam, questions = _big_bank(chapters=3, per_chapter=150)
    out = io.BytesIO()
    written_at_chapter_start: list[int] = []

    def stream() -> Iterator[BankQuestion]:
        for q in questions:
            if q.number == 1:
                written_at_chapter_start.append(out.tell())
            yield q

    assert write_bank("qti", exam, stream(), out) == 450
    # Chapter 1 (some 300 kB of XML) reaches the file, deflated, before chapter 3 is read.
    first, _, third = written_at_chapter_start
    assert third - first > 100_000, written_at_chapter_start
