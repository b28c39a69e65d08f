"""Sharing one rate limit (bench/ratelimit.py, run as it is, in its own process): the time
from the first to the last admitted request against the time the limits allow, and the share
refused with 429, for examforge's workers and curator. Not in the default parts (about 5
minutes at full size): `python -m bench --only ratelimit` or add it to `--only`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.measure import ROOT
from bench.suite import Context, Figure, PartResult

NAME = "ratelimit"
TITLE = "one rate limit shared by every worker, against curator (bench/ratelimit.py)"


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    results = ctx.workdir / "ratelimit.md"
    args = ["--results", str(results), "--curator-python", ctx.curator_python]
    if ctx.small:
        args += ["--chapters", "12", "--rpm", "1200", "--tpm", "240000", "--workers", "2",
                 "--threads", "4", "--latency-s", "0.05", "--only", "examforge"]
    elif not ctx.curator():
        args += ["--only", "examforge"]
    run = subprocess.run([sys.executable, "bench/ratelimit.py", *args], check=False, cwd=ROOT,
                         capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "BENCH_REDIS_URL": ctx.redis_url})
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-2000:])
    rows = json.loads(results.with_suffix(".json").read_text())
    part.runs += rows
    part.details += results.read_text().splitlines()[2:]
    for r in rows:
        if r.get("error"):
            part.details.append(f"- {r['system']}: {r['error']}")
            continue
        part.figures.append(Figure(
            f"{r['system']}: first to last admitted request vs the time the limits allow",
            r["elapsed_s"], r["allowed_s"], "allowed by RPM/TPM", "s"))
    return part
