"""The reports: markdown tables and JSON, for `bench/throughput.py` and for `python -m bench`."""

from __future__ import annotations

import os
import platform
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from bench.measure import ROOT, Result


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def machine() -> str:
    return (f"nproc={os.cpu_count()}, {platform.platform()}, Python "
            f"{platform.python_version()}")


# ----------------------------------------------------------------------------- throughput.py
THROUGHPUT_COLUMNS = (
    "system", "what", "q/s (first call → all stored)", "ratio to baseline",
    "q/s (launch → all stored)", "ratio to baseline", "CPU ms/request (steady)",
    "CPU ms/request (incl. start-up)", "Redis+PG CPU ms/request", "paid calls at mock / needed",
    "questions stored / target")

THROUGHPUT_LEGEND = (
    "Columns: *first call → all stored* is timed from the first chat request of the run "
    "reaching the mock until the last batch is durable (JSONL line flushed, or every chapter "
    "`done` in the database); *launch → all stored* adds process start-up (imports, "
    "migrations) for the CLI modes and the enqueue for the distributed ones (worker start-up "
    "is excluded: workers are long-lived). *CPU (steady)* is user+sys CPU of the system's "
    "own processes over the first window (from /proc, or process_time inside the baseline "
    "and curator processes); *incl. start-up* also counts interpreter start-up and imports "
    "(and the enqueue CLI). The mock's own CPU is never counted. *Redis+PG CPU* is the CPU "
    "of every redis-server and postgres process on the machine over the window (other "
    "users of those servers would show up here).")


def throughput_rows(results: list[Result], base: Result | None) -> list[list[str]]:
    rows = []
    for r in results:
        if r.error:
            rows.append([r.system, r.description,
                         "error: " + r.error.strip().splitlines()[-1][:120]] + [""] * 8)
            continue
        qw, qe = r.qps("window"), r.qps("e2e")
        bw, be = (base.qps("window"), base.qps("e2e")) if base else (None, None)
        per = 1000 / r.calls_paid if r.calls_paid else None
        cpu_e = r.cpu_e2e_s * per if per and r.cpu_e2e_s is not None else None
        srv = r.server_cpu_s * per if per and r.server_cpu_s is not None else None
        rows.append([
            r.system, r.description, fmt(qw, ".1f"), fmt(qw / bw if qw and bw else None, ".2f"),
            fmt(qe, ".1f"), fmt(qe / be if qe and be else None, ".2f"),
            fmt(r.cpu_ms_per_call(), ".2f"), fmt(cpu_e, ".2f"),
            fmt(srv, ".2f") if srv is not None else "–",
            f"{r.calls_paid} / {r.calls_needed}", f"{r.questions_stored} / {r.questions_target}"])
    return rows


def notes(results: list[Result]) -> list[str]:
    lines = []
    for r in results:
        for note in r.notes:
            lines.append(f"- {r.system}: {note}")
        if r.max_inflight:
            lines.append(f"- {r.system}: max concurrent requests seen by the mock "
                         f"{r.max_inflight}")
    return lines


def render_throughput(results: list[Result], *, argv: list[str], started: str, total_s: float,
                      latency_s: float, questions_per_reply: int, questions: int,
                      chapters: int, concurrency: int) -> str:
    base = next((r for r in results if r.system == "baseline" and not r.error), None)
    ideal_calls_s = concurrency / latency_s if latency_s else None
    ideal_q_s = ideal_calls_s * questions_per_reply if ideal_calls_s else None
    lines = [
        "# examforge throughput benchmark",
        "",
        f"- command: `{' '.join(shlex.quote(a) for a in argv)}` (from {ROOT})",
        f"- date: {started}; total benchmark time {total_s:.0f} s",
        f"- machine: {machine()}",
        (f"- mock: in-process `mockllm`, latency {latency_s} s, "
        f"{questions_per_reply} questions per reply, no faults"),
        (f"- work: {questions} questions in {chapters} chapters, "
        f"QUESTIONS_PER_CALL={questions_per_reply}, concurrency {concurrency} everywhere; "
        f"ideal = {fmt(ideal_q_s, '.0f')} questions/s ({fmt(ideal_calls_s, '.0f')} calls/s)"),
        "- each configuration was run **once**, one after the other, on the same mock",
        "",
        *table(THROUGHPUT_COLUMNS, throughput_rows(results, base)),
        "",
        THROUGHPUT_LEGEND,
        "",
        "Notes:",
        *notes(results),
    ]
    return "\n".join(lines) + "\n"
