"""What the commands that only read print (`exams`, `status`, `review`): one function each,
which the store's path (producer/commands.py) and the plain-driver path of a SQLite file
(producer/read_sqlite.py) both call, so that both print the same (tests/unit/test_read_fast.py
and test_read_fast_status.py hold them to it). No SQLAlchemy here, and rich only when a table
is drawn: a `--json` imports none of it."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Sequence

import click

from examforge.errors import PauseCode, SliceReason
from examforge.languages import LANGUAGES
from producer.views import status_dict
from producer.words import duration, plural, when
from storage.report_types import (ChapterReview, ExamReport, VerificationCounts, batch_counts,
                                  batch_status)

if TYPE_CHECKING:
    from rich.console import Console


def console(stderr: bool = False) -> Console:
    """Lines never wrap (they are read by scripts, logs and `| tee` as often as by people);
    off a terminal, tables are as wide as their cells (a width that never binds), so no cell
    is cut mid-phrase, where rich would wrap at 80 columns."""
    from rich.console import Console

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


def print_status(report: ExamReport, as_json: bool, out: Console | None = None) -> None:
    """`status` (without --watch): the report as JSON or as a table and its lines."""
    if as_json:
        click.echo(json.dumps(status_dict(report), ensure_ascii=False))
        return
    _status_text(report, out or console())


# The chapters `status` draws in its table: rich lays a table out in time linear in its
# cells (20,000 chapters took 22 s), and no one reads that many rows; past this, the
# unfinished chapters come first and `--json` lists every one (README: Hostile or odd input).
STATUS_TABLE_ROWS = 1000


# The batches `status` lists (newest first); --json lists every one.
STATUS_BATCH_ROWS = 20


def short(text: str, limit: int = 120) -> str:
    """One table cell: the whole error is in `status --json`."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def verdicts_text(v: VerificationCounts) -> str:
    """A chapter's or an exam's blind-solve verdicts, as `status` prints them."""
    disputed = f"{v.disputed} disputed"
    if v.withdrawn:
        disputed += (" (replaced)" if v.withdrawn == v.disputed
                     else f" ({v.withdrawn} replaced)")
    return (f"{v.agreed} agreed, {disputed}, {v.pending} pending"
            + (f", {v.unverified} unverified" if v.unverified else ""))


def language_text(report: ExamReport) -> str:
    """The status line of the exam's language, with the chapters written in another."""
    def named(tag: str) -> str:
        known = LANGUAGES.get(tag)  # a tag of a newer examforge is shown as it is
        return known.label if known is not None else tag

    others = [c for c in report.chapter_list if c.language != report.language]
    return f"language: {named(report.language)}" + (
        "; chapters in another: " + ", ".join(f"{c.id} {named(c.language)}"
                                              for c in others[:10])
        + (f" and {len(others) - 10:,} more" if len(others) > 10 else "")
        if others else "")


def _status_text(report: ExamReport, out: Console) -> None:
    from rich.table import Table

    ch, q, u = report.chapters, report.questions, report.usage
    table = Table(title=f"{report.title} ({report.exam}) — {report.state}")
    # Chapters with sources: the passages their stored questions cite, of how many.
    grounded = any(c.material is not None for c in report.chapter_list)
    # Under VERIFY: the blind solve's verdicts (agreed, disputed, pending).
    verified = report.verification is not None
    for col in ("chapter", "state", "questions", "slices done", "attempts", "calls",
                *(("material cited",) if grounded else ()),
                *(("verdicts",) if verified else ()), "last error"):
        table.add_column(col)
    shown = report.chapter_list
    if len(shown) > STATUS_TABLE_ROWS:
        shown = sorted(shown, key=lambda c: c.state == "done")[:STATUS_TABLE_ROWS]
    for c in shown:
        # A slice handed back at a shutdown (Ctrl-C, a worker stopping) met no error.
        error = short(f"{when(c.last_error_at)} {c.last_error}") if c.last_error and \
            c.last_error_code != SliceReason.handed_back.value else ""
        slices = f"{c.slices_done}/{len(c.slices)}"
        running = sum(1 for s in c.slices if s.state == "running")
        if running and len(c.slices) > 1:
            slices += f" ({running} running)"
        # A slice held by a live provider batch is not stuck: say what it waits on.
        state = "waiting on batch" if c.waiting_on else c.state
        material = () if not grounded else (
            (f"{c.material.cited}/{c.material.passages} ({c.material.share:.0%})",)
            if c.material is not None else ("",))
        verdicts = () if not verified else (
            (verdicts_text(c.verification),) if c.verification is not None else ("",))
        table.add_row(c.id, state, f"{c.questions.done}/{c.questions.target}", slices,
                      str(c.attempts), str(c.calls), *material, *verdicts, error)
    out.print(table)
    if report.batches:
        _batches_text(report, out)
    if len(shown) < len(report.chapter_list):
        out.print(f"({len(report.chapter_list) - len(shown):,} more chapters not shown: the "
                  f"table has {STATUS_TABLE_ROWS:,} rows, unfinished chapters first; python -m "
                  f"producer status {report.exam} --json lists every one)", markup=False)
    waiting = sum(1 for c in report.chapter_list if c.waiting_on)
    out.print(f"chapters: {ch.done}/{ch.total} done, {ch.running} running"
              + (f" ({waiting} of them waiting on a provider batch)" if waiting else "")
              + f", {ch.pending} pending, {ch.failed} failed, {ch.cancelled} cancelled")
    out.print(f"questions: {q.done}/{q.target}")
    out.print(f"blind solves: {report.verify} (the exam's policy; every worker follows it)")
    out.print(language_text(report), markup=False)
    if report.verification is not None:
        out.print(f"verification: {verdicts_text(report.verification)}")
    if report.started_at is not None:
        out.print(f"time: started {when(report.started_at)}"
                  + (f", finished {when(report.finished_at)}" if report.finished_at else "")
                  + f", elapsed {duration(report.elapsed_s)}")
    out.print(f"calls: {u.calls} (used {u.calls_used}, wasted {u.calls_wasted}, "
              f"failed {u.calls_failed}, in flight {u.calls_in_flight}); "
              f"tokens: {u.prompt_tokens} prompt ({u.cached_tokens} of them cached) + "
              f"{u.completion_tokens} completion; "
              f"cost: ${report.cost_usd:.4f}")
    if report.budget_usd is not None:
        headroom = max(0.0, report.budget_usd - report.spent_usd - report.reserved_usd)
        out.print(f"budget: ${report.budget_usd:.4f}; spent ${report.spent_usd:.4f}, reserved "
                  f"${report.reserved_usd:.4f} (calls in flight, at their worst case), "
                  f"headroom ${headroom:.4f}")
    if u.calls_estimated:
        out.print(f"estimated usage: {plural(u.calls_estimated, 'call')} booked at our own token count "
                  f"(no usage from the provider, or no reply), ${u.estimated_cost_usd:.4f} of "
                  "the cost")
    if u.calls_imported:
        out.print(f"imported: {plural(u.questions_imported, 'question')} in "
                  f"{plural(u.calls_imported, 'batch', 'batches')} by "
                  "producer import (no request sent, $0; not counted in calls)")
    for model, n in report.unpriced_calls.items():
        out.print(f"[yellow]warning:[/] {plural(n, 'call')} of model {model!r} booked at $0: no price "
                  "was known (set LLM_PRICE_PROMPT_PER_MTOK and LLM_PRICE_COMPLETION_PER_MTOK)")
    if set(report.usage_by_tier) - {"default"}:
        # Calls served at a tier other than standard (LLM_SERVICE_TIER), each at its price.
        out.print("by service tier: " + "; ".join(
            f"{name} {plural(e.calls, 'call')}, ${e.cost_usd:.4f}"
            for name, e in sorted(report.usage_by_tier.items())))
    if "fallback" in report.usage_by_endpoint:
        out.print("by endpoint: " + "; ".join(
            f"{name} {plural(e.calls, 'call')}, ${e.cost_usd:.4f}"
            for name, e in sorted(report.usage_by_endpoint.items())))
    requeued = [c for c in report.chapter_list if c.requeues]
    if requeued:
        last = max(requeued, key=lambda c: c.requeued_at or 0)
        out.print(f"reconciler: re-published {plural(len(requeued), 'chapter')} "
                  f"({sum(c.requeues for c in requeued)} times); last at "
                  f"{when(last.requeued_at)}: {short(last.requeue_reason or '')}")
    if report.state == "paused":
        # What ends the pause depends on its code, never on the reason's text.
        if report.pause_code == PauseCode.budget.value:
            how = (f"raise the budget with: python -m producer enqueue {report.exam} "
                   "--budget-usd AMOUNT")
        else:
            how = f"resume with: python -m producer resume {report.exam}"
        out.print(f"[bold red]paused:[/] {report.pause_reason} — {how}")


def _batches_text(report: ExamReport, out: Console) -> None:
    """The exam's submissions to the provider's Batch API (batch mode)."""
    from rich.table import Table

    shown = report.batches[:STATUS_BATCH_ROWS]
    live = sum(1 for b in report.batches if b.live)
    table = Table(title=f"batches of {report.exam} ({report.mode} mode): "
                        f"{len(report.batches)}, {live} live")
    for col in ("batch", "submission", "state", "requests", "completed", "failed", "created",
                "expires", "note"):
        table.add_column(col)
    for b in shown:
        total, completed, failed = batch_counts(b)
        note = "cancel requested" if b.cancel_requested and b.live else (
            short(b.detail or "", 60))
        table.add_row(b.provider_batch_id or "-", b.id, batch_status(b), str(total),
                      str(completed), str(failed), when(b.created_at) or "-",
                      when(b.expires_at) or "-", note)
    out.print(table)
    if len(shown) < len(report.batches):
        out.print(f"({len(report.batches) - len(shown)} older batches not shown; python -m "
                  f"producer status {report.exam} --json lists every one)", markup=False)
    waiting = [c for c in report.chapter_list if c.waiting_on]
    if waiting:
        by_text: dict[str, int] = {}
        for c in waiting:
            by_text[c.waiting_on or ""] = by_text.get(c.waiting_on or "", 0) + 1
        for text, n in by_text.items():
            out.print(f"{plural(n, 'chapter')} {text}", markup=False, soft_wrap=True)


def print_review(slug: str, chapters: Sequence[ChapterReview],
                 out: Console | None = None) -> None:
    """`review`: the exam's chapters (storage.report_types.chapter_reviews) as a table and a
    summary line. (`--json` is GET /exams/SLUG/review's answer: producer.views.review_dict.)"""
    from rich.table import Table

    out = out or console()
    verdicts = any(c.disputed is not None for c in chapters)
    verified = any(c.unverified is not None for c in chapters)
    table = Table(title=f"review of {slug}")
    columns = ["chapter", "questions", "disputed", "unreviewed", "approved", "rejected",
               "stale"] + (["unverified"] if verified else [])
    for col in columns:
        table.add_column(col, justify="left" if col == "chapter" else "right")
    for c in chapters:
        table.add_row(c.chapter_id, f"{c.questions}/{c.target}",
                      "-" if c.disputed is None else str(c.disputed), str(c.unreviewed),
                      str(c.approved), str(c.rejected), str(c.stale),
                      *([str(c.unverified or 0)] if verified else []))
    out.print(table)
    left = sum(c.unreviewed + c.stale for c in chapters)
    stale = sum(c.stale for c in chapters)
    rejected = sum(c.rejected for c in chapters)
    unverified = sum(c.unverified or 0 for c in chapters)
    missing = sum(max(0, c.target - c.questions) for c in chapters)
    out.print(f"{plural(left, 'question')} to review"
              + (f" ({stale} stale: reviewed before --regenerate)" if stale else "")
              + (f"; {unverified} unverified (no blind-solve verdict yet)" if unverified
                 else "")
              + (f"; {rejected} rejected" if rejected else "")
              + (f"; {missing} missing (the next run or enqueue generates them)" if missing else "")
              + ("" if verdicts else "; no blind-solve verdicts in this database"))

