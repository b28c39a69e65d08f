"""Question-bank exports that teachers load into learning platforms.

    write_bank("moodle-xml", exam, questions, out)   # Moodle XML
    write_bank("gift", exam, questions, out)         # Moodle GIFT
    write_bank("anki", exam, questions, out)         # Anki .apkg
    write_bank("qti", exam, questions, out)          # QTI 1.2 zip for Canvas

`questions` arrive grouped by chapter (in chapter position order) and by number within it;
they are read once, lazily. The text formats hold one question in memory at a time, QTI one
chapter (spooled to disk when large), Anki the whole bank (genanki's way). `out` is a binary
file; writing it to a temporary file and renaming it is the caller's job. See README.md for
how a teacher imports each one and what it carries.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, cast

from examforge.banks.model import BankChapter, BankExam, BankQuestion

__all__ = ["BankChapter", "BankExam", "BankQuestion", "Format", "FORMATS", "write_bank"]

Writer = Callable[[BankExam, Iterable[BankQuestion], BinaryIO], int]


@dataclass(frozen=True)
class Format:
    """One export format: its name in FORMATS, its file suffix and the module of its writer
    (`write`), imported when a bank is written: genanki alone is about a third of the
    start-up of `export` and `exams`, which name the formats but write none (issue 28)."""

    name: str
    suffix: str  # what the exported file's name ends with, e.g. "generated" + suffix
    module: str  # examforge.banks.<module>.write is the writer

    @property
    def write(self) -> Writer:
        module = importlib.import_module(f"examforge.banks.{self.module}")
        return cast(Writer, module.write)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("moodle-xml", ".xml", "moodle_xml"),
        # Moodle's GIFT import checks the file's type by its extension (text/plain): .txt.
        Format("gift", ".gift.txt", "gift"),
        Format("anki", ".apkg", "anki"),
        Format("qti", ".qti.zip", "qti"),
    )
}


def write_bank(fmt: str, exam: BankExam, questions: Iterable[BankQuestion], out: BinaryIO) -> int:
    """Write the whole bank in format `fmt` to the binary file `out`; return how many
    questions it holds.

    Raises ValueError for an unknown format, or for a question that breaks the contract
    (unknown chapter, chapters interleaved, numbers not increasing within a chapter). That
    can happen midway, with part of the bank already written: discard `out` then (the
    caller's write-to-temporary-and-rename does)."""
    try:
        writer = FORMATS[fmt].write
    except KeyError:
        raise ValueError(f"unknown bank format {fmt!r}; one of {', '.join(FORMATS)}") from None
    return writer(exam, questions, out)
