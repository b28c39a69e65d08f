"""Issue 20: what the blind solve (VERIFY) catches and costs, on the mock.

The same exam is generated three times on fresh SQLite files against a fresh in-process mock
with the same seed: VERIFY=off (the baseline), flag and replace. The mock gives a share of its
questions a wrong key (`wrong_key_rate`) and answers blind solves truthfully but for its own
error rate (`solver_error_rate`); the truth of every key is read from the question's choices
(mockllm.questions.true_index), never from the key.

- caught: of the questions stored with a wrong key under `flag` (every generated question
  stays, with its verdict), the share disputed;
- falsely disputed: of those with a right key, the share disputed;
- under `replace`: the wrong keys left in the count and the exports (a solver error that
  happened to pick the wrong key), and the withdrawn questions;
- extra cost per stored question: the ledger's cost over the questions in the count, against
  VERIFY=off's.

`python -m bench.verify [--questions N] [--wrong-key-rate R] [--solver-error-rate E]`, or the
`verify` part of `python -m bench`. Runs in process (process_chapter, one thread): a few
seconds per thousand questions.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# gpt-4o-mini's prices, as bench/modes.py, USD per million tokens.
PRICES: dict[str, Any] = {"llm_price_prompt_per_mtok": 0.15, "llm_price_cached_prompt_per_mtok": 0.075,
          "llm_price_completion_per_mtok": 0.60}
SEED = 20
CHAPTER = 100  # questions per chapter


@dataclass
class VerifyRun:
    mode: str
    questions: int  # in the count (the target)
    stored_rows: int = 0  # with the withdrawn ones
    wrong_keys: int = 0  # of the questions in the count
    right_keys: int = 0
    caught: int = 0  # wrong keys disputed
    falsely_disputed: int = 0  # right keys disputed
    withdrawn: int = 0
    generation_calls: int = 0
    solve_calls: int = 0
    generation_usd: float = 0.0
    solve_usd: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cost_usd(self) -> float:
        return self.generation_usd + self.solve_usd

    @property
    def cost_per_question(self) -> float:
        return self.cost_usd / self.questions if self.questions else 0.0


def run_mode(mode: str, workdir: Path, questions: int, wrong_key_rate: float,
             solver_error_rate: float, seed: int = SEED) -> VerifyRun:
    """One exam of `questions` questions generated with VERIFY=`mode`; what it stored, what
    the verdicts said against the truth, and what the ledger booked."""
    from sqlalchemy import select

    from examforge.settings import Settings
    from examforge.syllabus import load_syllabus
    from mockllm import MockConfig, MockServer
    from mockllm.questions import true_index
    from runner.pipeline import Runtime, process_chapter
    from storage import open_store
    from storage.base import K, Q, S

    chapters = [(f"c{i}", min(CHAPTER, questions - i * CHAPTER))
                for i in range((questions + CHAPTER - 1) // CHAPTER)]
    exams = workdir / f"exams-{mode}"
    path = exams / "vb" / "syllabus.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"title": "Verify bench", "chapters": [
        {"id": c, "title": f"Chapter {c}", "questions": n} for c, n in chapters]}))
    db = workdir / f"verify-{mode}.db"
    db.unlink(missing_ok=True)
    config = MockConfig(latency_s=0, seed=seed, wrong_key_rate=wrong_key_rate,
                        solver_error_rate=solver_error_rate)
    with MockServer(config) as mock:
        settings = Settings(_env_file=None, database_url=f"sqlite:///{db}",
                            llm_base_url=mock.base_url, exams_dir=exams, verify=mode,
                            questions_per_call=10, near_dup_scope="off", **PRICES)
        store = open_store(settings.database_url)
        store.sync_exam("vb", load_syllabus(path, max_questions=100_000), verify=mode)
        rt = Runtime.build(settings, store)
        try:
            with store.engine.connect() as conn:
                slices = conn.execute(select(S.c.chapter_id, S.c.slice_no).where(
                    S.c.exam == "vb").order_by(S.c.position, S.c.slice_no)).all()
            for chapter, slice_no in slices:
                deadline = time.monotonic() + 120
                while True:
                    result = process_chapter(rt, "vb", chapter, slice_no)
                    if result.outcome == "done":
                        break
                    if result.outcome != "retry" or time.monotonic() > deadline:
                        raise RuntimeError(f"{mode}: {chapter}/{slice_no}: {result}")
                    time.sleep(min(result.retry_in_s or 0.0, 1.0))
        finally:
            rt.close()
    res = VerifyRun(mode, questions)
    with store.engine.connect() as conn:
        rows = conn.execute(select(Q.c.number, Q.c.choices, Q.c.answer_index, Q.c.verdict,
                                   Q.c.withdrawn).where(Q.c.exam == "vb")).all()
        calls = conn.execute(select(K.c.kind, K.c.cost_usd).where(K.c.exam == "vb")).all()
    store.engine.dispose()
    res.stored_rows = len(rows)
    if sum(r.number is not None for r in rows) != questions:
        raise RuntimeError(f"{mode}: {sum(r.number is not None for r in rows)} questions in "
                           f"the count, not {questions}")
    for r in rows:
        right = r.answer_index == true_index(json.loads(r.choices))
        disputed = r.verdict == "disputed"
        if r.number is None:
            res.withdrawn += 1
        # Under replace the withdrawn rows are the ones the solve disputed: they count in
        # the catch rates with the others; the count is what is left numbered.
        if mode == "replace" or r.number is not None:
            if right:
                res.right_keys += 1
                res.falsely_disputed += disputed
            else:
                res.wrong_keys += 1
                res.caught += disputed
    res.extra["wrong_keys_left_in_count"] = sum(
        1 for r in rows if r.number is not None
        and r.answer_index != true_index(json.loads(r.choices)))
    for kind, cost in calls:
        if kind == "solve":
            res.solve_calls += 1
            res.solve_usd += cost
        else:
            res.generation_calls += 1
            res.generation_usd += cost
    return res


def measure(workdir: Path, questions: int = 2000, wrong_key_rate: float = 0.1,
            solver_error_rate: float = 0.01) -> dict[str, Any]:
    runs = {m: run_mode(m, workdir, questions, wrong_key_rate, solver_error_rate)
            for m in ("off", "flag", "replace")}
    off, flag, replace = runs["off"], runs["flag"], runs["replace"]
    return {
        "questions": questions, "wrong_key_rate": wrong_key_rate,
        "solver_error_rate": solver_error_rate, "seed": SEED,
        "caught": flag.caught / flag.wrong_keys if flag.wrong_keys else None,
        "falsely_disputed": (flag.falsely_disputed / flag.right_keys
                             if flag.right_keys else None),
        "replace_wrong_keys_left": replace.extra["wrong_keys_left_in_count"],
        "replace_withdrawn": replace.withdrawn,
        "cost_per_question": {m: r.cost_per_question for m, r in runs.items()},
        "extra_cost_per_question_flag": flag.cost_per_question - off.cost_per_question,
        "extra_cost_per_question_replace": replace.cost_per_question - off.cost_per_question,
        "runs": {m: {**asdict(r), "cost_usd": r.cost_usd,
                     "cost_per_question": r.cost_per_question} for m, r in runs.items()},
    }


def table(m: dict[str, Any]) -> list[str]:
    lines = ["| VERIFY | in the count | wrong keys in the count | withdrawn | generation calls "
             "| solve calls | generation $ | solve $ | cost per question | vs off |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = m["cost_per_question"]["off"]
    for mode, r in m["runs"].items():
        lines.append(
            f"| {mode} | {r['questions']} | {r['extra']['wrong_keys_left_in_count']} | "
            f"{r['withdrawn']} | {r['generation_calls']} | {r['solve_calls']} | "
            f"${r['generation_usd']:.6f} | ${r['solve_usd']:.6f} | "
            f"${r['cost_per_question']:.8f} | {r['cost_per_question'] / base:.2f}x |")
    return lines


def summary(m: dict[str, Any]) -> list[str]:
    off = m["cost_per_question"]["off"]
    return [
        f"- wrong keys caught (flag): {m['caught']:.1%} of {m['runs']['flag']['wrong_keys']}",
        f"- right keys falsely disputed (flag): {m['falsely_disputed']:.2%} of "
        f"{m['runs']['flag']['right_keys']}",
        f"- replace: {m['replace_withdrawn']} withdrawn, {m['replace_wrong_keys_left']} wrong "
        f"keys left in the count of {m['questions']}",
        f"- extra cost per stored question: flag ${m['extra_cost_per_question_flag']:.8f} "
        f"(+{m['extra_cost_per_question_flag'] / off:.0%}), replace "
        f"${m['extra_cost_per_question_replace']:.8f} "
        f"(+{m['extra_cost_per_question_replace'] / off:.0%}) over off's ${off:.8f}",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=2000)
    p.add_argument("--wrong-key-rate", type=float, default=0.1)
    p.add_argument("--solver-error-rate", type=float, default=0.01)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        m = measure(Path(tmp), args.questions, args.wrong_key_rate, args.solver_error_rate)
    if args.json:
        print(json.dumps(m, indent=1))
        return
    print("\n".join(table(m) + [""] + summary(m)))


if __name__ == "__main__":
    main()
