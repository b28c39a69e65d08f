"""Slices: how fast a fixed number of questions is generated as the number of chapters holding
them changes, with one lease per chapter against slices, and how many duplicates each stores.

    python bench/slices.py            # about 3 minutes; writes bench/results-slices.md/.json
    python bench/slices.py --small    # the CI smoke (seconds)

Everything runs the embedded mode (`python -m producer run SLUG -c 32`, SQLite): the same
claim, call and commit code as the workers, with a thread pool instead of a broker, so the
figures measure the unit of work and not Celery. The mock answers in 0.5 s. "One lease" is
SLICE_QUESTIONS larger than any chapter (every chapter one slice, as before slices); "slices"
is the default, 50.

Two parts:
- the sweep: 1,200 questions (10 a call) in 1, 3, 6, 12 and 60 chapters; questions per second
  from launch to the last stored, and its share of what 32 slots allow (32 calls of 10 questions
  every 0.5 s);
- duplicates: 3 chapters of 200, with the mock repeating an earlier question of the chapter word
  for word in 20 % of its replies and paraphrasing one it served in 10 % of its questions.
  Reported: exact duplicates stored (by examforge's own normalisation: must be 0), paraphrases
  stored (the mock knows which questions were paraphrases; examforge catches exact repeats
  only, so these are the near-duplicate rate), and repeats refused at parse or at commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mockllm import MockConfig, MockServer  # noqa: E402
from bench.measure import child_pythonpath  # noqa: E402

ONE_LEASE = 100_000  # a slice larger than any chapter: one lease per chapter
SLICED = 50  # the default SLICE_QUESTIONS


def write_syllabus(exams: Path, slug: str, chapters: list[tuple[str, int]]) -> None:
    folder = exams / slug
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "syllabus.json").write_text(json.dumps({"title": slug, "chapters": [
        {"id": cid, "title": f"Topic {cid}", "questions": n} for cid, n in chapters]}))


def run(mock: MockServer, workdir: Path, chapters: list[tuple[str, int]], slice_questions: int,
        concurrency: int, per_call: int) -> dict[str, Any]:
    """One `producer run` of a fresh exam; what it stored, paid and took."""
    from examforge.output import normalise
    from storage import open_store

    home = Path(tempfile.mkdtemp(dir=workdir))
    write_syllabus(home / "exams", "bench", chapters)
    env = {k: v for k, v in os.environ.items() if not k.startswith(
        ("BROKER_", "DATABASE_", "LLM_", "EXAMS_", "QUESTIONS_", "SLICE_"))}
    db = home / "ef.db"
    env.update({"PYTHONPATH": child_pythonpath(), "DATABASE_URL": f"sqlite:///{db}",
                "LLM_BASE_URL": str(mock.base_url), "LLM_API_KEY": "sk-bench", "LLM_TIMEOUT_S": "30",
                "EXAMS_DIR": str(home / "exams"), "QUESTIONS_PER_CALL": str(per_call),
                "SLICE_QUESTIONS": str(slice_questions), "MAX_REASKS": "6"})
    mock.reset()
    started = time.monotonic()  # the mock's clock starts at its reset, on the same clock
    proc = subprocess.run([sys.executable, "-m", "producer", "run", "bench", "-c",
                           str(concurrency)], cwd=home, env=env, capture_output=True, text=True)
    ended = time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"producer run failed: {proc.stderr[-2000:]}")
    stats = mock.stats()
    # From the first request reaching the mock: start-up (imports, migrations) left out.
    elapsed = ended - started - stats["admitted_at"][0]
    store = open_store(f"sqlite:///{db}")
    rows = store.questions("bench")
    report = store.status("bench")
    store.engine.dispose()
    texts = [(r["chapter_id"], normalise(str(r["question"]))) for r in rows]
    stored_texts = {str(r["question"]) for r in rows}
    paraphrases = [r for r in stats["rewordings"] if r["question"] in stored_texts]
    target = sum(n for _, n in chapters)
    numbers_ok = all(
        sorted(int(str(r["number"])) for r in rows if r["chapter_id"] == cid)
        == list(range(1, n + 1)) for cid, n in chapters)
    return {
        "chapters": len(chapters), "questions": target, "slice_questions": slice_questions,
        "slices": sum(len(c.slices) for c in report.chapter_list),
        "elapsed_s": round(elapsed, 2), "launch_to_stored_s": round(ended - started, 2),
        "questions_per_s": round(target / elapsed, 1),
        "stored": len(rows), "numbers_contiguous": numbers_ok,
        "exact_duplicates_stored": len(texts) - len(set(texts)),
        "paraphrases_stored": len(paraphrases),
        "paid_calls": stats["calls_total"], "calls_used": report.usage.calls_used,
        "calls_wasted": report.usage.calls_wasted,
        "duplicate_replies": stats["outcomes"].get("duplicate", 0),
    }


def sweep(mock: MockServer, workdir: Path, total: int, counts: list[int], concurrency: int,
          per_call: int, latency_s: float) -> list[dict[str, Any]]:
    ideal = concurrency * per_call / latency_s  # questions per second the slots allow
    rows = []
    for n in counts:
        chapters = [(f"c{i:03d}", total // n) for i in range(n)]
        for size, label in ((ONE_LEASE, "one lease"), (SLICED, "slices")):
            row = run(mock, workdir, chapters, size, concurrency, per_call)
            row["mode"] = label
            row["of_ideal"] = round(row["questions_per_s"] / ideal, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def duplicates(mock: MockServer, workdir: Path, chapters: list[tuple[str, int]],
               concurrency: int, per_call: int) -> list[dict[str, Any]]:
    mock.configure(fault_rate=0.2, faults=["duplicate"], reword_rate=0.1, seed=7)
    rows = []
    try:
        for size, label in ((ONE_LEASE, "one lease"), (SLICED, "slices")):
            row = run(mock, workdir, chapters, size, concurrency, per_call)
            row["mode"] = label
            row["paraphrase_rate"] = round(row["paraphrases_stored"] / row["stored"], 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        mock.configure(fault_rate=0.0, reword_rate=0.0)
    return rows


def render(sweep_rows: list[dict[str, Any]], dup_rows: list[dict[str, Any]],
           args: argparse.Namespace) -> str:
    lines = [
        "# Slices", "",
        f"`python bench/slices.py {' '.join(sys.argv[1:])}`".replace(" `", "`"), "",
        f"Embedded mode, {args.concurrency} threads, {args.per_call} questions a call, mock "
        f"latency {args.latency_s} s; ideal = {args.concurrency} slots x {args.per_call} / "
        f"{args.latency_s} s = {args.concurrency * args.per_call / args.latency_s:.0f} "
        "questions/s. Times are from the first request reaching the mock to the last question "
        "stored (start-up, about a second, left out).", "",
        f"## {args.questions} questions in N chapters", "",
        "| chapters | questions each | mode | slices | seconds | questions/s | of ideal | "
        "slices / one lease |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_n: dict[int, dict[str, dict[str, Any]]] = {}
    for r in sweep_rows:
        by_n.setdefault(r["chapters"], {})[r["mode"]] = r
    for n, modes in by_n.items():
        for mode in ("one lease", "slices"):
            r = modes[mode]
            speedup = (f"{modes['one lease']['elapsed_s'] / r['elapsed_s']:.2f}x"
                       if mode == "slices" else "")
            lines.append(f"| {n} | {r['questions'] // n} | {mode} | {r['slices']} | "
                         f"{r['elapsed_s']} | {r['questions_per_s']} | {r['of_ideal']} | "
                         f"{speedup} |")
    lines += [
        "", "## Duplicates", "",
        f"{len(args.dup_chapters)} chapters of {args.dup_chapters[0][1]}; the mock repeats an "
        "earlier question word for word in 20 % of its replies and paraphrases a served one "
        "in 10 % of its questions.", "",
        "| mode | seconds | stored | exact duplicates stored | paraphrases stored (rate) | "
        "replies with a repeat | paid calls | wasted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in dup_rows:
        lines.append(f"| {r['mode']} | {r['elapsed_s']} | {r['stored']} | "
                     f"{r['exact_duplicates_stored']} | {r['paraphrases_stored']} "
                     f"({r['paraphrase_rate']:.1%}) | {r['duplicate_replies']} | "
                     f"{r['paid_calls']} | {r['calls_wasted']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a tiny run for CI")
    parser.add_argument("--latency-s", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--per-call", type=int, default=10)
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results-slices.md")
    args = parser.parse_args(argv)
    if args.small:
        args.questions, counts, args.latency_s = 120, [1, 3], 0.2
        args.dup_chapters = [(f"d{i}", 60) for i in range(2)]
    else:
        args.questions, counts = 1200, [1, 3, 6, 12, 60]
        args.dup_chapters = [(f"d{i}", 200) for i in range(3)]
    mock = MockServer(MockConfig(latency_s=args.latency_s))
    mock.base_url = mock.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            sweep_rows = sweep(mock, Path(tmp), args.questions, counts, args.concurrency,
                               args.per_call, args.latency_s)
            dup_rows = duplicates(mock, Path(tmp), args.dup_chapters, args.concurrency,
                                  args.per_call)
    finally:
        mock.stop()
    text = render(sweep_rows, dup_rows, args)
    args.results.write_text(text)
    args.results.with_suffix(".json").write_text(json.dumps(
        {"sweep": sweep_rows, "duplicates": dup_rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
