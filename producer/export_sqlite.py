"""`export`'s fast path: JSON Lines, JSON and CSV from a SQLite database through the plain
sqlite3 driver, without importing SQLAlchemy, SQLModel or the store.

Why: an export of 100,000 questions is mostly start-up and per-row overhead. The store's path
(producer/commands.py `export`) imports storage (SQLAlchemy, SQLModel, the migrations: about
0.7 s on this machine) and builds a SQLAlchemy row and then a second dict per question; issue
19 asks for the export within 1.5x a bare sqlite3 + json loop, launch to exit. This path reads
the same query as `Reports.iter_questions`, one snapshot, straight off a sqlite3 cursor, and
hands the writers rows whose `created_at` is already ISO text. The writers are the same
functions (producer/export.py), so the bytes are the same (tests/unit/test_export_fast.py
compares both paths in every format).

It only takes the happy case: a SQLite file that exists, with the schema revision of this
code, and the exam in it. Anything else (PostgreSQL, a bank format, an older schema, an
unknown exam, a damaged file) returns None and the caller takes the store's path, which
raises the usual one-line error.
"""

from __future__ import annotations

import json
import sys
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from examforge.item_types import load, reply_fields
from examforge.settings import load_settings
from producer.export import (TABLE_FORMATS, check_target, default_name, table_writer,
                             write_atomic)
from producer.sqlite_file import open_snapshot
from producer.words import plural

# The same selection and order as storage.reports.Reports.iter_questions (and its _in_range).
QUERY = (
    "SELECT q.exam, q.chapter_id, q.number, q.question, q.choices, q.answer_index, "
    "q.explanation, q.difficulty, q.bloom, q.source, q.verdict, q.model, q.created_at, "
    "q.type, q.answer "
    "FROM question q "
    "JOIN slice s ON s.exam = q.exam AND s.chapter_id = q.chapter_id "
    "AND q.number >= s.first_number AND q.number < s.first_number + s.target "
    "WHERE q.exam = ? AND {review} ORDER BY s.position, s.chapter_id, q.number")
# A question a reviewer rejected is never exported; `--approved-only` writes the approved ones.
REVIEWED = {False: "q.review <> 'rejected'", True: "q.review = 'approved'"}
def rows(conn: sqlite3.Connection, slug: str,
         approved_only: bool = False) -> Iterator[dict[str, object]]:
    """The exam's questions as the writers' rows, `created_at` already ISO (UTC, seconds).
    A batch's questions share one timestamp, so the last conversion is reused."""
    loads, utc, fromtimestamp = json.loads, timezone.utc, datetime.fromtimestamp
    last_epoch: object = None
    last_iso = ""
    cur = conn.execute(QUERY.format(review=REVIEWED[approved_only]), (slug,))
    cur.arraysize = 1000
    for (exam, chapter_id, number, question, choices, answer_index, explanation, difficulty,
         bloom, source, verdict, model, created_at, kind, answer) in cur:
        if created_at != last_epoch:
            last_epoch = created_at
            last_iso = fromtimestamp(float(created_at), utc).isoformat(timespec="seconds")
        yield {"exam": exam, "chapter_id": chapter_id, "number": number, "question": question,
               "choices": loads(choices), "answer_index": answer_index,
               "explanation": explanation, "difficulty": difficulty, "bloom": bloom,
               "source": source, "verdict": verdict, "model": model, "created_at": last_iso,
               "type": kind, **reply_fields(kind, load(answer))}


def export(database_url: str, exams_dir: Path, slug: str, fmt: str,
           target: str | None, approved_only: bool = False, bom: bool = False) -> int | None:
    """Write the export and return how many questions, or None when this path does not apply
    (nothing written then)."""
    if fmt not in TABLE_FORMATS or (bom and fmt != "csv"):  # the store's path refuses it
        return None
    conn = open_snapshot(database_url)
    if conn is None:
        return None
    try:
        try:
            if conn.execute("SELECT 1 FROM exam WHERE slug = ?", (slug,)).fetchone() is None:
                return None
            if approved_only and conn.execute(
                    QUERY.format(review=REVIEWED[True]) + " LIMIT 1", (slug,)).fetchone() is None:
                return None  # nothing approved: the store's path refuses it, in one line
        except sqlite3.Error:
            return None
        if target is not None:
            check_target(fmt, target)
        target = target or str(exams_dir / slug / default_name(fmt))
        writer = table_writer(fmt, bom)
        if target == "-":
            n = writer(rows(conn, slug, approved_only), sys.stdout, dated=True)
            sys.stdout.flush()
            return n
        try:
            return write_atomic(Path(target),
                                lambda f: writer(rows(conn, slug, approved_only), f,
                                                  dated=True))
        except sqlite3.Error:
            return None  # the temporary file is gone: the store's path says what is wrong
    finally:
        conn.close()


def command(slug: str, fmt: str, target: str | None, approved_only: bool = False,
            bom: bool = False) -> bool:
    """`python -m producer export` when this path applies (True: done, and said so on
    stderr as the store's path says it); False: nothing done, take producer.commands."""
    settings = load_settings()
    n = export(settings.database_url, settings.exams_dir, slug, fmt, target, approved_only, bom)
    if n is None:
        return False
    if target != "-":
        target = target or str(settings.exams_dir / slug / default_name(fmt))
        print(f"wrote {plural(n, 'question')} to {target}", file=sys.stderr)
    return True
