"""History must not slow the present (issue 19): bench/history.py as a part of the suite,
only when named (`python -m bench --only history`, about two minutes at full size on
PostgreSQL; `--small` builds 200 exams, 20,000 slices)."""

from __future__ import annotations

from bench import history
from bench.suite import Context, Figure, PartResult

NAME = "history"
TITLE = "the work that runs all the time at 1,000,000 done slices vs the active exams alone"


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    exams = 200 if ctx.small else 10_000
    (ctx.workdir / "exams").mkdir(exist_ok=True)
    out = history.run_both(lambda name: history.pg_database(), exams, ctx.workdir,
                           2 if ctx.small else history.REPEATS)
    part.runs.append(out)
    for key, label in history.LABELS.items():
        target = history.TARGETS[key]
        if key not in out["history"]:
            continue
        part.figures.append(Figure(
            f"{label}, {out['slices']:,} done slices (PostgreSQL)", out["history"][key],
            out["present"][key], "the active exams alone", "s",
            "" if target is None else f"≤ {target:g} s (absolute)",
            note="" if target is None else (
                f"{out['history'][key]:.3f} s against the issue's {target:g} s: "
                + ("met" if out["history"][key] <= target else "NOT met"))))
    part.details += history.render(out)
    return part
