"""Sharing one provider's rate limit: examforge's workers against curator, on the same mock.

The mock enforces RPM and TPM the way OpenAI does (token buckets, a request charged its prompt
plus its max_tokens at admission, 429 with Retry-After when refused). Each system generates
the same one-call chapters with the same max_tokens, told the same limits:

- examforge: WORKERS worker processes of THREADS threads each (Celery, SQLite, Redis), sharing
  LLM_RPM/LLM_TPM through Redis;
- curator: one process with its in-process limiter (max_requests_per_minute,
  max_tokens_per_minute) and THREADS x WORKERS concurrent requests.

Reported from the mock's own log, for each system: requests refused (429) as a share of all
requests, and the time from the first to the last admitted request against the time the
limits allow for what it sent (requests / RPM or charged tokens / TPM, whichever is longer).

    python bench/ratelimit.py [--rpm 600] [--tpm 60000] [--chapters 120] [--workers 3]
        [--threads 8] [--latency-s 0.5] [--max-tokens-per-question 200] [--only a,b]

Writes bench/results-ratelimit.md and .json. About 5 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from bench.measure import (
    child_pythonpath,
    DEFAULT_CURATOR_PYTHON,
    REDIS_URL,
    DbProbe,
    flush_redis,
    stop_child,
    wait_done,
    wait_workers_ready,
    write_syllabus,
)

QUESTIONS_PER_CALL = 5


def _measure(mock: Any, rpm: int, tpm: int) -> dict[str, Any]:
    """The system's requests as the mock saw them (the mock is reset before each system)."""
    stats = mock.stats()
    usage = [u for u in mock.usage() if u["chapter"] != "unknown"]  # not curator's probe
    refused = [u for u in usage if u["outcome"] == "rate_limited"]
    admitted = [u for u in usage if u["outcome"] != "rate_limited"]
    charged = sum(u["prompt_tokens"] + (u["max_tokens"] or u["completion_tokens"])
                  for u in admitted)
    times = sorted(u["time"] for u in admitted)
    elapsed = times[-1] - times[0] if len(times) > 1 else 0.0
    allowed = max(len(admitted) / (rpm / 60), charged / (tpm / 60))
    return {"requests": len(usage), "admitted": len(admitted), "refused": len(refused),
            "refused_share": len(refused) / len(usage) if usage else 0.0,
            "charged_tokens": charged, "elapsed_s": round(elapsed, 2),
            "allowed_s": round(allowed, 2), "ratio": round(elapsed / allowed, 3) if allowed else None,
            "max_admitted_in_1s": stats["max_admitted_in_1s"],
            "billed_calls": stats["billed_calls"]}


def run_examforge(mock: Any, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    slug = f"rl-{uuid.uuid4().hex[:6]}"
    queue = f"efbench-{uuid.uuid4().hex[:8]}"
    db_url = f"sqlite:///{workdir / (slug + '.db')}"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLM_", "DATABASE_", "BROKER_", "EXAMS_", "TASK_", "QUESTIONS_"))}
    env.update({
        "PYTHONPATH": child_pythonpath(), "DATABASE_URL": db_url, "EXAMS_DIR": str(workdir / "exams"),
        "LLM_BASE_URL": mock.base_url, "QUESTIONS_PER_CALL": str(QUESTIONS_PER_CALL),
        "BROKER_URL": REDIS_URL, "TASK_QUEUE": queue, "WORKER_SOFT_SHUTDOWN_S": "5",
        "LLM_RPM": str(args.rpm), "LLM_TPM": str(args.tpm),
        "LLM_MAX_TOKENS_PER_QUESTION": str(args.max_tokens_per_question),
    })
    write_syllabus(workdir / "exams", slug, [QUESTIONS_PER_CALL] * args.chapters)
    celery = str(Path(sys.executable).with_name("celery"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        flush_redis()
        for i in range(args.workers):
            with open(workdir / f"{slug}-worker{i}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [celery, "-A", "tasks", "worker", "-P", "threads", "-c", str(args.threads),
                     "-n", f"rl{i}-{queue}@%h", "--without-mingle", "--without-gossip"],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_workers_ready(procs)
        time.sleep(1.0)
        mock.reset()
        subprocess.run([sys.executable, "-m", "producer", "enqueue", slug], cwd=ROOT, env=env,
                       check=True, capture_output=True, timeout=120)
        db = DbProbe(db_url)
        wait_done(db, slug, args.chapters, 1800, procs)
        stored = db.questions(slug)
        db.close()
    finally:
        for p in procs:
            stop_child(p)
        flush_redis()
    return {"system": "examforge", "description":
            f"{args.workers} workers × {args.threads} threads, limit shared through Redis",
            "questions_stored": stored, **_measure(mock, args.rpm, args.tpm)}


def run_curator(mock: Any, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from bench.systems.curator import curator_env
    from examforge.settings import MAX_TOKENS_OVERHEAD

    python = args.curator_python
    scratch = workdir / "curator-home"
    env = curator_env(python, scratch)
    if isinstance(env, str):
        return {"system": "curator", "error": env}

    slug = f"cur-{uuid.uuid4().hex[:6]}"
    spec = {"base_url": mock.base_url, "slug": slug,
            "rows": [{"chapter": i, "want": QUESTIONS_PER_CALL} for i in range(args.chapters)],
            "concurrency": args.workers * args.threads, "working_dir": str(scratch / "work"),
            "out": str(workdir / f"{slug}.jsonl"), "rpm": args.rpm, "tpm": args.tpm,
            "max_tokens": MAX_TOKENS_OVERHEAD + QUESTIONS_PER_CALL * args.max_tokens_per_question}
    spec_path = workdir / f"{slug}.json"
    spec_path.write_text(json.dumps(spec))
    mock.reset()
    proc = subprocess.Popen([python, str(BENCH / "curator_peer.py"), str(spec_path)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        stop_child(proc)
        return {"system": "curator", "error": "timed out"}
    (workdir / f"{slug}.stderr").write_bytes(stderr)
    if proc.returncode != 0:
        return {"system": "curator", "error": stderr.decode(errors="replace")[-600:]}
    report = json.loads(stdout.decode().strip().splitlines()[-1])
    return {"system": "curator", "description":
            f"one process, {args.workers * args.threads} concurrent requests, its own "
            f"in-process limiter (curator {report.get('version', '?')})",
            "questions_stored": report["stored"], **_measure(mock, args.rpm, args.tpm)}


def render(results: list[dict[str, Any]], args: argparse.Namespace, argv: list[str]) -> str:
    lines = [
        "# Sharing one rate limit", "",
        f"`python bench/ratelimit.py {' '.join(argv)}`".replace(" `", "`"), "",
        (f"{dt.date.today().isoformat()}, this machine. The mock allows {args.rpm} requests and "
        f"{args.tpm:,} tokens a minute (OpenAI-style buckets, a tenth of a minute's allowance "
        f"at once, prompt + max_tokens charged at admission). {args.chapters} one-call "
        f"chapters of {QUESTIONS_PER_CALL} questions, max_tokens "
        f"{100 + QUESTIONS_PER_CALL * args.max_tokens_per_question}, mock latency "
        f"{args.latency_s} s. 'Allowed' is what the limits allow for what each system sent."), "",
        ("| system | requests | refused (429) | time, first to last admitted | allowed by the "
        "limits | ratio | most admitted in 1 s |"),
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['system']} | error: {r['error'][:200]} | | | | | |")
            continue
        lines.append(
            f"| {r['system']}: {r['description']} | {r['requests']} | {r['refused']} "
            f"({r['refused_share']:.1%}) | {r['elapsed_s']:.1f} s | {r['allowed_s']:.1f} s | "
            f"{r['ratio']:.2f}x | {r['max_admitted_in_1s']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--tpm", type=int, default=60_000)
    parser.add_argument("--chapters", type=int, default=120)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--latency-s", type=float, default=0.5)
    parser.add_argument("--max-tokens-per-question", type=int, default=200)
    parser.add_argument("--only", default="examforge,curator")
    parser.add_argument("--curator-python", default=DEFAULT_CURATOR_PYTHON)
    parser.add_argument("--results", default=str(BENCH / "results-ratelimit.md"))
    args = parser.parse_args(argv)
    from mockllm import MockConfig, MockServer

    mock = MockServer(MockConfig(latency_s=args.latency_s, rpm=args.rpm, tpm=args.tpm))
    mock.start()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="ef-ratelimit-") as tmp:
            for system in args.only.split(","):
                run = {"examforge": run_examforge, "curator": run_curator}[system]
                print(f"running {system}...", file=sys.stderr, flush=True)
                results.append(run(mock, Path(tmp), args))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        mock.stop()
    report = render(results, args, argv)
    Path(args.results).write_text(report)
    Path(args.results).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
