"""Write an exam's questions as JSON Lines, JSON or CSV, streamed and atomically.

Rows come from the store as a stream (`Store.iter_questions`) and go straight to the file, so an
export of 100,000 questions holds one question in memory at a time. The file is written to a
temporary name beside the target and renamed over it once complete: readers see the old file
or the new one, never half of one.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable, Iterable

from examforge.errors import UserError

FORMATS = ("jsonl", "json", "csv")
CSV_COLUMNS = ["exam", "chapter_id", "number", "question", "choice_a", "choice_b", "choice_c",
               "choice_d", "answer_index", "explanation", "model", "created_at"]

Rows = Iterable[dict[str, object]]


def _iso(epoch: object) -> str:
    return datetime.fromtimestamp(float(epoch), timezone.utc).isoformat(timespec="seconds")  # type: ignore[arg-type]


def _dated(rows: Rows) -> Rows:
    for r in rows:
        yield {**r, "created_at": _iso(r["created_at"])}


def write_jsonl(rows: Rows, out: IO[str]) -> int:
    n = 0
    dumps = json.dumps
    for n, r in enumerate(_dated(rows), 1):
        out.write(dumps(r, ensure_ascii=False))
        out.write("\n")
    return n


def write_json(rows: Rows, out: IO[str]) -> int:
    """A JSON array, written item by item (the same text `json.dumps(rows, indent=2)` gives)."""
    n = 0
    out.write("[")
    for n, r in enumerate(_dated(rows), 1):
        item = json.dumps(r, ensure_ascii=False, indent=2).replace("\n", "\n  ")
        out.write(("\n  " if n == 1 else ",\n  ") + item)
    out.write("\n]\n" if n else "]\n")
    return n


def write_csv(rows: Rows, out: IO[str]) -> int:
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    n = 0
    for n, r in enumerate(_dated(rows), 1):
        writer.writerow([r["exam"], r["chapter_id"], r["number"], r["question"],
                         *r["choices"], r["answer_index"], r["explanation"],  # type: ignore[misc]
                         r["model"], r["created_at"]])
    return n


WRITERS: dict[str, Callable[[Rows, IO[str]], int]] = {
    "jsonl": write_jsonl, "json": write_json, "csv": write_csv}


def render(rows: Rows, fmt: str) -> str:
    """The whole export as one string (tests, small exams)."""
    import io

    buffer = io.StringIO(newline="")
    WRITERS[fmt](rows, buffer)
    return buffer.getvalue()


def write_atomic(path: Path, write: Callable[[IO[str]], int]) -> int:
    """Write through `write` to a temporary file beside `path`, fsync, then rename over it.

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
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            n = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return n
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export(rows: Rows, fmt: str, target: str) -> int:
    """Write `rows` in `fmt` to `target` (a path, or - for stdout); returns how many."""
    writer = WRITERS[fmt]
    if target == "-":
        n = writer(rows, sys.stdout)
        sys.stdout.flush()
        return n
    return write_atomic(Path(target), lambda f: writer(rows, f))
