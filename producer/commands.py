"""The bodies of the commands producer/cli.py declares, one function each, with the name and
the parameters of its command (cli.py's docstrings are the help).

`producer.cli._dispatch` imports this module when a command runs, and calls `invoke`; so what
every command needs (the settings, the store, SQLAlchemy, rich) is imported here, once. What
only one command needs, and costs more than the command's own work on a small database, is
imported in that command: Celery for the ones that publish (reconcile, resume, retry), the
pipeline for `run`, FastAPI for `serve`, the exporters, the importer and doctor's checks.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import click
from rich.markup import escape
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from examforge.errors import (
    DatabaseCorrupt,
    NoSchema,
    UnknownChapter,
    UserError,
)
from examforge.logs import setup_logging
from examforge.settings import Settings, load_settings
from producer.live import LiveView
from producer.live import watch as live_watch
from producer.prune import report_lines as prune_report_lines
from producer.printing import console as _console
from producer.printing import print_exams, print_review, print_status, short
from producer.syllabi import file_syllabus, resolve
from producer.views import review_dict, summary_dict, when
from producer.words import plural
from storage import Store, connect, open_existing_store, open_store
from storage.db import (
    SCHEMA_REVISION,
    backup_sqlite,
    current_revision,
    database_error,
    shown_url,
)
from storage.models import ExamMode
from storage.report_types import ExamReport

if TYPE_CHECKING:
    from examforge.syllabus import Syllabus
    from producer.prune import Duration


def invoke(command: str, *args: Any, **params: Any) -> None:
    """Run `command`'s function with the arguments click parsed. A database that cannot be
    reached, or does not exist, is raised as the one-line error it is (exit 2 or 3)."""
    setup_logging("WARNING")
    try:
        globals()[command](*args, **params)
    except OperationalError as exc:
        raise database_error(exc) from None


err = _console(stderr=True)
out = _console()


def _settings() -> Settings:
    return load_settings()  # a ConfigError names the bad variable in one line


def _store(settings: Settings, background_checkpoint: bool = False) -> Store:
    return open_store(settings.database_url, pool_size=settings.db_pool_size,
                      background_checkpoint=background_checkpoint)


def _read_store(settings: Settings) -> Store:
    """For the commands that only read: never creates or upgrades a schema (exit 2 if the
    database has none, or an older one)."""
    return open_existing_store(settings.database_url, pool_size=settings.db_pool_size)


def _syllabus(settings: Settings, slug: str) -> Syllabus:
    """The exam's file in EXAMS_DIR, else the syllabus PUT /exams/SLUG stored in the
    database (producer/syllabi.py); the database is opened only when there is no file, and
    only if it already exists (a typo must not create one)."""
    return resolve(settings, slug, open_store=lambda: _existing_store(settings))


def _existing_store(settings: Settings) -> Store | None:
    """The database, if it has the schema; never creates or migrates it (dry runs read
    through here too)."""
    try:
        return _read_store(settings)
    except NoSchema:
        return None


def _warn(line: str) -> None:
    """A warning on stderr, as written (no rich markup: it may quote a file name)."""
    err.print(line, markup=False, highlight=False)


def _warn_unpriced(settings: Settings) -> None:
    """A $0 bill must never be a surprise: say so on every command that starts work."""
    for model in settings.unpriced_models():
        err.print(f"warning: no price is known for model {model!r}: its calls are booked at "
                  "$0 (set LLM_PRICE_PROMPT_PER_MTOK and LLM_PRICE_COMPLETION_PER_MTOK)",
                  markup=False, soft_wrap=True)


def _warn_verify_batch(policy: str, batch: bool) -> None:
    """Batch mode sends no blind solve: say so when the exam's policy asks for one."""
    if batch and policy != "off":
        err.print(f"warning: the exam's blind-solve policy ({policy}) does not apply in batch "
                  "mode: the questions a provider batch generates are stored unverified "
                  "(a later enqueue --verify in sync mode solves them)",
                  markup=False, soft_wrap=True)


def _dry_run(settings: Settings, slug: str, syllabus: Syllabus, budget_usd: float | None,
             as_json: bool = False, batch: bool = False, regenerate: Sequence[str] = (),
             discard_reviewed: bool = False, verify: str | None = None) -> None:
    stored, per_question, budget, cancelled = _read_only_state(settings, slug)
    # The policy the run would follow: the one given, else the exam's, else (a new exam)
    # this process's VERIFY; and the solves it owes for questions already stored.
    recorded, pending, unverified = _read_only_owed(settings, slug)
    verify = verify or syllabus.verify
    policy = verify or recorded or settings.verify
    owed: dict[str, int] = {}
    if policy != "off":
        owed = dict(pending)
        if verify is not None:
            for chapter_id, n in unverified.items():
                owed[chapter_id] = owed.get(chapter_id, 0) + n
    _warn_verify_batch(policy, batch)
    from examforge.estimate import estimate
    from producer.grounding import exam_material

    # The sources are read (and refused) as enqueue reads them; each prompt carries its
    # slice's share, counted in the estimate.
    material = {}
    read: Any = {}
    if any(ch.sources for ch in syllabus.chapters):
        store = None if file_syllabus(settings, slug) else _existing_store(settings)
        read = exam_material(settings, slug, syllabus, store, _warn)
        material = {cid: m.passages for cid, m in read.items()}
    regenerated = _regeneration_preview(settings, slug, syllabus, regenerate,
                                        discard_reviewed, read)
    for chapter_id, regeneration in regenerated.items():
        # What the chapter still has once regenerated: the questions it keeps in the bank.
        stored[chapter_id] = regeneration.kept_texts
    est = estimate(slug, syllabus, settings, stored=stored,
                   completion_per_question=per_question, batch=batch, material=material,
                   verify=policy, owed=owed)
    budget = budget_usd if budget_usd is not None else budget
    if as_json:
        click.echo(json.dumps({**est.as_dict(), "budget_usd": budget,
                               "mode": "batch" if batch else "sync",
                               "regenerate": [r.as_dict() for r in regenerated.values()]}))
        return
    p = est.price
    already = sum(c.stored for c in est.chapters)
    out.print(f"dry run of {slug}{' in batch mode' if batch else ''}: nothing was sent or "
              "written", soft_wrap=True)
    for regeneration in regenerated.values():
        click.echo("\n".join(regeneration.lines(slug)))
    out.print(f"  questions to generate: {est.questions} in "
              f"{sum(1 for c in est.chapters if c.calls)} of {len(est.chapters)} chapters "
              f"({already} already stored)", soft_wrap=True)
    out.print(f"  calls: {est.calls} (up to {settings.questions_per_call} questions each)")
    out.print(f"  prompt tokens: {est.prompt_tokens:,} (counted with {est.tokenizer} for "
              f"{est.model})", soft_wrap=True)
    out.print(f"  completion tokens: up to {est.max_completion_tokens:,} (max_tokens: "
              f"{settings.llm_max_tokens_per_question} per question), expected "
              f"{est.expected_completion_tokens:,} ({est.completion_per_question:.0f} per "
              f"question, {est.completion_source})", soft_wrap=True)
    out.print(f"  price: ${p.prompt_per_mtok:g} / ${p.completion_per_mtok:g} per million "
              f"prompt / completion tokens, ${p.cached_per_mtok:g} cached prompt ({p.source})",
              soft_wrap=True)
    if est.verify is not None:
        v = est.verify
        out.print(f"  blind solves (policy {v.mode}): {plural(v.calls, 'call')} of {v.model}"
                  + (f" ({v.owed} stored questions owed a solve among them)" if v.owed
                     else "") + ", "
                  f"{v.prompt_tokens:,} prompt tokens, up to {v.max_completion_tokens:,} "
                  f"completion tokens: worst case ${v.worst_usd:.4f}, expected "
                  f"${v.expected_usd:.4f} (included below"
                  + ("; replacements of disputed questions are not" if v.mode == "replace"
                     else "") + ")", soft_wrap=True)
    for t in est.types.values():  # a chapter asks for item types other than mcq
        priced = t.as_dict(p, est.worst_price or p)
        out.print(f"  {t.type}: {t.questions} questions, {round(t.prompt_tokens):,} prompt "
                  f"tokens (its share of each call's), up to "
                  f"{round(t.max_completion_tokens):,} completion tokens, expected "
                  f"{round(t.expected_completion_tokens):,}: worst case "
                  f"${priced['worst_usd']:.4f}, expected ${priced['expected_usd']:.4f}",
                  soft_wrap=True)
    out.print(f"  cost: worst case ${est.worst_usd:.4f}, expected ${est.expected_usd:.4f}")
    if cancelled:
        out.print(f"  cancelled chapters: {len(cancelled)} ({', '.join(cancelled)}), restarted "
                  "by this command (it undoes `cancel`); counted above", soft_wrap=True,
                  markup=False)
    if budget is not None:
        verdict = ("fits even at worst case" if est.worst_usd <= budget else
                   "the expected cost fits, the worst case does not" if
                   est.expected_usd <= budget else "does not fit: the exam will pause")
        out.print(f"  budget: ${budget:.4f}: {verdict}", soft_wrap=True)
    _warn_unpriced(settings)


def _read_only_owed(settings: Settings, slug: str
                    ) -> tuple[str | None, dict[str, int], dict[str, int]]:
    """The exam's recorded blind-solve policy and its questions pending a solve and stored
    unverified, by chapter (Store.verification_owed), without creating or migrating the
    database: (None, {}, {}) when it has no such exam."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).exists():
        return None, {}, {}
    engine = connect(settings.database_url, pool_size=1)
    try:
        if current_revision(engine) != SCHEMA_REVISION:
            return None, {}, {}
        return Store(engine).verification_owed(slug)
    finally:
        engine.dispose()


def _regeneration_preview(settings: Settings, slug: str, syllabus: Syllabus,
                          regenerate: Sequence[str], discard_reviewed: bool,
                          material: Any) -> dict[str, Any]:
    """What `--regenerate` would keep, delete and generate per chapter, read without
    creating or migrating the database (empty when it holds no such exam)."""
    if not regenerate:
        return {}
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).exists():
        return {}
    engine = connect(settings.database_url, pool_size=1)
    try:
        if current_revision(engine) != SCHEMA_REVISION:
            return {}
        store = Store(engine)
        if not store.exam_exists(slug):
            return {}
        return store.regeneration_preview(slug, syllabus, regenerate,
                                          discard_reviewed=discard_reviewed,
                                          material=material or None)
    finally:
        engine.dispose()


def _read_only_state(settings: Settings, slug: str) -> tuple[
        dict[str, list[str]], float | None, float | None, list[str]]:
    """What the database already holds for a dry run, without creating or migrating it:
    stored texts, completion tokens per question, budget, cancelled chapters."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).exists():
        return {}, None, None, []
    engine = connect(settings.database_url, pool_size=1)
    try:
        if current_revision(engine) != SCHEMA_REVISION:
            return {}, None, None, []
        store = Store(engine)
        budget, cancelled = None, []
        if store.exam_exists(slug):
            report = store.status(slug)
            budget = report.budget_usd
            cancelled = [c.id for c in report.chapter_list if c.state == "cancelled"]
        return store.stored_texts(slug), store.completion_tokens_per_question(), budget, \
            cancelled
    finally:
        engine.dispose()


def enqueue(slug: str, regenerate: tuple[str, ...], discard_reviewed: bool,
            budget_usd: float | None, dry_run: bool, as_json: bool, batch: bool | None,
            verify: str | None = None) -> None:
    settings = _settings()
    syllabus = _syllabus(settings, slug)
    unknown = [c for c in regenerate if c not in {ch.id for ch in syllabus.chapters}]
    if unknown:
        raise UserError(f"--regenerate: chapter {unknown[0]!r} is not in the syllabus of {slug}")
    if discard_reviewed and not regenerate:
        raise UserError("--discard-reviewed applies to --regenerate CHAPTER only")
    batch = settings.llm_batch if batch is None else batch
    if dry_run:
        _dry_run(settings, slug, syllabus, budget_usd, as_json, batch=batch,
                 regenerate=regenerate, discard_reviewed=discard_reviewed, verify=verify)
        return
    store = _store(settings)
    restarted: list[str] = []

    def before_write() -> None:  # once the broker answered, before the exam is synced
        _warn_unpriced(settings)
        # As a dry run: the policy given, else the exam's, else (a new exam) VERIFY.
        _warn_verify_batch(verify or syllabus.verify or store.verification_owed(slug)[0]
                           or settings.verify, bool(batch))
        # As the API's new run: start means "generate what is missing", so enqueue undoes
        # `cancel` (resume and retry leave cancelled chapters alone).
        restarted.extend(store.restart_cancelled(slug))

    from producer.enqueueing import enqueue_exam

    with _audited(store, "run.start", slug, {"command": "enqueue", "budget_usd": budget_usd,
                                             "batch": batch, "verify": verify,
                                             "regenerate": list(regenerate) or None}):
        plan = enqueue_exam(settings, store, slug, syllabus, regenerate=regenerate,
                            budget_usd=budget_usd, before_write=before_write, batch=batch,
                            verify=verify, discard_reviewed=discard_reviewed, warn=_warn)
    _audit_budget(store, slug, budget_usd)
    for regeneration in plan.regenerated.values():
        click.echo("\n".join(regeneration.lines(slug)))
    for chapter_id in restarted:
        out.print(f"restarted {slug}/{chapter_id} (was cancelled)")
    per_chapter: dict[str, int] = {}
    for chapter_id, _ in plan.slices:
        per_chapter[chapter_id] = per_chapter.get(chapter_id, 0) + 1
    # One write of plain lines (ids and reasons need no markup): rich's print of each line
    # took 5 s of a 20,000-chapter enqueue.
    # In batch mode no chapter task is published: the chapters wait for the next batch pass.
    verb = "to batch" if batch else "enqueued"
    lines = [f"{verb:<9} {slug}/{chapter_id}"
             + (f" ({per_chapter[chapter_id]} slices)" if per_chapter[chapter_id] > 1 else "")
             for chapter_id in plan.to_enqueue]
    lines += [f"skipped   {slug}/{chapter_id}: {why}" for chapter_id, why in plan.skipped.items()]
    lines.append(_policy_line(plan))
    lines.append(f"{len(plan.to_enqueue)} {verb}, {len(plan.skipped)} skipped")
    if batch and plan.slices:
        # BATCH_POLL_S is beat's setting, read where beat runs: its value is not quoted
        # from this shell, which may hold another (a message never quotes a value another
        # process may hold differently).
        lines.append("batch mode: one batch pass was published; beat sends the next every "
                     "BATCH_POLL_S as beat's environment sets it, so run beat (celery -A "
                     "tasks beat) beside the workers; status shows the batches")
    click.echo("\n".join(lines))
    if plan.exam_paused:
        raise UserError(f"exam {slug} is paused ({plan.exam_paused}); "
                        f"fix the cause, then run: python -m producer resume {slug}")


def _policy_line(plan: Any) -> str:
    """The exam's blind-solve policy as enqueue and run recorded it, and the stored
    questions it made owed a solve."""
    line = f"blind solves: {plan.verify} (the exam's policy; every worker follows it)"
    if plan.to_solve:
        line += f"; {plural(plan.to_solve, 'stored question')} to solve once each"
    return line


def status(slug: str, as_json: bool, watch: bool, interval_s: float) -> None:
    settings = _settings()
    store = _read_store(settings)
    if watch:
        if as_json:
            raise UserError("--watch and --json: choose one")
        report = live_watch(lambda: store.status(slug), out, interval_s)
        from producer import exits

        if exits.of_report(report) != exits.DONE:
            sys.exit(exits.of_report(report))
        return
    # Without --watch, a SQLite file takes producer/read_sqlite.py's way first
    # (producer/cli.py); the printing is the same function.
    print_status(store.status(slug), as_json, out)


def exams(as_json: bool, limit: int, after: str | None, every: bool) -> None:
    # A SQLite file's single page goes producer/read_sqlite.py's way first (producer/cli.py);
    # the printing is the same function.
    page = _read_store(_settings()).exam_page(limit=None if every else limit, after=after)
    print_exams([summary_dict(e) for e in page.items], page.next, after, limit, as_json, out)


def export(slug: str, fmt: str, target: str | None, approved_only: bool = False,
           bom: bool = False) -> None:
    from examforge.banks import BankChapter, BankExam
    from examforge.errors import NothingApproved
    from producer.export import BOM_ONLY_CSV, check_target, default_name, nothing_approved
    from producer.export import export as write

    if bom and fmt != "csv":
        raise UserError(BOM_ONLY_CSV)
    if target is not None:
        check_target(fmt, target)
    settings = _settings()
    store = _read_store(settings)
    if not store.exam_exists(slug):
        store.questions(slug)  # raises UnknownExam with the usual message
    if approved_only and not store.approved_in_bank(slug):
        raise NothingApproved(nothing_approved(slug))
    target = target or str(settings.exams_dir / slug / default_name(fmt))

    def outline() -> BankExam:
        title, chapters = store.outline(slug)
        return BankExam(slug, title, tuple(BankChapter(*chapter) for chapter in chapters))

    n = write(store.iter_questions(slug, approved_only=approved_only), fmt, target, outline,
              bom=bom)
    if target != "-":
        err.print(f"wrote {plural(n, 'question')} to {target}")


def review(slug: str, as_json: bool) -> None:
    store = _read_store(_settings())
    if as_json:  # GET /exams/SLUG/review's answer, each review filter's count included
        click.echo(json.dumps(review_dict(store, slug), ensure_ascii=False))
        return
    # A SQLite file takes producer/read_sqlite.py's way first (producer/cli.py); the
    # printing is the same function.
    print_review(slug, store.review_summary(slug), out)


def run(slug: str, concurrency: int, budget_usd: float | None, dry_run: bool,
        batch: bool | None, verify: str | None = None) -> None:
    from runner.local import run_local
    from runner.pipeline import Runtime

    settings = _settings()
    syllabus = _syllabus(settings, slug)
    batch = settings.llm_batch if batch is None else batch
    if dry_run:
        _dry_run(settings, slug, syllabus, budget_usd, batch=batch, verify=verify)
        return
    store = _store(settings, background_checkpoint=True)  # it runs paid calls, as a worker
    with _audited(store, "run.start", slug, {"command": "run", "budget_usd": budget_usd,
                                             "batch": batch, "verify": verify}):
        plan = _start_local(settings, store, slug, syllabus, budget_usd, batch, verify)
    _audit_budget(store, slug, budget_usd)
    err.print(_policy_line(plan))
    if plan.exam_paused:
        raise UserError(f"exam {slug} is paused ({plan.exam_paused}); "
                        f"fix the cause, then run: python -m producer resume {slug}")
    store.set_exam_mode(slug, ExamMode.batch if batch else ExamMode.sync)
    if batch:
        _run_batch(settings, store, slug)
        return
    rt = Runtime.build(settings, store)
    interrupted = _stop_on_signals(rt)
    # The same view as `status --watch`, on stderr (stdout gets the summary).
    with LiveView(err, interval_s=5.0) as view:
        def tick() -> None:
            if view.due():
                view.show(store.status(slug))

        view.show(store.status(slug))
        try:
            results = run_local(rt, slug, plan.slices, concurrency, on_progress=tick)
        finally:
            view.show(store.status(slug))
    rt.close()
    if interrupted.is_set():
        err.print("interrupted: every committed batch is kept; run the same command to resume")
        sys.exit(130)
    failed = {ref: r for ref, r in results.items() if r.outcome == "failed"}
    for (chapter_id, slice_no), result in failed.items():
        err.print(f"failed {slug}/{chapter_id} slice {slice_no}: {result.detail}")
    report = store.status(slug)
    out.print(f"{report.questions.done}/{report.questions.target} questions; "
              f"{report.chapters.done}/{report.chapters.total} chapters done"
              + _cancelled_note(report.chapters.cancelled, slug))
    _exit_as_the_exam_ended(report, slug)


def _start_local(settings: Settings, store: Store, slug: str, syllabus: Syllabus,
                 budget_usd: float | None, batch: bool, verify: str | None) -> Any:
    """`run`'s start: the exam recorded and its slices cut, as enqueue does."""
    from producer.grounding import exam_material
    material = exam_material(settings, slug, syllabus, store, _warn)  # refused before a write
    _warn_unpriced(settings)
    _warn_verify_batch(verify or syllabus.verify or store.verification_owed(slug)[0]
                       or settings.verify, bool(batch))
    for chapter_id in store.restart_cancelled(slug):  # as enqueue: run undoes `cancel`
        err.print(f"restarted {slug}/{chapter_id} (was cancelled)")
    return store.sync_exam(slug, syllabus, budget_usd=budget_usd,
                           default_budget_usd=settings.budget_usd,
                           slice_questions=settings.slice_questions, material=material,
                           verify=verify, default_verify=settings.verify,
                           batch_mode=bool(batch))


def _audited(store: Store, action: str, slug: str | None,
             details: dict[str, Any] | None = None) -> Any:
    """The audit of a command's action, as the local user (producer.access.audited)."""
    from producer.access import audited, cli_actor

    return audited(store, cli_actor(), action, slug,
                   {k: v for k, v in (details or {}).items() if v is not None})


def _audit_budget(store: Store, slug: str, budget_usd: float | None) -> None:
    """A budget given to enqueue or run: recorded on its own, as the API's (`audit
    --exam SLUG` then lists every change of it)."""
    if budget_usd is not None:
        from producer.access import cli_actor

        store.record_audit(cli_actor(), "budget.set", slug, {"budget_usd": budget_usd}, "ok")


def _exit_as_the_exam_ended(report: ExamReport, slug: str) -> None:
    """`run` exits 0 only when its exam ended done (producer.exits); a pause says why, once."""
    from producer import exits

    code = exits.of_report(report)
    if report.state == "paused":
        err.print(f"paused: {report.pause_reason}; fix the cause, then run: python -m producer "
                  f"resume {slug}", markup=False)
    if code != exits.DONE:
        sys.exit(code)


def _stop_on_signals(rt: Any) -> threading.Event:
    """Ctrl-C (and SIGTERM) in `run`: the first sets the runtime's stop flag, so that nothing
    new is paid for and the running slices hand back after the call each is in (committed, or
    booked); a second abandons those calls at once, as a crash would: the next run's claim
    books them at their worst case. The handler only sets flags: see runner.local._drain."""
    import os

    interrupted = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if interrupted.is_set():
            err.print("abandoned the calls in flight (the next run books them at their worst "
                      "case); run the same command to resume")
            sys.stderr.flush()
            os._exit(130)
        interrupted.set()
        rt.stopping.set()
        err.print(f"finishing {plural(rt.keeper.held(), 'call')} in flight; Ctrl-C again to "
                  "abandon them (they are booked at their worst case)")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return interrupted


def _cancelled_note(cancelled: int, slug: str) -> str:
    """`run`'s summary of a run that `cancel` stopped: say so, and how to go on."""
    if not cancelled:
        return ""
    return (f", {plural(cancelled, 'chapter')} cancelled (python -m producer run {slug} "
            "restarts them)")


def _run_batch(settings: Settings, store: Store, slug: str) -> None:
    """`run --batch`: batch passes (runner.batching) in this process every BATCH_POLL_S
    until the exam has nothing pending, running or in a live batch. Killed and started
    again, it resumes from the database: its submissions are recovered or polled."""
    from runner.batching import BatchRuntime, run_pass

    rt = BatchRuntime.build(settings, store)
    stop = threading.Event()

    def stop_now(signum: int, frame: object) -> None:
        rt.stopping.set()
        stop.set()

    signal.signal(signal.SIGTERM, stop_now)
    signal.signal(signal.SIGINT, stop_now)
    try:
        with LiveView(err, interval_s=5.0) as view:
            while not stop.is_set():
                run_pass(rt, [slug])
                report = store.status(slug)
                view.show(report)
                if report.state == "paused":
                    break  # said once below, with its exit code
                if report.finished and not store.live_batches(slug):
                    break
                wait = store.next_batch_wait(slug)
                stop.wait(settings.batch_poll_s if wait is None
                          else min(settings.batch_poll_s, max(0.1, wait)))
    finally:
        rt.close()
    if stop.is_set():
        err.print(f"stopped; the exam's batches go on at the provider: run it again to "
                  f"collect them (python -m producer run {slug} --batch)")
        sys.exit(130)
    report = store.status(slug)
    out.print(f"{report.questions.done}/{report.questions.target} questions; "
              f"{report.chapters.done}/{report.chapters.total} chapters done"
              + _cancelled_note(report.chapters.cancelled, slug))
    if report.chapters.failed:
        for chapter in report.chapter_list:
            if chapter.state == "failed":
                err.print(f"failed {slug}/{chapter.id}: {chapter.last_error}")
    _exit_as_the_exam_ended(report, slug)


def reconcile() -> None:
    from tasks.app import app_for
    from tasks.broker import check_broker
    from tasks.reconcile import reconcile_once

    settings = _settings()
    store = _store(settings)
    app = app_for(settings)
    check_broker(app, settings)
    result = reconcile_once(settings, store, app)
    out.print(f"re-enqueued {result['requeued']} ({result['requeued_lost']} whose message the "
              f"broker lost), failed at attempt cap {result['failed_at_cap']}, calls settled "
              f"on cancelled chapters {result['settled_cancelled']}, other calls of dead "
              f"workers settled {result['settled_orphans']}, exams paused with no room in "
              f"their budget {result['paused_budget']}")


def resume(slug: str) -> None:
    from tasks.app import app_for
    from tasks.broker import broker_epoch, check_broker, publish_work

    settings = _settings()
    store = _store(settings)
    app = app_for(settings)
    check_broker(app, settings)
    _warn_unpriced(settings)
    with _audited(store, "run.resume", slug) as note:
        slices = store.resume(slug)
        publish_work(app, store, slug, slices, broker_epoch(app, settings) if slices else None)
        note["details"]["slices"] = len(slices)
    chapters = len({chapter_id for chapter_id, _ in slices})
    out.print(f"resumed {slug}: {plural(chapters, 'chapter')} enqueued "
              f"({plural(len(slices), 'slice')})")
    _hint_cancelled(store, slug)


def _hint_cancelled(store: Store, slug: str) -> None:
    """resume and retry leave cancelled chapters alone: say which command restarts them."""
    n = store.status(slug).chapters.cancelled
    if n:
        out.print(f"{plural(n, 'chapter')} of {slug} cancelled, left as they are; restart "
                  f"them with: python -m producer enqueue {slug}")


def retry(slug: str, chapters: tuple[str, ...]) -> None:
    from tasks.app import app_for
    from tasks.broker import broker_epoch, check_broker, publish_work

    settings = _settings()
    store = _store(settings)
    known = store.chapter_ids(slug)
    if known is None:
        store.status(slug)  # raises UnknownExam with the usual message
    unknown = [c for c in chapters if c not in (known or [])]
    if unknown:
        raise UserError(f"--chapter: chapter {unknown[0]!r} is not in exam {slug}")
    app = app_for(settings)
    check_broker(app, settings)  # before changing anything
    with _audited(store, "run.retry", slug, {"chapters": list(chapters) or None}) as note:
        slices = store.retry_failed(slug, list(chapters) or None)
        publish_work(app, store, slug, slices, broker_epoch(app, settings) if slices else None)
        note["details"]["slices"] = len(slices)
    n = len({chapter_id for chapter_id, _ in slices})
    out.print(f"retrying {n} failed {'chapter' if n == 1 else 'chapters'} of {slug} "
              f"({plural(len(slices), 'slice')})")
    _hint_cancelled(store, slug)
    report = store.status(slug)
    if report.state == "paused" and slices:
        out.print(f"exam {slug} is paused ({report.pause_reason}): they run once you "
                  f"resume it: python -m producer resume {slug}")


def cancel(slug: str, chapters: tuple[str, ...]) -> None:
    settings = _settings()
    store = _store(settings)
    with _audited(store, "run.cancel", slug, {"chapters": list(chapters) or None}) as note:
        try:
            n = store.cancel(slug, list(chapters) or None)
        except UnknownChapter as exc:  # refused as a whole, like enqueue --regenerate
            raise UserError(f"--chapter: {exc}") from None
        note["details"]["cancelled"] = n
    busy = store.cancelled_in_flight(slug, list(chapters) or None) if n else 0
    out.print(f"cancelled {plural(n, 'chapter')} of {slug}" + (
        f" ({busy} with a call in flight: its reply is paid for and kept when it comes, "
        f"and may finish {'its chapter' if busy == 1 else 'their chapters'})" if busy else ""))
    if not chapters:
        # The exam's provider batches too (batch mode): a batch holds the slices of many
        # chapters, so only a cancel of the whole exam cancels them.
        from producer.batches import cancel_batches

        for line in cancel_batches(settings, store, slug).lines(slug):
            out.print(line, markup=False, soft_wrap=True)


def doctor() -> None:
    from producer.doctor import DAMAGED, run_checks

    settings = _settings()
    findings = run_checks(settings)
    for f in findings:
        style = {"ok": "green", "warn": "yellow", "fail": "bold red"}[f.level.value]
        # Escaped: quick_check's lines are the database's words, not markup.
        out.print(f"[{style}]{f.level.value:<4}[/] {f.check}: {escape(f.message)}",
                  soft_wrap=True)
    failed = [f for f in findings if f.level.value == "fail"]
    if any(f.check == DAMAGED for f in failed):
        sys.exit(DatabaseCorrupt.exit_code)
    if failed:
        sys.exit(max(f.exit_code for f in failed))


def migrate() -> None:
    _store(_settings())
    out.print("schema is up to date")


def backup(path: Path) -> None:
    settings = _settings()
    size = backup_sqlite(settings.database_url, path)
    out.print(f"backed up {_shown_url(settings)} to {path} ({size:,} bytes, quick_check ok); "
              "to restore it, see docs/how-to/backup-and-restore.md", markup=False,
              soft_wrap=True)


def _shown_url(settings: Settings) -> str:
    return shown_url(settings.database_url)


def import_(slug: str, file: Path) -> None:
    from producer.importer import import_file, report_lines

    settings = _settings()
    result = import_file(settings, _store(settings), slug, file)
    for line in report_lines(result):
        out.print(line, markup=False)


def prune(older_than: Duration, dry_run: bool, slug: str | None) -> None:
    settings = _settings()
    store = _read_store(settings) if dry_run else _store(settings)
    result = store.prune(older_than.seconds, dry_run=dry_run, exam=slug)
    for line in prune_report_lines(result, dry_run=dry_run, older_than=older_than.text):
        out.print(line, markup=False)
    if not dry_run:
        # The API's Idempotency-Keys past API_IDEMPOTENCY_TTL_S (its runs stay readable).
        forgotten = store.forget_idempotency_keys(settings.api_idempotency_ttl_s)
        if forgotten:
            out.print(f"forgot {forgotten} idempotency keys older than "
                      f"{settings.api_idempotency_ttl_s:g} s", markup=False)
    if slug is not None and result.busy:
        raise UserError(f"exam {slug} is busy (another transaction holds its rows); "
                        "not pruned, try again")


def serve(host: str, port: int, local: bool, no_auth: bool) -> None:
    from producer.api.serve import check_binding, serve as run_server

    settings = _settings()
    check_binding(settings, host, no_auth, _live_tokens(settings))
    _warn_unpriced(settings)
    run_server(settings, host, port, local=local, no_auth=no_auth)


def _live_tokens(settings: Settings) -> int:
    """How many named tokens the database has (0 when it has no schema yet: never created
    here, serve's own refusal must leave nothing behind)."""
    if settings.api_token_list():
        return 0  # not needed: API_TOKENS is enough
    store = _existing_store(settings)
    if store is None:
        return 0
    try:
        return store.live_token_count()
    finally:
        store.engine.dispose()


# --- tokens and the audit -------------------------------------------------------------


def token_add(name: str, role: str, exams: tuple[str, ...]) -> None:
    from examforge.syllabus import check_name
    from producer.access import check_token_name, cli_actor, new_token, token_hash

    check_token_name(name)
    if role == "admin" and exams:
        raise UserError("--exam: an admin token covers every exam; give it another role to "
                        "scope it to exams")
    for slug in exams:
        try:
            check_name(slug, "--exam")
        except ValueError as exc:
            raise UserError(str(exc)) from None
    store = _store(_settings())
    secret = new_token()
    scope = sorted(set(exams)) or None
    with _audited(store, "token.add", scope[0] if scope and len(scope) == 1 else None,
                  {"name": name, "role": role, "exams": scope}):
        row = store.add_token(name, role, scope, token_hash(secret), cli_actor())
        if row is None:
            raise UserError(f"a live token is named {name!r}: revoke it first (python -m "
                            f"producer token revoke {name}), or choose another name")
    click.echo(f"token {name} added: {role} of {_scope_text(scope)}. It is shown once, "
               "below: keep it now (only its hash is stored).")
    click.echo(secret)


def _scope_text(exams: list[str] | None) -> str:
    return "every exam" if exams is None else ", ".join(exams)


def token_list(as_json: bool, revoked: bool) -> None:
    rows = _read_store(_settings()).tokens(revoked=revoked)
    items: list[dict[str, Any]] = [{"name": t.name, "role": t.role, "exams": t.exams,
              "created_at": when(t.created_at), "created_by": t.created_by,
              "last_used_at": when(t.last_used_at), "revoked_at": when(t.revoked_at)}
             for t in rows]
    if as_json:
        click.echo(json.dumps({"items": items}, indent=2))
        return
    if not items:
        out.print("no named tokens (python -m producer token add NAME --role ROLE)")
        return
    from rich.table import Table

    table = Table(title=f"{len(items)} tokens")
    for col in ("name", "role", "exams", "created", "last used") + (("revoked",) if revoked
                                                                      else ()):
        table.add_column(col)
    for t in items:
        table.add_row(escape(t["name"]), t["role"], escape(_scope_text(t["exams"])),
                      t["created_at"] or "-", t["last_used_at"] or "never",
                      *((t["revoked_at"] or "-",) if revoked else ()))
    out.print(table)


def token_revoke(name: str) -> None:
    store = _store(_settings())
    with _audited(store, "token.revoke", None, {"name": name}):
        row = store.revoke_token(name)
        if row is None:
            raise UserError(f"no live token is named {name!r} (python -m producer token list)")
    out.print(f"revoked token {name} ({row.role}): refused from its next request on",
              markup=False)


def audit(slug: str | None, since: str | None, as_json: bool, limit: int,
          after: str | None) -> None:
    from producer.audit import audit_dict, since_epoch_s

    store = _read_store(_settings())
    rows, cursor = store.audit_page(exam=slug, since=since_epoch_s(since, store), limit=limit,
                                    after=after)
    items = [audit_dict(r) for r in rows]
    if as_json:
        click.echo(json.dumps({"items": items, "next": cursor}, indent=2, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table(title=f"audit{' of ' + slug if slug else ''}: {len(items)} rows")
    for col in ("at", "who", "action", "exam", "outcome", "details"):
        table.add_column(col)
    for r in items:
        details = json.dumps(r["details"], ensure_ascii=False) if r["details"] else ""
        table.add_row(r["at"] or "-", escape(r["actor"]), r["action"], r["exam"] or "-",
                      r["outcome"], escape(short(details)))
    out.print(table)
    if cursor is not None:
        out.print(f"more: python -m producer audit --after {cursor}", markup=False)
