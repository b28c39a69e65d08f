"""Issue 20: the blind solve (VERIFY) on the mock: the share of wrong keys caught, the share
of right keys falsely disputed, and the extra cost per stored question under flag and replace,
against VERIFY=off on the same exam and seed (bench/verify.py has the measurement; also
`python -m bench.verify`). In process, SQLite, about 30 s at full size."""

from __future__ import annotations

from bench.suite import Context, Figure, PartResult
from bench.verify import measure, summary, table

NAME = "verify"
TITLE = "blind solve: wrong keys caught, right keys disputed, extra cost (issue 20)"
FULL, SMALL = 5000, 500
WRONG_KEY_RATE, SOLVER_ERROR_RATE = 0.1, 0.01


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    m = measure(ctx.workdir, SMALL if ctx.small else FULL, WRONG_KEY_RATE, SOLVER_ERROR_RATE)
    part.runs.append(m)
    off = m["cost_per_question"]["off"]
    part.figures += [
        Figure("wrong keys caught (flag), %", 100 * m["caught"], None, "–", "%",
               target="≥ 95 %"),
        Figure("right keys falsely disputed (flag), %", 100 * m["falsely_disputed"], None, "–",
               "%", target="≤ 2 %"),
        Figure("cost per stored question, flag", 1e6 * m["cost_per_question"]["flag"],
               1e6 * off, "VERIFY=off", "µUSD"),
        Figure("cost per stored question, replace", 1e6 * m["cost_per_question"]["replace"],
               1e6 * off, "VERIFY=off", "µUSD"),
    ]
    part.details += [
        f"Exam: {m['questions']} questions in chapters of 100 (slices of 50), "
        f"QUESTIONS_PER_CALL=10, one thread; mock seed {m['seed']}, wrong_key_rate "
        f"{m['wrong_key_rate']}, solver_error_rate {m['solver_error_rate']}, latency 0; "
        "priced like gpt-4o-mini; the solver is the generation model at the same endpoint.",
        "", *table(m), "", *summary(m)]
    return part
