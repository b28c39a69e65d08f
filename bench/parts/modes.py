"""Issue 18: the cost per question of the same exam in each generation mode: synchronous,
flex (`LLM_SERVICE_TIER=flex`) and batch (`producer run --batch`), on SQLite and PostgreSQL.

Each run is `python -m producer run SLUG` on a fresh database against a fresh in-process mock
with the same configuration (seed 7, 30 % of each reply meant as rewordings of questions
already served, 50 ms latency, one thread), the mock's model priced like gpt-4o-mini. Per mode: what the
ledger booked against what the mock's usage log bills at the same prices (they must agree),
the cost per question and its ratio to sync's, the repeats the near-duplicate check
rejected, the paid calls and rounds. Also `python -m bench --only modes --results
bench/results-modes.md` alone, about a minute (bench/modes.py has the measurement)."""

from __future__ import annotations

import contextlib

from bench.modes import MODES, PRICES, Spec, ratio, run_mode, table
from bench.suite import Context, Figure, PartResult

NAME = "modes"
TITLE = "cost per question: sync, flex and batch on the same exam (issue 18)"
# Several chapters, most larger than one call (QUESTIONS_PER_CALL=10, its default); the
# 120-question one is three slices (SLICE_QUESTIONS=50).
FULL = [8, 25, 40, 60, 120]
SMALL = [5, 15, 30]


def micro(usd: float | None) -> float | None:
    """USD in millionths: the summary prints two decimals, and a question costs ~$0.0001."""
    return None if usd is None else usd * 1e6


def run(ctx: Context) -> PartResult:
    from bench.history import pg_database

    part = PartResult(NAME, TITLE)
    spec = Spec(SMALL if ctx.small else FULL)
    results = []
    for db in ("sqlite", "postgresql"):
        for mode in MODES:
            with contextlib.ExitStack() as stack:
                url = (f"sqlite:///{ctx.workdir / f'modes-{mode}.db'}" if db == "sqlite"
                       else stack.enter_context(pg_database("efbench_modes")))
                r = run_mode(mode, spec, ctx.workdir, url, db)
            results.append(r)
            part.runs.append(r.to_dict())
            if r.error:
                raise RuntimeError(f"{mode} on {db}: {r.error}")
    for db in ("sqlite", "postgresql"):
        sync = next(r for r in results if r.db == db and r.mode == "sync")
        for mode in ("flex", "batch"):
            r = next(r for r in results if r.db == db and r.mode == mode)
            part.figures.append(Figure(
                f"cost per question, {mode} vs sync, {db}", micro(r.cost_per_question),
                micro(sync.cost_per_question), "sync", "µUSD", note=(
                    f"repeats {r.repeats}/{r.received} vs sync's {sync.repeats}/{sync.received}")))
        worst = max(abs(r.difference_usd) for r in results if r.db == db)
        part.figures.append(Figure(f"largest |booked - mock's bill| of the three, {db}",
                                   micro(worst), None, "–", "µUSD"))
    part.details += [
        f"Exam: {len(spec.targets)} chapters of {', '.join(map(str, spec.targets))} questions "
        f"({sum(spec.targets)}), QUESTIONS_PER_CALL=10, `producer run -c {spec.concurrency}`; "
        f"mock seed {spec.seed}, reword_rate {spec.reword_rate}, latency {spec.latency_s} s "
        f"(flex replies 3x), prices {PRICES} USD per million tokens, LLM_BATCH_DISCOUNT=0.5, "
        f"LLM_FLEX_PRICE_FACTOR=0.5, BATCH_POLL_S={spec.batch_poll_s}.",
        "",
        *table(results),
        "",
        "- paid calls: billed requests (batch mode: billed batch lines) in the mock's usage "
        "log; booked: the sum of the ledger's `call.cost_usd`; the mock's bill: the usage log "
        "priced at the same prices, times 0.5 for a batch line or a reply reporting "
        "`service_tier: flex`.",
        "- rounds: batch mode's provider batches; sync and flex: the most calls one slice made "
        "(a slice's calls run one after another).",
        "- repeats: questions the ledger notes as rejected repeats (exact or near-duplicates), "
        "over those plus the stored ones.",
        "- wall: launch to exit of `producer run`, including start-up; batch mode also waits "
        f"on the mock's batch states and polls every {spec.batch_poll_s} s.",
    ]
    for db in ("sqlite", "postgresql"):
        part.details.append(
            f"- {db}: cost per question, batch / sync {ratio(results, 'batch', db):.2f}x, "
            f"flex / sync {ratio(results, 'flex', db):.2f}x")
    return part
