"""The examforge command line: its commands, their options and help, and `main`.

This module only declares: each command's body is the function of the same name in
producer/commands.py, imported by `_dispatch` when a command runs. So `--help`, `--version`
and a mistyped option answer without loading SQLAlchemy, Celery, httpx, rich or the settings
(0.5 s of imports against 0.04 s; tests/unit/test_startup.py keeps it so). The commands that
only read (exams, status, review, export) try the plain-driver path of a SQLite file first
(producer/read_sqlite.py, producer/export_sqlite.py), and call producer/commands.py when it
steps aside. User errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar, cast

import click

from examforge.errors import ExamforgeError
from producer.prune import DurationType

if TYPE_CHECKING:
    from producer.prune import Duration

F = TypeVar("F", bound=Callable[..., Any])


def _dispatch(declared: F) -> F:
    """The command `declared` (its parameters and docstring, the help) runs the function of
    the same name in producer.commands, with the same arguments."""

    @functools.wraps(declared)
    def run(*args: Any, **params: Any) -> Any:
        from producer import commands  # the one import of the implementations

        return commands.invoke(declared.__name__, *args, **params)

    return cast(F, run)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="examforge", prog_name="examforge")  # the installed version
def cli() -> None:
    """examforge: generate exam question banks with LLMs, exactly once.

    Settings come from the environment and .env (BROKER_URL, DATABASE_URL, LLM_BASE_URL,
    LLM_API_KEY, LLM_MODEL, LLM_TIMEOUT_S, QUESTIONS_PER_CALL, EXAMS_DIR, ...).
    """


class BudgetType(click.ParamType):
    """An amount of dollars above 0. Not click.FloatRange: it lets `nan` and `inf` through
    (no comparison refuses nan; inf is in range), stored as "no budget" and printed by
    `status --json` as Infinity, which is not JSON; and its refusal reads "is not a valid
    float range". The API refuses both too (422)."""

    name = "usd"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            amount = float(value if isinstance(value, float) else str(value).strip())
        except ValueError:
            amount = math.nan
        if not math.isfinite(amount) or amount <= 0:
            self.fail(f"{value!r} is not an amount of dollars: give a number above 0, such as "
                      "5 or 0.50", param, ctx)
        return amount


_budget_option = click.option(
    "--budget-usd", type=BudgetType(), default=None,
    help="The exam's budget in USD, never exceeded; a raised one resumes an exam it paused "
         "(default for a new exam: BUDGET_USD).")
_dry_run_option = click.option(
    "--dry-run", is_flag=True,
    help="Print the calls, tokens and cost it would take; send and write nothing.")


_EXPORT_FORMATS = ("jsonl", "json", "csv", "moodle-xml", "gift", "anki", "qti")


_verify_option = click.option(
    "--verify", type=click.Choice(("off", "flag", "replace")), default=None,
    help="The exam's blind-solve policy, recorded on the exam and followed by every worker: "
         "off, flag (disputed keys marked) or replace (disputed questions replaced); flag "
         "or replace also solves the questions stored unverified. Default: the exam's own; "
         "for a new exam, VERIFY, else off.")
_batch_option = click.option(
    "--batch/--no-batch", "batch", default=None,
    help="Generate through the provider's Batch API (about half the price, results within "
         "24 h); default: LLM_BATCH.")


@cli.command()
@click.argument("slug")
@click.option("--regenerate", "regenerate", multiple=True, metavar="CHAPTER",
              help="Cut a changed chapter again (repeatable): its approved and edited "
                   "questions are kept and marked stale for review, the rest generated again.")
@click.option("--discard-reviewed", is_flag=True,
              help="With --regenerate: delete the approved, edited and rejected questions too.")
@_budget_option
@_dry_run_option
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: one JSON object.")
@_batch_option
@_verify_option
@_dispatch
def enqueue(slug: str, regenerate: tuple[str, ...], discard_reviewed: bool,
            budget_usd: float | None, dry_run: bool, as_json: bool, batch: bool | None,
            verify: str | None) -> None:
    """Record the exam, cut its chapters into slices, enqueue one task per unfinished slice
    (with --batch: one batch pass, which submits them to the provider's Batch API)."""


@cli.command()
@click.argument("slug")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--watch", is_flag=True,
              help="A live view until no chapter is pending or running; exit 0, or 1 if some "
                   "failed. Off a terminal: one plain line per refresh.")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=2.0,
              show_default=True, help="Seconds between two refreshes of --watch.")
def status(slug: str, as_json: bool, watch: bool, interval_s: float) -> None:
    """Progress, usage and errors of an exam, from the database alone."""
    # A SQLite file takes the plain-driver path first (producer/read_sqlite.py: no
    # SQLAlchemy to import); --watch, anything else and every error go the store's way.
    from producer import read_sqlite

    if not read_sqlite.status(slug, as_json, watch):
        from producer import commands

        commands.invoke("status", slug, as_json, watch, interval_s)


@cli.command()
@click.option("--json", "as_json", is_flag=True,
              help='JSON on stdout: {"items": [...], "next": CURSOR or null}.')
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="Exams on the page.")
@click.option("--after", metavar="CURSOR",
              help="The page after this cursor: the `next` of the page before.")
@click.option("--all", "every", is_flag=True, help="Every exam on one page (no limit).")
def exams(as_json: bool, limit: int, after: str | None, every: bool) -> None:
    """The exams in the database, newest first, a page at a time: state, chapters,
    questions, cost, last change."""
    # One page of a SQLite file takes the plain-driver path first (producer/read_sqlite.py:
    # no SQLAlchemy to import); anything else, and every error, goes the store's way.
    from producer import read_sqlite

    if not read_sqlite.exams(as_json, limit, after, every):
        from producer import commands

        commands.invoke("exams", as_json, limit, after, every)


@cli.command()
@click.argument("slug")
@click.option("--format", "fmt", type=click.Choice(_EXPORT_FORMATS), default="jsonl",
              show_default=True,
              help="jsonl, json, csv; or a question bank: moodle-xml (Moodle XML), gift "
                   "(Moodle GIFT), anki (.apkg), qti (QTI 1.2 zip for Canvas).")
@click.option("-o", "--output", "target", default=None,
              help="Output path, or - for stdout (not for anki and qti). Default: "
                   "EXAMS_DIR/SLUG/generated.jsonl, .json, .csv, .xml, .gift.txt, .apkg, "
                   ".qti.zip")
@click.option("--approved-only", is_flag=True,
              help="Only the questions a reviewer approved (see `review`); exit 1, writing "
                   "nothing, when none is.")
@click.option("--bom", is_flag=True,
              help="With --format csv: start the file with a UTF-8 byte-order mark, which "
                   "spreadsheet programs (Excel) need to read Persian, Arabic or Russian "
                   "text right.")
def export(slug: str, fmt: str, target: str | None, approved_only: bool, bom: bool) -> None:
    """Write every stored question of an exam (atomically); a rejected one never."""
    # JSON Lines, JSON and CSV from a SQLite file take the plain-driver path first
    # (producer/export_sqlite.py: no SQLAlchemy to import, no row objects); anything else,
    # and every error, goes the store's way in producer/commands.py.
    from producer import export_sqlite

    if not export_sqlite.command(slug, fmt, target, approved_only, bom):
        from producer import commands

        commands.invoke("export", slug, fmt, target, approved_only, bom)


@cli.command()
@click.argument("slug")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def review(slug: str, as_json: bool) -> None:
    """The review of an exam per chapter: questions unreviewed, approved, rejected, stale
    (reviewed before --regenerate), disputed by the blind solve and, in a verified exam,
    unverified. Reviewers approve, reject and edit in the page (serve)."""
    # As status: a SQLite file takes producer/read_sqlite.py's path first.
    from producer import read_sqlite

    if not read_sqlite.review(slug, as_json):
        from producer import commands

        commands.invoke("review", slug, as_json)


@cli.command()
@click.argument("slug")
@click.option("-c", "--concurrency", default=8, show_default=True, type=click.IntRange(1, 512),
              help="Threads calling the model at once.")
@_budget_option
@_dry_run_option
@_batch_option
@_verify_option
@_dispatch
def run(slug: str, concurrency: int, budget_usd: float | None, dry_run: bool,
        batch: bool | None, verify: str | None) -> None:
    """Generate an exam in this process, with no broker (resumable)."""


@cli.command()
@_dispatch
def reconcile() -> None:
    """One reconcile pass: re-enqueue orphaned chapters, fail those past their attempt cap."""


@cli.command()
@click.argument("slug")
@_dispatch
def resume(slug: str) -> None:
    """Un-pause an exam (after fixing the API key) and re-enqueue its failed chapters."""


@cli.command()
@click.argument("slug")
@click.option("--chapter", "chapters", multiple=True,
              help="Only these chapters (repeatable); default: every failed one.")
@_dispatch
def retry(slug: str, chapters: tuple[str, ...]) -> None:
    """Re-enqueue failed chapters with fresh attempt budgets, leaving a pause as it is (a
    paused exam's chapters run once it is resumed; `resume` does both)."""


@cli.command()
@click.argument("slug")
@click.option("--chapter", "chapters", multiple=True, help="Only these chapters (repeatable).")
@_dispatch
def cancel(slug: str, chapters: tuple[str, ...]) -> None:
    """Cancel an exam's unfinished chapters; stored questions are kept. No new call starts;
    a call in flight, paid for either way, has its reply stored when it comes."""


@cli.command()
@_dispatch
def doctor() -> None:
    """Check the database (SQLite: PRAGMA quick_check), the broker's eviction policy and
    persistence, and the model endpoint; exit 1 if anything would lose or stall work, 4 if
    the database is damaged."""


@cli.command()
@_dispatch
def migrate() -> None:
    """Create or upgrade the database schema (the commands that write, the workers and
    serve also do this on start; the commands that only read never do)."""


@cli.command()
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@_dispatch
def backup(path: Path) -> None:
    """Copy a live SQLite database to PATH, consistent while workers write (SQLite's online
    backup API), checked with quick_check, written atomically. PostgreSQL: use pg_dump."""


@cli.command("import")
@click.argument("slug")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_dispatch
def import_(slug: str, file: Path) -> None:
    """Store questions already paid for as the exam's own, so enqueue pays only for the rest.

    FILE is JSON Lines, one question a line: chapter_id, question, choices (4), answer_index
    and explanation, as the naive script's checkpoint file has them; export's JSONL works
    too, items of every type with it (a `type` and its answer fields). Every line is validated as model output is: one bad line, or a chapter the exam
    does not have, refuses the whole file and nothing is stored. Questions are numbered after
    those stored, up to each chapter's target; text the chapter already has is skipped, so a
    second import stores nothing. The exam must be in the database or its syllabus in
    EXAMS_DIR. Refused while a worker is generating a chapter of the file.
    """


@cli.command()
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              type=DurationType(),
              help="Only exams whose last change is at least this old: 30m, 12h, 7d, 0s.")
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
@click.option("--exam", "slug", default=None, metavar="SLUG",
              help="Only this exam; refused while it has pending or running chapters.")
@_dispatch
def prune(older_than: Duration, dry_run: bool, slug: str | None) -> None:
    """Delete finished exams with all they own (chapters, questions, ledger rows).

    An exam goes when each of its chapters is done, failed or cancelled and its last change
    is older than --older-than, in one transaction per exam, with its API runs. The API's
    Idempotency-Keys older than API_IDEMPOTENCY_TTL_S are forgotten too. An exam with a pending or
    running chapter is never touched (cancel it first). Export what you want to keep first.
    """


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--local", is_flag=True,
              help="Do the work in this process, as `run` does (no broker); default: enqueue "
                   "to Celery, as `enqueue` does.")
@click.option("--no-auth", "no_auth", is_flag=True,
              help="Accept requests without a token; only on a loopback address.")
@_dispatch
def serve(host: str, port: int, local: bool, no_auth: bool) -> None:
    """The HTTP API and its page (FastAPI under uvicorn). Bearer tokens: the named ones of
    `token add`, and API_TOKENS (admin)."""


_ROLES = ("reader", "reviewer", "operator", "admin")


@cli.group()
def token() -> None:
    """Named bearer tokens of the API (serve), each with a role and, optionally, the exams
    it may see. Roles, each including the one before: reader (reads exams, questions, runs,
    exports, metrics), reviewer (+ approves, rejects, edits), operator (+ syllabi, sources,
    runs, budgets), admin (+ the audit, on every exam)."""


@token.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(_ROLES), required=True, help="What the token may do.")
@click.option("--exam", "exams", multiple=True, metavar="SLUG",
              help="Only this exam (repeatable); any other is 404 to the token. Default: every "
                   "exam.")
@_dispatch
def token_add(name: str, role: str, exams: tuple[str, ...]) -> None:
    """Create a token named NAME (the history and the audit show it) and print it once,
    alone on the last line of stdout: only its hash is stored."""


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--revoked", is_flag=True, help="The revoked tokens too.")
@_dispatch
def token_list(as_json: bool, revoked: bool) -> None:
    """The named tokens: name, role, exams, created, last used (to within a minute). Never
    a token itself."""


@token.command("revoke")
@click.argument("name")
@_dispatch
def token_revoke(name: str) -> None:
    """End the live token NAME: refused from the next request on, by every serve."""


@cli.command()
@click.option("--exam", "slug", default=None, metavar="SLUG", help="Only this exam's rows.")
@click.option("--since", default=None, metavar="WHEN",
              help="Only rows since then: an ISO 8601 time (2026-12-01T09:00Z) or a duration "
                   "ago (30m, 12h, 7d).")
@click.option("--json", "as_json", is_flag=True,
              help='JSON on stdout: {"items": [...], "next": CURSOR or null}.')
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="Rows on the page.")
@click.option("--after", metavar="CURSOR",
              help="The page after this cursor: the `next` of the page before.")
@_dispatch
def audit(slug: str | None, since: str | None, as_json: bool, limit: int,
          after: str | None) -> None:
    """Who started, cancelled, resumed or retried work, set a budget, put a syllabus or
    source, or added or revoked a token: newest first, a page at a time. The command line
    acts as cli:<user>; the API as the token's name."""


@cli.command("mock-llm", add_help_option=False,  # --help is the mock's own, listing every option
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def mock_llm(ctx: click.Context) -> None:
    """Run the OpenAI-compatible mock server (see python -m mockllm --help)."""
    import mockllm.cli

    sys.exit(mockllm.cli.main(list(ctx.args)))


def main(argv: list[str] | None = None) -> int:
    """Errors are one line on stderr (the commands' own are raised as ExamforgeError)."""
    if not (sys.argv[1:] if argv is None else argv):
        # No command: the help, exit 0 (click 8.2 raises it as a usage error, exit 2).
        ctx = cli.context_class(cli, info_name="python -m producer", **cli.context_settings)
        click.echo(cli.get_help(ctx))
        return 0
    try:
        cli.main(args=argv, prog_name="python -m producer", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted: every committed batch is kept; run the same command to resume",
                   err=True)
        return 130
    except click.ClickException as exc:
        # One line, like every other user error (click's default adds a usage block).
        click.echo(f"error: {exc.format_message()}", err=True)
        return exc.exit_code
    except ExamforgeError as exc:
        click.echo(f"error: {exc}", err=True)
        return getattr(exc, "exit_code", 1)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0
