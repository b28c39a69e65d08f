"""The fast path of the commands that only read (`exams`, `status`, `review`): their reports
from a SQLite database through the plain sqlite3 driver, without importing SQLAlchemy,
SQLModel or the store.

Why the SQL below is written by hand: a command that only reads should answer at once
(issue 28: at most 0.5 s launch to exit on a small database). The store's path cannot:
importing SQLAlchemy, SQLModel and the store's tables alone is about 0.7 s of this machine's
CPU (bench/results-launch.md), before any query. So this path sends the store's own queries
(storage/reports.py `Reports.exam_page`, `Reports.status`; storage/review.py
`Review.review_summary`) as SQL text, on one snapshot, and hands the rows to the same
functions the store hands its rows to (storage/report_types.py: `exam_report`,
`chapter_reviews`, `summary_state`), which import no SQLAlchemy; the printing is the same
too (producer/printing.py). tests/unit/test_read_fast.py and test_read_fast_status.py hold
the two paths to the same output for exams in every state: a change to one of those queries
must be made here as well, and those tests fail until it is.

Like producer/export_sqlite.py it only takes the happy case: a SQLite file with the schema
revision of this code, an exam that is in it, no `--after`, every exam on one page, no
`--watch`. Anything else (PostgreSQL, an older schema, an unknown exam, a cursor, a next
page, a damaged file) returns False before printing anything, and the caller takes the
store's path, which gives the usual output or one-line error.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from typing import Any, Callable, TypeVar

from examforge.settings import load_settings
from producer.sqlite_file import open_snapshot
from producer.printing import print_exams, print_review, print_status
from producer.words import when
from storage.report_types import (BatchRow, ChapterReview, ExamReport, StatusRows,
                                  chapter_reviews, exam_report, summary_state, tally_verdicts)

# The database clock on SQLite: storage.db.db_now("sqlite"), which a unit test holds equal.
NOW = "((julianday('now') - 2440587.5) * 86400.0)"
RECENT_ERRORS = 5  # storage.reports.RECENT_ERRORS, which a unit test holds equal
# A question in the range of a slice (storage.reports.Reports._in_range).
IN_RANGE = ("q.exam = s.exam AND q.chapter_id = s.chapter_id AND q.number >= s.first_number "
            "AND q.number < s.first_number + s.target")


def _named(cur: sqlite3.Cursor) -> list[Any]:
    """The rows of `cur` with their columns as attributes, as the store's rows have them."""
    row = namedtuple("row", [d[0] for d in cur.description])  # type: ignore[misc]
    return [row._make(r) for r in cur]


def _exists(conn: sqlite3.Connection, slug: str) -> bool:
    return conn.execute("SELECT 1 FROM exam WHERE slug = ?", (slug,)).fetchone() is not None


# --- exams: Reports._summaries' two grouped reads, for the exams of a page: the slices by
# chapter then by exam (a done slice counts its target as stored; an open one, its
# questions in range), and the ledger by exam.
_CHAPTERS = """
SELECT exam, COUNT(*), SUM(done), MAX(active), MAX(failed), SUM(target), SUM(stored),
       MAX(changed)
FROM (SELECT s.exam AS exam,
             MIN(CASE WHEN s.state = 'done' THEN 1 ELSE 0 END) AS done,
             MAX(CASE WHEN s.state IN ('pending', 'running') THEN 1 ELSE 0 END) AS active,
             MAX(CASE WHEN s.state = 'failed' THEN 1 ELSE 0 END) AS failed,
             SUM(s.target) AS target,
             SUM(CASE WHEN s.state = 'done' THEN s.target ELSE
                 (SELECT COUNT(*) FROM question q WHERE q.exam = s.exam
                  AND q.chapter_id = s.chapter_id AND q.number >= s.first_number
                  AND q.number < s.first_number + s.target) END) AS stored,
             MAX(s.updated_at) AS changed
      FROM slice s WHERE s.exam IN ({slugs}) GROUP BY s.exam, s.chapter_id)
GROUP BY exam"""
_LEDGER = ("SELECT exam, COALESCE(SUM(cost_usd), 0.0), MAX(finished_at) FROM call "
           "WHERE exam IN ({slugs}) GROUP BY exam")


def exam_items(conn: sqlite3.Connection, limit: int | None) -> list[dict[str, Any]] | None:
    """Every exam, newest first, as `exams --json` items; None if there are more than
    `limit` (a next page: its cursor is the store's to make)."""
    query = "SELECT slug, title, state, updated_at FROM exam ORDER BY created_at DESC, slug DESC"
    exams = conn.execute(query + ("" if limit is None else f" LIMIT {int(limit) + 1}")).fetchall()
    if limit is not None and len(exams) > limit:
        return None
    per_exam: dict[str, tuple[Any, ...]] = {}
    ledger: dict[str, tuple[Any, ...]] = {}
    for start in range(0, len(exams), 500):  # SQLite's bound parameters per statement
        slugs = [e[0] for e in exams[start:start + 500]]
        marks = ", ".join("?" * len(slugs))
        per_exam.update((r[0], r) for r in conn.execute(_CHAPTERS.format(slugs=marks), slugs))
        ledger.update((r[0], r) for r in conn.execute(_LEDGER.format(slugs=marks), slugs))
    items = []
    for slug, title, stored, updated_at in exams:
        agg = per_exam.get(slug)
        total, finished = (int(agg[1]), int(agg[2])) if agg else (0, 0)
        cost = ledger.get(slug)
        last = max(filter(None, (updated_at, agg[7] if agg else None,
                                 cost[2] if cost else None)), default=None)
        items.append({
            "exam": slug, "title": title,
            "state": summary_state(stored, total, finished, bool(agg and agg[3]),
                                   bool(agg and agg[4])),
            "chapters": {"done": finished, "total": total},
            "questions": {"done": int(agg[6]) if agg else 0,
                          "target": int(agg[5]) if agg else 0},
            "cost_usd": round(float(cost[1]) if cost else 0.0, 6),
            "updated_at": when(last)})
    return items


# --- status: Reports.status's reads, in its order (with storage.grounding.coverage and
# storage.reports.verification_counts).
_PASSAGES = "SELECT chapter_id, COUNT(*) FROM passage WHERE exam = ? GROUP BY chapter_id"
_CITED = ("SELECT chapter_id, COUNT(DISTINCT passage) FROM question "
          "WHERE exam = ? AND passage IS NOT NULL GROUP BY chapter_id")
_VERDICTS = ("SELECT chapter_id, verdict, withdrawn IS NOT NULL, COUNT(*) FROM question "
             "WHERE exam = ? AND verdict IS NOT NULL "
             "GROUP BY chapter_id, verdict, withdrawn IS NOT NULL")
_UNVERIFIED = ("SELECT chapter_id, COUNT(*) FROM question "
               "WHERE exam = ? AND number IS NOT NULL AND verdict IS NULL GROUP BY chapter_id")
_USAGE_KEYS = ("chapter_id, outcome, endpoint, usage_estimated, price_known, model, "
               "service_tier")
_USAGE = (f"SELECT {_USAGE_KEYS}, COUNT(*), COALESCE(SUM(prompt_tokens), 0), "
          "COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_usd), 0.0), "
          "COALESCE(SUM(reserved_usd), 0.0), COALESCE(SUM(questions_stored), 0), "
          f"COALESCE(SUM(cached_tokens), 0) FROM call WHERE exam = ? GROUP BY {_USAGE_KEYS}")
# Reports._slice_rows with the columns status names.
_SLICE_KEYS = ", ".join(f"s.{c}" for c in (
    "chapter_id", "slice_no", "position", "title", "first_number", "target", "state",
    "attempts", "attempts_since_progress", "lease_owner", "lease_expires_at",
    "last_error_code", "last_error", "last_error_at", "requeues", "requeued_at",
    "requeue_code", "requeue_reason", "language"))
_SLICES = (f"SELECT {_SLICE_KEYS}, COUNT(q.id) AS stored FROM slice s "
           f"LEFT OUTER JOIN question q ON {IN_RANGE} WHERE s.exam = ? "
           f"GROUP BY {_SLICE_KEYS} ORDER BY s.position, s.chapter_id, s.slice_no")
_TIMES = ("SELECT (SELECT MIN(started_at) FROM call WHERE exam = ?) AS first, "
          "(SELECT MAX(finished_at) FROM call WHERE exam = ?) AS last, "
          "(SELECT MAX(updated_at) FROM slice WHERE exam = ?) AS changed, "
          "(SELECT COUNT(*) FROM question WHERE exam = ? AND created_at >= ?) AS last_minute")
_ERRORS = ("SELECT finished_at, chapter_id, slice_no, outcome, reason, detail FROM call "
           "WHERE exam = ? AND outcome IN ('failed', 'wasted') "
           f"ORDER BY finished_at DESC LIMIT {RECENT_ERRORS}")
_BATCHES = "SELECT * FROM batch WHERE exam = ? ORDER BY created_at DESC, id"


def status_rows(conn: sqlite3.Connection, slug: str) -> StatusRows | None:
    """What Reports.status reads of the exam, from the snapshot `conn` is in; None when the
    database has no such exam (the store's path says so)."""
    if not _exists(conn, slug):
        return None
    one = (slug,)
    exam = _named(conn.execute(
        "SELECT title, state, pause_reason, pause_code, budget_usd, updated_at, mode, verify, "
        f"language, {NOW} AS now FROM exam WHERE slug = ?", one))[0]
    passages = dict(conn.execute(_PASSAGES, one).fetchall())
    cited = dict(conn.execute(_CITED, one).fetchall()) if passages else {}
    verdicts = conn.execute(_VERDICTS, one).fetchall()
    unverified = conn.execute(_UNVERIFIED, one).fetchall() if verdicts else []
    batches = conn.execute(_BATCHES, one)
    names = [d[0] for d in batches.description]
    return StatusRows(
        exam=exam,
        coverage={cid: (int(cited.get(cid, 0)), int(n)) for cid, n in passages.items()},
        verified=tally_verdicts(verdicts, unverified),
        usage=conn.execute(_USAGE, one).fetchall(),
        slices=_named(conn.execute(_SLICES, one)),
        times=_named(conn.execute(_TIMES, (slug, slug, slug, slug, exam.now - 60)))[0],
        errors=_named(conn.execute(_ERRORS, one)),
        batches=[BatchRow.from_row(dict(zip(names, r))) for r in batches])


T = TypeVar("T")


def _on_snapshot(database_url: str, read: Callable[[sqlite3.Connection], T | None]) -> T | None:
    """`read` on one snapshot of the SQLite file; None where this path does not apply (not a
    SQLite file of this schema, or a read the driver refused: the store's path then answers)."""
    conn = open_snapshot(database_url)
    if conn is None:
        return None
    try:
        return read(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def report(database_url: str, slug: str) -> ExamReport | None:
    """`status`'s report of the exam, or None when this path does not apply."""
    rows = _on_snapshot(database_url, lambda conn: status_rows(conn, slug))
    return None if rows is None else exam_report(slug, rows)


# --- review: Review.review_summary's reads.
_REVIEW_CHAPTERS = ("SELECT chapter_id, MIN(title) AS title, MIN(position) AS position, "
                    "SUM(target) AS target FROM slice WHERE exam = ? GROUP BY chapter_id "
                    "ORDER BY MIN(position), chapter_id")
_BY_REVIEW = (f"SELECT q.chapter_id, q.review, COUNT(*) FROM question q JOIN slice s "
              f"ON {IN_RANGE} WHERE q.exam = ? GROUP BY q.chapter_id, q.review")
_REJECTED = ("SELECT chapter_id, COUNT(*) FROM question WHERE exam = ? "
             "AND review = 'rejected' GROUP BY chapter_id")
_DISPUTED = ("SELECT chapter_id, COUNT(*) FROM question WHERE exam = ? "
             "AND verdict = 'disputed' AND review != 'rejected' GROUP BY chapter_id")
_VERIFIED = "SELECT id FROM question WHERE exam = ? AND verdict IS NOT NULL LIMIT 1"
_UNSOLVED = (f"SELECT q.chapter_id, COUNT(*) FROM question q JOIN slice s ON {IN_RANGE} "
             "WHERE q.exam = ? AND (q.verdict IS NULL OR q.verdict = 'pending') "
             "GROUP BY q.chapter_id")


def review_chapters(conn: sqlite3.Connection, slug: str) -> list[ChapterReview] | None:
    """What Review.review_summary gives of the exam, from the snapshot `conn` is in; None
    when the database has no such exam (the store's path says so)."""
    if not _exists(conn, slug):
        return None
    one = (slug,)

    def by_chapter(query: str) -> dict[str, int]:
        return {c: int(n) for c, n in conn.execute(query, one)}

    return chapter_reviews(
        _named(conn.execute(_REVIEW_CHAPTERS, one)),
        {(c, review): int(n) for c, review, n in conn.execute(_BY_REVIEW, one)},
        by_chapter(_REJECTED), by_chapter(_DISPUTED),
        conn.execute(_VERIFIED, one).fetchone() is not None, by_chapter(_UNSOLVED))


# --- the commands

def exams(as_json: bool, limit: int, after: str | None, every: bool) -> bool:
    """`python -m producer exams` when this path applies (True: printed); False: nothing
    printed, take producer.commands."""
    if after is not None:
        return False
    items = _on_snapshot(load_settings().database_url,
                         lambda conn: exam_items(conn, None if every else limit))
    if items is None:
        return False
    print_exams(items, None, after, limit, as_json)
    return True


def status(slug: str, as_json: bool, watch: bool) -> bool:
    """`python -m producer status` when this path applies (True: printed); False: nothing
    printed, take producer.commands (`--watch` always does)."""
    if watch:
        return False
    found = report(load_settings().database_url, slug)
    if found is None:
        return False
    print_status(found, as_json)
    return True


def review(slug: str, as_json: bool) -> bool:
    """`python -m producer review` when this path applies (True: printed); False: nothing
    printed, take producer.commands. `--json` always does: it carries each review filter's
    count (storage.review's filter_counts), which this path does not read."""
    if as_json:
        return False
    chapters = _on_snapshot(load_settings().database_url,
                            lambda conn: review_chapters(conn, slug))
    if chapters is None:
        return False
    print_review(slug, chapters)
    return True
