"""`exams`' fast path: the page of exams from a SQLite database through the plain sqlite3
driver, without importing SQLAlchemy, SQLModel or the store; and the page's printing, which
both paths share.

Why: a command that only reads should answer at once (issue 28: at most 0.5 s launch to exit
on a small database). The store's path cannot: importing SQLAlchemy, SQLModel and the store's
tables alone is about 0.7 s of this machine's CPU (bench/results-launch.md), before any query.
This path runs the queries of `Reports.exam_page` and `Reports._summaries` (storage/reports.py)
as SQL text on one snapshot; tests/unit/test_read_fast.py holds the two paths to the same
output for exams in every state.

Like producer/export_sqlite.py it only takes the happy case: a SQLite file with the schema
revision of this code, no `--after`, and every exam on one page. Anything else (PostgreSQL,
an older schema, a cursor, a next page, a damaged file) returns False before printing
anything, and the caller takes the store's path, which gives the usual output or error.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Any

import click
from rich.console import Console

from examforge.settings import load_settings
from producer.export_sqlite import open_snapshot
from producer.words import plural, when


def console(stderr: bool = False) -> Console:
    """Lines never wrap (they are read by scripts, logs and `| tee` as often as by people);
    off a terminal, tables are as wide as their cells (a width that never binds), so no cell
    is cut mid-phrase, where rich would wrap at 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=True,
                   width=None if stream.isatty() else 100_000)


def print_exams(items: list[dict[str, Any]], next_cursor: str | None, after: str | None,
                limit: int, as_json: bool, out: Console | None = None) -> None:
    """`exams`: the page's items (each as `exams --json` gives it) as JSON or a table."""
    if as_json:
        click.echo(json.dumps({"items": items, "next": next_cursor}, ensure_ascii=False))
        return
    from rich.table import Table

    out = out or console()
    title = plural(len(items), "exam") + (" on this page" if next_cursor or after else "")
    table = Table(title=title)
    for col in ("exam", "title", "state", "chapters", "questions", "cost", "last change"):
        table.add_column(col)
    for e in items:
        table.add_row(e["exam"], e["title"], e["state"],
                      f"{e['chapters']['done']}/{e['chapters']['total']}",
                      f"{e['questions']['done']}/{e['questions']['target']}",
                      f"${e['cost_usd']:.4f}", e["updated_at"] or "-")
    out.print(table)
    if next_cursor:
        same = "" if limit == 100 else f" --limit {limit}"  # the next page, the same size
        out.print(f"more: python -m producer exams{same} --after {next_cursor} (or --all)")


# Reports._summaries' two grouped reads, for the exams of a page: the slices by chapter then
# by exam (a done slice counts its target as stored; an open one, its questions in range),
# and the ledger by exam.
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


def _state(stored: str, total: int, done: int, active: bool, failed: bool) -> str:
    """storage.reports.exam_state of the counts `_summaries` makes."""
    if done == total:
        return "done"
    if stored == "paused" or active:
        return stored
    return "failed" if failed else "cancelled"


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
            "state": _state(stored, total, finished, bool(agg and agg[3]),
                            bool(agg and agg[4])),
            "chapters": {"done": finished, "total": total},
            "questions": {"done": int(agg[6]) if agg else 0,
                          "target": int(agg[5]) if agg else 0},
            "cost_usd": round(float(cost[1]) if cost else 0.0, 6),
            "updated_at": when(last)})
    return items


def exams(as_json: bool, limit: int, after: str | None, every: bool) -> bool:
    """`python -m producer exams` when this path applies (True: printed); False: nothing
    printed, take producer.commands."""
    if after is not None:
        return False
    conn = open_snapshot(load_settings().database_url)
    if conn is None:
        return False
    try:
        items = exam_items(conn, None if every else limit)
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    if items is None:
        return False
    print_exams(items, None, after, limit, as_json)
    return True
