"""Write an exam's questions as JSON Lines, JSON or CSV, atomically."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

FORMATS = ("jsonl", "json", "csv")


def _iso(epoch: object) -> str:
    return datetime.fromtimestamp(float(epoch), timezone.utc).isoformat(timespec="seconds")  # type: ignore[arg-type]


def render(rows: list[dict[str, object]], fmt: str) -> str:
    rows = [{**r, "created_at": _iso(r["created_at"])} for r in rows]
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if fmt == "json":
        return json.dumps(rows, ensure_ascii=False, indent=2) + "\n"
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["exam", "chapter_id", "number", "question", "choice_a", "choice_b",
                     "choice_c", "choice_d", "answer_index", "explanation", "model", "created_at"])
    for r in rows:
        writer.writerow([r["exam"], r["chapter_id"], r["number"], r["question"],
                         *r["choices"], r["answer_index"], r["explanation"],  # type: ignore[misc]
                         r["model"], r["created_at"]])
    return out.getvalue()


def write_atomic(path: Path, data: str) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it: readers see the old
    file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export(rows: list[dict[str, object]], fmt: str, target: str) -> None:
    data = render(rows, fmt)
    if target == "-":
        sys.stdout.write(data)
        sys.stdout.flush()
    else:
        write_atomic(Path(target), data)
