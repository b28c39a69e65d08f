"""`python -m producer status SLUG --json` at 100,000 questions against 100 (issue 8, row 8),
on the exams the export part seeds (20 chapters, a call per 10 questions). Each run is timed
from launch to exit, fastest of `REPEATS`."""

from __future__ import annotations

import sys

from bench.parts.export import measure, seeded
from bench.report import table
from bench.suite import Context, Figure, PartResult
from bench.systems.embedded import ef_env

NAME = "status"
TITLE = "status at 100,000 questions against 100"


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    repeats = 1 if ctx.small else 3
    db_url, slugs = seeded(ctx)
    env = ef_env(ctx.workdir, db_url, ctx.mock.url, 10, "unused", ctx.redis_url)
    got = {}
    for n, slug in slugs.items():
        got[n] = measure([sys.executable, "-m", "producer", "status", slug, "--json"], env,
                         repeats)
        part.runs.append({"questions": n, "wall_s": got[n][0], "cpu_s": got[n][1],
                          "peak_rss_mb": got[n][2]})
    small_n, big_n = sorted(got)
    part.figures.append(Figure(
        f"`status --json` at {big_n:,} vs {small_n} questions, launch to exit",
        got[big_n][0], got[small_n][0], f"status at {small_n}", "s", "keep (was 1.14x)",
        target_max=1.3))
    part.details += table(("questions", "s (launch → exit)", "CPU s", "peak RSS MB"),
                          [[f"{n:,}", f"{w:.2f}", f"{c:.2f}", f"{r:.0f}"]
                           for n, (w, c, r) in sorted(got.items())])
    return part
