"""The examforge command line. User errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import signal
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import OperationalError

from examforge.errors import DatabaseUnavailable, ExamforgeError, UserError
from examforge.settings import Settings, load_settings
from examforge.syllabus import Syllabus, find_syllabus, load_syllabus

F = TypeVar("F", bound=Callable[..., Any])
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def _settings() -> Settings:
    return load_settings()  # a ConfigError names the bad variable in one line


def _store(settings: Settings):  # type: ignore[no-untyped-def]
    from storage import open_store

    return open_store(settings.database_url, pool_size=settings.db_pool_size)


def _syllabus(settings: Settings, slug: str) -> Syllabus:
    path = find_syllabus(settings.exams_dir, slug)
    return load_syllabus(path, max_questions=settings.max_questions_per_chapter)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """examforge: generate exam question banks with LLMs, exactly once.

    Settings come from the environment and .env (BROKER_URL, DATABASE_URL, LLM_BASE_URL,
    LLM_API_KEY, LLM_MODEL, LLM_TIMEOUT_S, QUESTIONS_PER_CALL, EXAMS_DIR, ...).
    """


@cli.command()
@click.argument("slug")
@click.option("--regenerate", "regenerate", multiple=True, metavar="CHAPTER",
              help="Delete a changed chapter's questions and generate it again (repeatable).")
def enqueue(slug: str, regenerate: tuple[str, ...]) -> None:
    """Record the exam and enqueue one task per chapter that is not done."""
    settings = _settings()
    syllabus = _syllabus(settings, slug)
    unknown = [c for c in regenerate if c not in {ch.id for ch in syllabus.chapters}]
    if unknown:
        raise UserError(f"--regenerate: chapter {unknown[0]!r} is not in the syllabus of {slug}")
    store = _store(settings)
    from tasks import app
    from tasks.broker import broker_epoch, check_broker, publish_chapters

    check_broker(app, settings)  # before writing anything
    plan = store.sync_exam(slug, syllabus, regenerate)
    if plan.to_enqueue:
        epoch = broker_epoch(app, settings)
        # Marked before publishing: a worker's pick-up always reads as after its enqueue.
        store.mark_enqueued(slug, plan.to_enqueue, epoch)
        publish_chapters(app, slug, plan.to_enqueue)
    for chapter_id in plan.to_enqueue:
        out.print(f"enqueued  {slug}/{chapter_id}")
    for chapter_id, why in plan.skipped.items():
        out.print(f"skipped   {slug}/{chapter_id}: {why}")
    out.print(f"{len(plan.to_enqueue)} enqueued, {len(plan.skipped)} skipped")
    if plan.exam_paused:
        raise UserError(f"exam {slug} is paused ({plan.exam_paused}); "
                        f"fix the cause, then run: python -m producer resume {slug}")


def _short(text: str, limit: int = 120) -> str:
    """One table cell: the whole error is in `status --json`."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _when(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


@cli.command()
@click.argument("slug")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def status(slug: str, as_json: bool) -> None:
    """Progress, usage and errors of an exam, from the database alone."""
    settings = _settings()
    report = _store(settings).status(slug)
    report["chapter_list"] = [
        {**c, "last_error_at": _when(c["last_error_at"])} for c in report["chapter_list"]  # type: ignore[attr-defined]
    ]
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    ch, q, u = report["chapters"], report["questions"], report["usage"]
    table = Table(title=f"{report['title']} ({slug}) — {report['state']}")
    for col in ("chapter", "state", "questions", "attempts", "calls", "last error"):
        table.add_column(col)
    for c in report["chapter_list"]:  # type: ignore[attr-defined]
        table.add_row(c["id"], c["state"], f"{c['questions']['done']}/{c['questions']['target']}",
                      str(c["attempts"]), str(c["calls"]),
                      _short(f"{c['last_error_at']} {c['last_error']}") if c["last_error"] else "")
    out.print(table)
    out.print(f"chapters: {ch['done']}/{ch['total']} done, {ch['running']} running, "  # type: ignore[index]
              f"{ch['pending']} pending, {ch['failed']} failed, {ch['cancelled']} cancelled")  # type: ignore[index]
    out.print(f"questions: {q['done']}/{q['target']}")  # type: ignore[index]
    out.print(f"calls: {u['calls']} (used {u['calls_used']}, wasted {u['calls_wasted']}, "  # type: ignore[index]
              f"failed {u['calls_failed']}, in flight {u['calls_in_flight']}); "  # type: ignore[index]
              f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion; "  # type: ignore[index]
              f"cost: ${report['cost_usd']:.4f}")
    by_endpoint: dict[str, dict[str, Any]] = report["usage_by_endpoint"]  # type: ignore[assignment]
    if "fallback" in by_endpoint:
        out.print("by endpoint: " + "; ".join(
            f"{name} {e['calls']} calls, ${e['cost_usd']:.4f}"
            for name, e in sorted(by_endpoint.items())))
    if report["state"] == "paused":
        out.print(f"[bold red]paused:[/] {report['pause_reason']} — "
                  f"resume with: python -m producer resume {slug}")


@cli.command()
@click.argument("slug")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "json", "csv"]), default="jsonl",
              show_default=True)
@click.option("-o", "--output", "target", default=None,
              help="Output path, or - for stdout. Default: EXAMS_DIR/SLUG/generated.FORMAT")
def export(slug: str, fmt: str, target: str | None) -> None:
    """Write every stored question of an exam (atomically)."""
    from producer.export import export as write

    settings = _settings()
    rows = _store(settings).questions(slug)
    target = target or str(settings.exams_dir / slug / f"generated.{fmt}")
    write(rows, fmt, target)
    if target != "-":
        err.print(f"wrote {len(rows)} questions to {target}")


@cli.command()
@click.argument("slug")
@click.option("-c", "--concurrency", default=8, show_default=True, type=click.IntRange(1, 512),
              help="Threads calling the model at once.")
def run(slug: str, concurrency: int) -> None:
    """Generate an exam in this process, with no broker (resumable)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from examforge.pipeline import Runtime
    from producer.local import run_local

    settings = _settings()
    syllabus = _syllabus(settings, slug)
    store = _store(settings)
    plan = store.sync_exam(slug, syllabus)
    if plan.exam_paused:
        raise UserError(f"exam {slug} is paused ({plan.exam_paused}); "
                        f"fix the cause, then run: python -m producer resume {slug}")
    rt = Runtime.build(settings, store)
    # SIGTERM stops like Ctrl-C: running calls finish and commit, nothing new is paid for.
    signal.signal(signal.SIGTERM, _interrupt)
    target = store.status(slug)["questions"]["target"]  # type: ignore[index]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=False) as progress:
        bar = progress.add_task(f"{slug} questions", total=target)

        last_tick = [0.0]

        def tick() -> None:
            if time.monotonic() - last_tick[0] >= 0.5:  # a count, twice a second at most
                last_tick[0] = time.monotonic()
                progress.update(bar, completed=store.questions_done(slug))

        tick()
        results = run_local(rt, slug, plan.to_enqueue, concurrency, on_progress=tick)
        last_tick[0] = 0.0
        tick()
    rt.client.close()
    failed = {c: r for c, r in results.items() if r.outcome == "failed"}
    for chapter_id, result in failed.items():
        err.print(f"failed {slug}/{chapter_id}: {result.detail}")
    report = store.status(slug)
    out.print(f"{report['questions']['done']}/{report['questions']['target']} questions; "  # type: ignore[index]
              f"{report['chapters']['done']}/{report['chapters']['total']} chapters done")  # type: ignore[index]
    if failed:
        sys.exit(1)


@cli.command()
def reconcile() -> None:
    """One reconcile pass: re-enqueue orphaned chapters, fail those past their attempt cap."""
    from tasks import app
    from tasks.broker import check_broker
    from tasks.reconcile import reconcile_once

    settings = _settings()
    store = _store(settings)
    check_broker(app, settings)
    result = reconcile_once(settings, store, app)
    out.print(f"re-enqueued {result['requeued']}, failed at attempt cap {result['failed_at_cap']}")


@cli.command()
@click.argument("slug")
def resume(slug: str) -> None:
    """Un-pause an exam (after fixing the API key) and re-enqueue its failed chapters."""
    from tasks import app
    from tasks.broker import broker_epoch, check_broker, publish_chapters

    settings = _settings()
    store = _store(settings)
    check_broker(app, settings)
    chapters = store.resume(slug)
    if chapters:
        store.mark_enqueued(slug, chapters, broker_epoch(app, settings))
        publish_chapters(app, slug, chapters)
    out.print(f"resumed {slug}: {len(chapters)} chapters enqueued")


@cli.command()
@click.argument("slug")
@click.option("--chapter", "chapters", multiple=True, help="Only these chapters (repeatable).")
def cancel(slug: str, chapters: tuple[str, ...]) -> None:
    """Cancel an exam's unfinished chapters; stored questions are kept."""
    settings = _settings()
    n = _store(settings).cancel(slug, list(chapters) or None)
    out.print(f"cancelled {n} chapters of {slug}")


@cli.command()
def migrate() -> None:
    """Create or upgrade the database schema (every command also does this on start)."""
    _store(_settings())
    out.print("schema is up to date")


@cli.command("mock-llm", add_help_option=False,  # --help is the mock's own, listing every option
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def mock_llm(ctx: click.Context) -> None:
    """Run the OpenAI-compatible mock server (see python -m mockllm --help)."""
    from mockllm import main as mock_main

    sys.exit(mock_main(list(ctx.args)))


def main(argv: list[str] | None = None) -> int:
    from examforge.logs import setup_logging

    setup_logging("WARNING")
    try:
        cli.main(args=argv, prog_name="python -m producer", standalone_mode=False)
    except click.exceptions.Abort:
        err.print("interrupted: every committed batch is kept; run the same command to resume")
        return 130
    except click.ClickException as exc:
        # One line, like every other user error (click's default adds a usage block).
        err.print(f"error: {exc.format_message()}", markup=False, soft_wrap=True)
        return exc.exit_code
    except ExamforgeError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return getattr(exc, "exit_code", 1)
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        err.print(f"error: {DatabaseUnavailable(f'database error: {reason}')}", markup=False,
                  soft_wrap=True)
        return 3
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0
