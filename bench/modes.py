"""Cost per question in each generation mode (issue 18): the same exam run synchronously,
at the flex tier and through the Batch API, each on a fresh database against a fresh mock
with the same configuration and seed, and the ledger's booked cost checked against the
mock's usage log priced the same way.

Used by the bench part `modes` (bench/parts/modes.py) and, at a small size, by
tests/e2e/test_mode_costs.py. Each mode is one real `python -m producer run SLUG` process
(`--batch` for batch mode, `LLM_SERVICE_TIER=flex` for flex), so what is measured is what a
user runs.

A fresh mock per mode, rather than one mock reset between modes: the mock keeps what it
served each chapter across a reset (so texts never repeat), which would change the repeats
the later modes see. A fresh mock gives every mode the same model from the same seed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from mockllm import MockConfig, MockServer
from bench.measure import child_pythonpath

ROOT = Path(__file__).resolve().parent.parent

# The mock's model is free in the price data, so it is priced explicitly, like gpt-4o-mini
# (USD per million prompt, cached prompt and completion tokens).
PRICES = {"LLM_PRICE_PROMPT_PER_MTOK": 0.15, "LLM_PRICE_CACHED_PROMPT_PER_MTOK": 0.075,
          "LLM_PRICE_COMPLETION_PER_MTOK": 0.60}
BATCH_DISCOUNT = 0.5  # LLM_BATCH_DISCOUNT's default, OpenAI's Batch API
FLEX_FACTOR = 0.5  # LLM_FLEX_PRICE_FACTOR's default, OpenAI's flex tier
PRIORITY_FACTOR = 2.0
MODES = ("sync", "flex", "batch")

# The ledger notes a call's rejected repeats in its detail (exact or near-duplicates, at
# parse or at commit); the same reading as tests/integration/test_batch_mode.py.
_REJECTED = re.compile(r"(\d+) (?:duplicate|near_duplicate) rejected")


@dataclass
class Spec:
    """The exam and the mock, the same for every mode."""

    targets: list[int]  # questions per chapter
    seed: int = 7
    reword_rate: float = 0.3
    latency_s: float = 0.05
    # One thread: the mock draws its rewordings from one seeded stream in the order requests
    # arrive, so with several threads the interleaving of chapters changes which questions
    # come back as repeats from run to run (sync's repeats moved 21-25 of ~275 at -c 8). At
    # -c 1 every run of a mode sees the same draws; cost does not depend on concurrency.
    concurrency: int = 1
    batch_poll_s: float = 0.3
    timeout_s: float = 300.0
    # A budget makes the ledger keep exam.spent_usd (and reserve every call's worst case,
    # at the discount in batch and flex mode); None: no budget, spent_usd stays 0.
    budget_usd: float | None = None


@dataclass
class ModeResult:
    mode: str
    db: str
    questions_target: int
    questions_stored: int = 0
    chapters_done: int = 0
    calls_booked: int = 0  # rows of the ledger
    calls_paid: int = 0  # billed requests or batch lines in the mock's usage log
    batch_lines: int = 0
    batches: int = 0  # provider batches (rounds) in batch mode
    max_calls_per_slice: int = 0  # sync/flex: a slice's calls run one after another
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ledger_tokens: tuple[int, int, int] = (0, 0, 0)  # the same three as the ledger booked them
    booked_usd: float = 0.0  # sum of the ledger's call.cost_usd
    spent_usd: float = 0.0  # exam.spent_usd (kept only with a budget)
    bill_usd: float = 0.0  # the mock's usage log priced the same way
    repeats: int = 0
    received: int = 0
    wall_s: float = 0.0
    exit_code: int | None = None
    tiers: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @property
    def difference_usd(self) -> float:
        return self.booked_usd - self.bill_usd

    @property
    def cost_per_question(self) -> float | None:
        return self.booked_usd / self.questions_stored if self.questions_stored else None

    @property
    def repeat_rate(self) -> float | None:
        return self.repeats / self.received if self.received else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "difference_usd": self.difference_usd,
                "cost_per_question": self.cost_per_question, "repeat_rate": self.repeat_rate}


def price_record(record: dict[str, Any]) -> float:
    """What the provider bills one usage-log record: the standard price of its tokens (cached
    prompt tokens at the cached price), times the batch discount for a batch line or the
    tier's factor for a synchronous reply."""
    if not record.get("billed"):
        return 0.0
    cached = record.get("cached_tokens") or 0
    usd = ((record["prompt_tokens"] - cached) * PRICES["LLM_PRICE_PROMPT_PER_MTOK"]
           + cached * PRICES["LLM_PRICE_CACHED_PROMPT_PER_MTOK"]
           + record["completion_tokens"] * PRICES["LLM_PRICE_COMPLETION_PER_MTOK"]) / 1e6
    if record.get("batch_id"):
        return usd * BATCH_DISCOUNT
    tier = record.get("service_tier")
    return usd * {"flex": FLEX_FACTOR, "priority": PRIORITY_FACTOR}.get(tier or "", 1.0)


def write_syllabus(exams_dir: Path, slug: str, targets: list[int]) -> None:
    import json

    folder = exams_dir / slug
    folder.mkdir(parents=True, exist_ok=True)
    chapters = [{"id": f"ch{i:02d}", "title": f"Chapter {i + 1} of the modes bench",
                 "questions": n} for i, n in enumerate(targets)]
    (folder / "syllabus.json").write_text(json.dumps(
        {"title": "Modes bench", "chapters": chapters}, indent=1))


def mode_env(mode: str, db_url: str, mock_url: str, exams_dir: Path, spec: Spec
             ) -> dict[str, str]:
    """The run's environment: ours minus any examforge setting of the caller's, plus the
    database, the mock, the prices (the same in every mode) and the mode's own settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLM_", "DATABASE_", "BROKER_", "EXAMS_", "TASK_", "QUESTIONS_",
                                "WORKER_", "BATCH_", "BUDGET_"))}
    env.update({"PYTHONPATH": child_pythonpath(), "DATABASE_URL": db_url, "EXAMS_DIR": str(exams_dir),
                "LLM_BASE_URL": mock_url, "LLM_BATCH_DISCOUNT": str(BATCH_DISCOUNT),
                "LLM_FLEX_PRICE_FACTOR": str(FLEX_FACTOR),
                "BATCH_POLL_S": str(spec.batch_poll_s),
                **{k: str(v) for k, v in PRICES.items()}})
    if spec.budget_usd is not None:
        env["BUDGET_USD"] = str(spec.budget_usd)
    if mode == "flex":
        env["LLM_SERVICE_TIER"] = "flex"
    return env


def _read_ledger(res: ModeResult, db_url: str, slug: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            res.questions_stored = conn.execute(
                text("SELECT count(*) FROM question WHERE exam = :s"), {"s": slug}).scalar_one()
            res.chapters_done = conn.execute(text(
                "SELECT count(*) FROM slice WHERE exam = :s AND state = 'done'"),
                {"s": slug}).scalar_one()
            res.spent_usd = conn.execute(text("SELECT spent_usd FROM exam WHERE slug = :s"),
                                         {"s": slug}).scalar_one()
            res.batches = conn.execute(text("SELECT count(*) FROM batch WHERE exam = :s"),
                                       {"s": slug}).scalar_one()
            rows = conn.execute(text(
                "SELECT chapter_id, slice_no, cost_usd, questions_stored, requested, detail, "
                "service_tier, prompt_tokens, cached_tokens, completion_tokens FROM call WHERE exam = :s"), {"s": slug}).all()
    finally:
        engine.dispose()
    per_slice: dict[tuple[str, int], int] = {}
    p = c = o = 0
    for r in rows:
        p, c, o = p + r.prompt_tokens, c + r.cached_tokens, o + r.completion_tokens
        res.calls_booked += 1
        res.booked_usd += r.cost_usd or 0.0
        per_slice[(r.chapter_id, r.slice_no)] = per_slice.get((r.chapter_id, r.slice_no), 0) + 1
        res.received += r.questions_stored
        found = [int(n) for n in _REJECTED.findall(r.detail or "")]
        if found:
            res.repeats += sum(found)
        elif (r.detail or "").startswith("every question was one the chapter already had"):
            res.repeats += r.requested
        res.tiers[r.service_tier or "-"] = res.tiers.get(r.service_tier or "-", 0) + 1
    res.received += res.repeats
    res.ledger_tokens = (p, c, o)
    res.max_calls_per_slice = max(per_slice.values(), default=0)


def run_mode(mode: str, spec: Spec, workdir: Path, db_url: str, db_name: str,
             slug: str = "modes") -> ModeResult:
    """One `producer run` of the spec's exam in `mode` on the (fresh) database `db_url`,
    against a fresh mock; returns what the ledger booked and what the mock billed."""
    res = ModeResult(mode, db_name, sum(spec.targets))
    exams_dir = workdir / f"exams-{mode}-{db_name}"
    write_syllabus(exams_dir, slug, spec.targets)
    config = MockConfig(latency_s=spec.latency_s, seed=spec.seed, reword_rate=spec.reword_rate)
    with MockServer(config) as mock:
        env = mode_env(mode, db_url, str(mock.base_url), exams_dir, spec)
        cmd = [sys.executable, "-m", "producer", "run", slug, "--concurrency",
               str(spec.concurrency), *(["--batch"] if mode == "batch" else [])]
        log = workdir / f"{mode}-{db_name}.log"
        t0 = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
            try:
                res.exit_code = proc.wait(spec.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                res.error = f"timed out after {spec.timeout_s:.0f} s"
        res.wall_s = time.monotonic() - t0
        if res.exit_code not in (0, None) and not res.error:
            res.error = f"exit {res.exit_code}: " + log.read_text()[-600:]
        usage = mock.usage()
    if res.error:
        return res
    for record in usage:
        if not record.get("billed"):
            continue
        res.calls_paid += 1
        res.batch_lines += bool(record.get("batch_id"))
        res.prompt_tokens += record["prompt_tokens"]
        res.cached_tokens += record.get("cached_tokens") or 0
        res.completion_tokens += record["completion_tokens"]
        res.bill_usd += price_record(record)
    _read_ledger(res, db_url, slug)
    return res


def run_modes(spec: Spec, workdir: Path, databases: dict[str, Any],
              modes: tuple[str, ...] = MODES) -> list[ModeResult]:
    """Every mode on every database. `databases` maps a name to a function returning a
    fresh database URL for one run (and dropping nothing: the caller cleans up)."""
    out = []
    for db_name, fresh in databases.items():
        for mode in modes:
            out.append(run_mode(mode, spec, workdir, fresh(mode), db_name))
    return out


def ratio(results: list[ModeResult], mode: str, db: str) -> float | None:
    """`mode`'s cost per question over sync's, on the same database."""
    by = {r.mode: r for r in results if r.db == db}
    a, b = by.get(mode), by.get("sync")
    if not a or not b or not a.cost_per_question or not b.cost_per_question:
        return None
    return a.cost_per_question / b.cost_per_question


def table(results: list[ModeResult]) -> list[str]:
    """The markdown table of the README and bench/results-modes.md."""
    lines = ["| mode | db | questions stored / target | paid calls (batch lines) | rounds | "
             "prompt / cached / completion tokens | booked (ledger) | mock's bill | "
             "difference | cost per question | vs sync | repeats / received | wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rounds = (f"{r.batches} batches" if r.mode == "batch"
                  else f"≤ {r.max_calls_per_slice} calls a slice")
        vs = ratio(results, r.mode, r.db)
        cpq = r.cost_per_question
        rate = r.repeat_rate
        lines.append(
            f"| {r.mode} | {r.db} | {r.questions_stored} / {r.questions_target} | "
            f"{r.calls_paid} ({r.batch_lines}) | {rounds} | "
            f"{r.prompt_tokens:,} / {r.cached_tokens:,} / {r.completion_tokens:,} | "
            f"${r.booked_usd:.6f} | ${r.bill_usd:.6f} | {r.difference_usd:+.1e} | "
            f"{'n/a' if cpq is None else f'${cpq:.7f}'} | "
            f"{'n/a' if vs is None else f'{vs:.2f}x'} | "
            f"{r.repeats} / {r.received} ({'n/a' if rate is None else f'{rate:.1%}'}) | "
            f"{r.wall_s:.1f} s |")
    return lines
