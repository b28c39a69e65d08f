"""Throughput benchmark: examforge against a plain asyncio + httpx script, in one run.

Every number in the report is a ratio or a per-request cost measured in the same run against
the same in-process mock server, never an absolute-time assertion. See bench/README.md.
`python -m bench` runs this and every other part of the suite; this script runs one workload.

    python bench/throughput.py [--questions 3200] [--chapters 64]
        [--latency-s 0.5] [--questions-per-reply 5] [--concurrency 32]
        [--only baseline,embedded,...] [--curator-python PATH]

Systems (each run once; the code is in bench/systems/):
  baseline      one asyncio + httpx process, semaphore of CONCURRENCY, same requests as
                examforge/llm.py, replies validated by examforge.output.parse_questions, each
                batch appended to a JSONL file ("the seed script done right")
  embedded      `python -m producer run SLUG --concurrency C` on SQLite
  dist-sqlite   one `celery -A tasks worker -P threads -c C` + `producer enqueue`, SQLite
  dist-pg       the same on a fresh PostgreSQL database
  dist-pg-2x    two workers of -c C/2 each, PostgreSQL
  dist-sqlite-2x two workers of -c C/2 each, SQLite
  minimal       a minimal Celery task (completion-row check, one httpx call, one SQLite
                insert), 1 worker -c C; one-call chapters only (chapters of <= QPC questions)
  curator       the peer bespokelabs-curator (bench/curator_peer.py in its own venv), if present
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.measure import (
    BENCH,
    DEFAULT_CURATOR_PYTHON,
    MockProbe,
    Result,
    plan,
)
from bench.report import render_throughput

ALL_SYSTEMS = ("baseline", "embedded", "dist-sqlite", "dist-pg", "dist-pg-2x", "dist-sqlite-2x",
               "curator")
OPTIONAL_SYSTEMS = ("minimal",)


def run_system(system: str, mock: MockProbe, workdir: Path, targets: list[int],
               calls_needed: int, qpc: int, slots: int, curator_python: str) -> Result:
    """One system doing the workload once; a failure is a result with an error, not a raise."""
    from bench.systems.baseline import run_baseline
    from bench.systems.curator import run_curator
    from bench.systems.distributed import ClusterSpec, run_distributed
    from bench.systems.embedded import run_embedded

    try:
        if system == "baseline":
            return run_baseline(mock, workdir, targets, calls_needed, qpc, slots)
        if system == "embedded":
            return run_embedded(mock, workdir, targets, calls_needed, qpc, slots)
        if system == "curator":
            return run_curator(mock, workdir, targets, calls_needed, qpc, slots, curator_python)
        if system == "minimal":
            spec = ClusterSpec(1, slots, "sqlite", qpc, app="minimal")
        else:
            workers = 2 if system.endswith("-2x") else 1
            spec = ClusterSpec(workers, slots // workers,
                               "postgres" if "-pg" in system else "sqlite", qpc)
        return run_distributed(system, mock, workdir, targets, calls_needed, spec)
    except Exception as exc:  # noqa: BLE001 - one failed system must not lose the rest
        return Result(system, system, sum(targets), calls_needed,
                      error=f"{type(exc).__name__}: {exc}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--questions", type=int, default=3200, help="questions per system (total)")
    p.add_argument("--chapters", type=int, default=64)
    p.add_argument("--latency-s", type=float, default=0.5)
    p.add_argument("--questions-per-reply", type=int, default=5,
                   help="mock questions per reply, and QUESTIONS_PER_CALL")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--only", default=",".join(ALL_SYSTEMS),
                   help=f"comma-separated subset of {','.join(ALL_SYSTEMS + OPTIONAL_SYSTEMS)}")
    p.add_argument("--curator-python", default=DEFAULT_CURATOR_PYTHON)
    p.add_argument("--results", default=str(BENCH / "results-throughput.md"))
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(systems) - set(ALL_SYSTEMS + OPTIONAL_SYSTEMS)
    if unknown:
        print(f"unknown systems: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    qpc = args.questions_per_reply
    targets, calls_needed = plan(args.questions, args.chapters, qpc)
    workdir = Path(tempfile.mkdtemp(prefix="efbench-"))
    mock = MockProbe(args.latency_s, qpc)
    results: list[Result] = []
    try:
        for system in systems:
            print(f"[bench] running {system} ...", file=sys.stderr, flush=True)
            r = run_system(system, mock, workdir, targets, calls_needed, qpc,
                           args.concurrency, args.curator_python)
            print(f"[bench] {system}: " + json.dumps(r.to_dict(), default=str), file=sys.stderr,
                  flush=True)
            results.append(r)
    finally:
        mock.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"[bench] scratch kept in {workdir}", file=sys.stderr)
    report = render_throughput(
        results, argv=["python", "bench/throughput.py", *argv],
        started=started.isoformat(timespec="seconds"), total_s=time.monotonic() - t_start,
        latency_s=args.latency_s, questions_per_reply=qpc, questions=args.questions,
        chapters=len(targets), concurrency=args.concurrency)
    print(report)
    Path(args.results).write_text(report)
    (Path(args.results).with_suffix(".json")).write_text(
        json.dumps([r.to_dict() for r in results], indent=1, default=str))
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
