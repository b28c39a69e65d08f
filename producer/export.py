"""Write an exam's questions as JSON Lines, JSON, CSV or a question bank, streamed and atomically.

Rows come from the store as a stream (`Store.iter_questions`) and go straight to the file, so an
export of 100,000 questions holds one question in memory at a time (the bank formats: as their
writers allow, see examforge.banks). The file is written to a temporary name beside the target
and renamed over it once complete: readers see the old file or the new one, never half of one.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable, Iterable, Iterator

from examforge import banks, item_types
from examforge.errors import UserError

TABLE_FORMATS = ("jsonl", "json", "csv")
FORMATS = (*TABLE_FORMATS, *banks.FORMATS)
# Formats that are not text: a terminal or a pipe is no place for them.
BINARY_FORMATS = ("anki", "qti")
CSV_COLUMNS = ["exam", "chapter_id", "number", "question", "choice_a", "choice_b", "choice_c",
               "choice_d", "answer_index", "explanation", "difficulty", "bloom", "source",
               "verdict", "model", "created_at", "type", "answer"]

Rows = Iterable[dict[str, object]]


def _iso(epoch: object) -> str:
    return datetime.fromtimestamp(float(epoch), timezone.utc).isoformat(timespec="seconds")  # type: ignore[arg-type]


def _dated(rows: Rows) -> Rows:
    for r in rows:
        yield {**r, "created_at": _iso(r["created_at"])}


# The writers take rows whose `created_at` is an epoch, or with `dated` already ISO text (the
# SQLite fast path, producer/export_sqlite.py, converts as it reads). One encoder each:
# `json.dumps` with keyword arguments builds a new JSONEncoder per call.
_LINE = json.JSONEncoder(ensure_ascii=False).encode
_ITEM = json.JSONEncoder(ensure_ascii=False, indent=2).encode


def write_jsonl(rows: Rows, out: IO[str], *, dated: bool = False) -> int:
    n = 0
    encode, write = _LINE, out.write
    for n, r in enumerate(rows if dated else _dated(rows), 1):
        write(encode(r) + "\n")
    return n


def _json_item(r: dict[str, object]) -> str:
    """`r` as an item of the indented array: `json.dumps(r, indent=2)` shifted by two spaces.
    A question is flat (scalars, and a list of scalars for its choices), so it is laid out
    here around the C encoder's scalars; the indenting encoder is pure Python and took half
    of a JSON export's time. Anything deeper goes to that encoder."""
    encode = _LINE
    parts = []
    for k, v in r.items():
        if type(k) is not str or isinstance(v, dict):
            return _ITEM(r).replace("\n", "\n  ")
        if isinstance(v, (list, tuple)):
            if any(isinstance(x, (list, tuple, dict)) for x in v):
                return _ITEM(r).replace("\n", "\n  ")
            text = ("[\n      " + ",\n      ".join(map(encode, v)) + "\n    ]") if v else "[]"
        else:
            text = encode(v)
        parts.append(f"    {encode(k)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n  }" if parts else "{}"


def write_json(rows: Rows, out: IO[str], *, dated: bool = False) -> int:
    """A JSON array, written item by item (the same text `json.dumps(rows, indent=2)` gives)."""
    n = 0
    out.write("[")
    for n, r in enumerate(rows if dated else _dated(rows), 1):
        out.write(("\n  " if n == 1 else ",\n  ") + _json_item(r))
    out.write("\n]\n" if n else "]\n")
    return n


def write_csv(rows: Rows, out: IO[str], *, dated: bool = False, bom: bool = False) -> int:
    """CSV, with `bom` starting with a UTF-8 byte-order mark: spreadsheet programs (Excel)
    read a CSV as UTF-8 only then, and show Persian, Arabic or Russian text as mojibake
    otherwise."""
    if bom:
        out.write("\ufeff")
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    n = 0
    for n, r in enumerate(rows if dated else _dated(rows), 1):
        choices = r["choices"] if r.get("type", "mcq") == "mcq" else ("", "", "", "")
        writer.writerow([r["exam"], r["chapter_id"], r["number"], r["question"],
                         *choices, r["answer_index"], r["explanation"],  # type: ignore[misc]
                         r.get("difficulty") or "", r.get("bloom") or "",
                         r.get("source") or "", r.get("verdict") or "", r["model"],
                         r["created_at"], *_typed_columns(r)])
    return n


def _typed_columns(r: dict[str, object]) -> list[str]:
    """The `type` column, and `answer`: a type other than mcq's answer fields as JSON (a
    multi's choices with them, since the four choice columns cannot hold six)."""
    kind = str(r.get("type") or "mcq")
    if kind == "mcq":
        return [kind, ""]
    fields = item_types.reply_fields(kind, item_types.from_fields(kind, r))
    if kind == "multi":
        fields = {"choices": r["choices"], **fields}
    return [kind, json.dumps(fields, ensure_ascii=False)]


WRITERS: dict[str, Callable[..., int]] = {
    "jsonl": write_jsonl, "json": write_json, "csv": write_csv}


BOM_ONLY_CSV = "--bom: a byte-order mark is for CSV only (--format csv)"


def table_writer(fmt: str, bom: bool = False) -> Callable[..., int]:
    """The writer of a table format; with `bom` (CSV only), a CSV starting with a UTF-8
    byte-order mark."""
    if bom and fmt != "csv":
        raise UserError(BOM_ONLY_CSV)
    return functools.partial(write_csv, bom=True) if bom else WRITERS[fmt]


def render(rows: Rows, fmt: str) -> str:
    """The whole export as one string (tests, small exams)."""
    buffer = io.StringIO(newline="")
    WRITERS[fmt](rows, buffer)
    return buffer.getvalue()


def write_atomic(path: Path, write: Callable[[Any], int], *, binary: bool = False) -> int:
    """Write through `write` to a temporary file beside `path`, fsync, then rename over it.
    `write` gets a text file (UTF-8, no newline translation), or with `binary` a binary one.

    The parent directory must exist (a typo in `-o` must not create directories). The file
    gets the usual mode for new files (0666 less the umask), not mkstemp's private 0600: an
    export is meant to be read by others, as `>` in a shell would make it."""
    if not path.parent.is_dir():
        raise UserError(f"-o {path}: directory {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        f: IO[Any]
        with (os.fdopen(fd, "wb") if binary else
              os.fdopen(fd, "w", encoding="utf-8", newline="")) as f:
            n = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return n
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tags(row: dict[str, object]) -> tuple[str, ...]:
    """The tags a bank gives a stored question: its difficulty and Bloom level, when set."""
    return tuple(f"{name}:{row[name]}" for name in ("difficulty", "bloom") if row.get(name))


def bank_questions(rows: Rows) -> Iterator[banks.BankQuestion]:
    """Store rows as the bank writers' values, lazily."""
    for r in rows:
        yield banks.BankQuestion(
            chapter_id=str(r["chapter_id"]), number=int(r["number"]),  # type: ignore[call-overload]
            question=str(r["question"]), choices=tuple(r["choices"]),  # type: ignore[arg-type]
            answer_index=int(r["answer_index"]),  # type: ignore[call-overload]
            explanation=str(r["explanation"]), tags=tags(r), source=str(r.get("source") or ""),
            verdict=str(r.get("verdict") or ""), type=str(r.get("type") or "mcq"),
            answer=item_types.from_fields(str(r.get("type") or "mcq"), r))


def nothing_approved(slug: str) -> str:
    """What `export --approved-only` (and the API's 409) says of an exam with no approved
    question: no file is written."""
    return (f"exam {slug} has no approved question: nothing to export with --approved-only "
            f"(approve questions in the review first: python -m producer review {slug})")


def default_name(fmt: str) -> str:
    """The file an export goes to in the exam's folder when no `-o` is given."""
    return "generated" + (banks.FORMATS[fmt].suffix if fmt in banks.FORMATS else f".{fmt}")


def check_target(fmt: str, target: str) -> None:
    """Refuse, before anything is read, what cannot be written: a binary format on stdout."""
    if target == "-" and fmt in BINARY_FORMATS:
        raise UserError(f"-o -: {fmt} is a binary format ({banks.FORMATS[fmt].suffix}); "
                        "write it to a file")


def export(rows: Rows, fmt: str, target: str,
           exam: banks.BankExam | Callable[[], banks.BankExam] | None = None,
           bom: bool = False) -> int:
    """Write `rows` in `fmt` to `target` (a path, or - for stdout); returns how many.
    The bank formats need the exam's outline (`exam`, or a function that reads it); `bom`
    starts a CSV with a UTF-8 byte-order mark."""
    check_target(fmt, target)
    if bom and fmt != "csv":
        raise UserError(BOM_ONLY_CSV)
    if fmt in TABLE_FORMATS:
        writer = table_writer(fmt, bom)
        if target == "-":
            n = writer(rows, sys.stdout)
            sys.stdout.flush()
            return n
        return write_atomic(Path(target), lambda f: writer(rows, f))
    outline = exam() if callable(exam) else exam
    if outline is None:
        raise ValueError(f"format {fmt} needs the exam's outline")

    def write(out: BinaryIO) -> int:
        try:
            return banks.write_bank(fmt, outline, bank_questions(rows), out)
        except ValueError as exc:  # a stored row no bank can hold: say which, write nothing
            raise UserError(f"export {fmt}: {exc}") from None

    if target == "-":
        sys.stdout.flush()
        n = write(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return n
    return write_atomic(Path(target), write, binary=True)
