"""The baseline: one asyncio + httpx process, a semaphore of `slots`, the same requests as
examforge/llm.py, replies validated by examforge.output.parse_questions, each batch appended
to a JSONL file and flushed. "The seed script done right", with none of the guarantees.

It runs in its own process (`python -m bench.systems.baseline ...`) so that its rusage holds
nothing but the baseline."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from bench.measure import (
    ROOT,
    MockProbe,
    Result,
    chapter_id,
    proc_rss_mb,
    record_child_report,
)


async def _run(base_url: str, slug: str, targets: list[int], qpc: int, slots: int,
               out: TextIO) -> dict[str, Any]:
    import httpx

    from examforge.errors import OutputInvalid
    from examforge.output import parse_questions
    from examforge.prompt import build_messages
    from examforge.syllabus import Chapter

    title = f"Benchmark exam {slug}"
    sem = asyncio.Semaphore(slots)
    stats = {"calls": 0, "invalid": 0, "errors": 0, "stored": 0}
    client = httpx.AsyncClient(
        base_url=base_url.rstrip("/") + "/",
        timeout=httpx.Timeout(60.0, connect=5.0),
        limits=httpx.Limits(max_connections=slots, max_keepalive_connections=slots),
        headers={"Authorization": "Bearer sk-mock"},
    )

    async def chapter(index: int, target: int) -> None:
        spec = Chapter(id=chapter_id(index), title=f"Topic number {index}", questions=target)
        known: set[str] = set()
        avoid: list[str] = []
        stored, failures = 0, 0
        while stored < target:
            want = min(qpc, target - stored)
            body = {"model": "mock-model",
                    "messages": build_messages(slug, title, spec, want, avoid),
                    "temperature": 0.7, "response_format": {"type": "json_object"}}
            async with sem:
                stats["calls"] += 1
                try:
                    response = await client.post("chat/completions", json=body)
                    response.raise_for_status()
                    choice = response.json()["choices"][0]
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    stats["errors"] += 1
                    failures += 1
                    if failures > 8:
                        raise
                    await asyncio.sleep(min(2 ** failures, 30))
                    continue
            try:
                parsed = parse_questions(choice["message"].get("content"),
                                         choice.get("finish_reason"), want, known)
            except OutputInvalid:
                stats["invalid"] += 1
                continue
            lines = []
            for offset, q in enumerate(parsed.questions):
                lines.append(json.dumps({
                    "exam": slug, "chapter_id": spec.id, "number": stored + offset + 1,
                    "question": q.question, "choices": list(q.choices),
                    "answer_index": q.answer_index, "explanation": q.explanation},
                    ensure_ascii=False))
                known.add(" ".join(q.question.lower().split()))
                avoid.append(q.question)
            out.write("\n".join(lines) + "\n")
            out.flush()
            stored += len(parsed.questions)
            stats["stored"] += len(parsed.questions)

    try:
        await asyncio.gather(*(chapter(i, t) for i, t in enumerate(targets)))
    finally:
        await client.aclose()
    return stats


def child_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="the baseline's own process (run by the bench)")
    p.add_argument("--base-url", required=True)
    p.add_argument("--slug", required=True)
    p.add_argument("--targets", required=True, help="JSON list of per-chapter targets")
    p.add_argument("--qpc", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    targets = json.loads(args.targets)
    import httpx  # noqa: F401 - imports are start-up, not steady-state work

    import examforge.output
    import examforge.prompt
    import examforge.syllabus  # noqa: F401
    t0, c0 = time.monotonic(), time.process_time()
    with open(args.out, "a", encoding="utf-8") as out:
        stats = asyncio.run(_run(args.base_url, args.slug, targets, args.qpc, args.slots, out))
    t1, c1 = time.monotonic(), time.process_time()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({**stats, "work_s": t1 - t0, "work_cpu_s": c1 - c0,
                      "total_cpu_s": ru.ru_utime + ru.ru_stime, "done_monotonic": t1,
                      "max_rss_mb": proc_rss_mb(os.getpid())[1]}))
    return 0


def run_baseline(mock: MockProbe, workdir: Path, targets: list[int], calls_needed: int,
                 qpc: int, slots: int) -> Result:
    slug = f"base-{uuid.uuid4().hex[:6]}"
    out = workdir / f"{slug}.jsonl"
    cmd = [sys.executable, "-m", "bench.systems.baseline", "--base-url", mock.url,
           "--slug", slug, "--targets", json.dumps(targets), "--qpc", str(qpc),
           "--slots", str(slots), "--out", str(out)]
    res = Result("baseline", f"asyncio + httpx, 1 process, semaphore {slots}, JSONL",
                 sum(targets), calls_needed, chapters=len(targets), slots=slots,
                 latency_s=mock.latency_s,
                 command="python -m bench.systems.baseline ...")
    mock.arm(slug)
    launched = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=900)
    if proc.returncode != 0:
        res.error = stderr.decode()[-800:]
        return res
    report = record_child_report(res, stdout, launched, mock)
    lines = out.read_text().splitlines()
    keys = {(json.loads(line)["chapter_id"], json.loads(line)["number"]) for line in lines}
    res.questions_stored = len(keys)
    if len(keys) != len(lines):
        res.notes.append(f"{len(lines) - len(keys)} duplicate lines in the JSONL")
    res.calls_paid, res.calls_other = mock.calls_for(slug)
    res.max_inflight = mock.max_inflight()
    if report["invalid"] or report["errors"]:
        res.notes.append(f"{report['invalid']} invalid replies, {report['errors']} errors")
    return res


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))
