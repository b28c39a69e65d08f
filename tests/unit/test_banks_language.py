"""A Persian bank in every format, read back by the bank tests' readers (ElementTree for
Moodle XML and QTI, the GIFT reader, sqlite3 for the .apkg) exactly as stored: the ZWNJ, the
Arabic letters a writer mixed in, diacritics, Persian digits and Latin terms kept byte for
byte. Moodle XML and QTI say the chapter's language and direction; GIFT and Anki carry the
text unchanged (their formats have no place for a language); an English chapter's export is
as it was."""

from __future__ import annotations

import io
import re
from pathlib import Path

from bank_samples import normalised, strict_unhtml
from test_banks_anki import read_collection
from test_banks_gift import read_bank as read_gift
from test_banks_moodle_xml import read_bank as read_moodle
from test_banks_qti import QTI, open_package
from test_banks_qti import read_bank as read_qti

from examforge.banks import BankChapter, BankExam, BankQuestion, write_bank

PERSIAN = [
    "کدام سرویس AWS برای ذخیره‌سازی شیء با دوام ۹۹٫۹۹۹۹۹۹۹۹۹٪ مناسب است؟",
    "پورت پيش‌فرض HTTPS كدام است؟",  # Arabic yeh and kaf, as a writer may type them
    "اعرابِ عربی: «مُعَلِّم» و کشیـــده",  # diacritics and a tatweel
    "می‌خواهیم ۱۰ نمونه EC2 را در ۳ ناحیه اجرا کنیم؛ چه باید کرد؟",
]
EXAM = BankExam("fa-exam", "آزمون ابری", (BankChapter("fa", "فصل اول: ذخیره‌سازی", 1, "fa"),
                                          BankChapter("en", "English chapter", 2)))


def _questions() -> list[BankQuestion]:
    out = [BankQuestion("fa", i + 1, text, (f"گزینهٔ {i}", "S3", "EBS‌ها", "۴۴۳"), i % 4,
                        f"توضیح: {text}", ("difficulty:medium",))
           for i, text in enumerate(PERSIAN)]
    out.append(BankQuestion("en", 1, "Which port does HTTPS use?", ("443", "22", "80", "21"),
                            0, "HTTPS listens on 443."))
    return out


def _bank(fmt: str) -> bytes:
    out = io.BytesIO()
    assert write_bank(fmt, EXAM, iter(_questions()), out) == 5
    return out.getvalue()


def _exact(read: list[dict[str, object]]) -> None:
    for got, q in zip(read, _questions()):
        assert got["question"] == normalised(q.question)
        assert got["choices"] == q.choices
        assert got["answer_index"] == q.answer_index


def test_moodle_xml_reads_back_exactly_and_states_the_language() -> None:
    data = _bank("moodle-xml")
    read = read_moodle(data)
    _exact([q for _, q in read])
    assert [c for c, _ in read][0] == ["$course$", "top", "آزمون ابری", "فصل اول: ذخیره‌سازی"]
    text = data.decode()
    # The Persian chapter's question, choices and feedback: 1 + 4 + 1 each.
    assert text.count('<div lang="fa" dir="rtl">') == 6 * len(PERSIAN)
    assert "Which port does HTTPS use?" in text and text.count("<div lang") == 6 * len(PERSIAN)


def test_qti_reads_back_exactly_and_states_the_language() -> None:
    data = _bank("qti")
    _, read = read_qti(data)
    _exact([q for _, q in read])
    package = open_package(data)
    langs = [m.get("{http://www.w3.org/XML/1998/namespace}lang")
             for m in package.assessment.iter(f"{QTI}mattext")]
    assert langs.count("fa") == 6 * len(PERSIAN) and langs.count(None) == 6
    assert all(strict_unhtml(m.text or "") for m in package.assessment.iter(f"{QTI}mattext"))


def test_gift_keeps_the_text_byte_exact() -> None:
    data = _bank("gift")
    read = read_gift(data)
    _exact([q for _, q in read])
    for text in PERSIAN:
        # No normal form, no folding: the bytes as stored (but GIFT's own escape of ":").
        assert text.replace(":", "\\:").encode() in data
    assert b"lang=" not in data


def test_anki_keeps_the_text_byte_exact(tmp_path: Path) -> None:
    col = read_collection(_bank("anki"), tmp_path)
    for (_, _, flds, _, _), q in zip(col.notes, _questions()):
        question, *choices, letter, _ = flds.split("\x1f")
        assert question == q.question and tuple(choices) == q.choices  # no HTML to decode
        assert "ABCD".index(letter) == q.answer_index


def test_an_english_chapter_is_exported_as_before() -> None:
    english = BankExam("ex", "Exam", (BankChapter("en", "English chapter", 1),))
    q = _questions()[-1]
    for fmt in ("moodle-xml", "qti"):
        out = io.BytesIO()
        write_bank(fmt, english, iter([q]), out)
        raw = out.getvalue()
        if fmt == "qti":
            import zipfile

            with zipfile.ZipFile(io.BytesIO(raw)) as zf:
                raw = b"".join(zf.read(n) for n in zf.namelist())
        assert not re.search(rb"lang=|<div|&lt;div", raw)
