"""`python -m bench`: every part of the benchmark suite in one run, each figure a ratio against
its baseline measured in the same run, written to bench/results.md and bench/results.json (and
the plots beside them).

    python -m bench                       # full size, about 12 minutes on 2 cores
    python -m bench --small               # tiny sizes (CI smoke), about 2.5 minutes
    python -m bench --only overhead,export --results /tmp/r.md

Parts (bench/parts/, one module each): see PARTS below and bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import (
    BENCH,
    DEFAULT_CURATOR_PYTHON,
    REDIS_URL,
    ROOT,
    MockProbe,
    Result,
)

# In the order they run. `ratelimit` (bench/ratelimit.py, about 5 minutes) runs only when named.
PARTS = ("overhead", "slots32", "dbcost", "enqueue", "export", "status", "scaling", "threads",
         "prefetch", "shape", "chapters", "modes", "verify", "latency")
OPTIONAL_PARTS = ("ratelimit", "neardup", "history")


@dataclass
class Figure:
    """One figure of the report: a value, its baseline in the same run, and their ratio."""

    what: str
    value: float | None
    baseline: float | None
    baseline_name: str
    unit: str = ""
    target: str = ""  # the target, as text
    target_max: float | None = None  # the ratio must be at most this
    target_min: float | None = None  # ... at least this
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def meets(self) -> bool | None:
        r = self.ratio
        if r is None or (self.target_max is None and self.target_min is None):
            return None
        return ((self.target_max is None or r <= self.target_max)
                and (self.target_min is None or r >= self.target_min))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "meets": self.meets}


@dataclass
class PartResult:
    name: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # Result.to_dict() or measurements
    details: list[str] = field(default_factory=list)  # markdown lines
    error: str | None = None
    seconds: float = 0.0

    def add_run(self, result: Result, **extra: Any) -> Result:
        self.runs.append({**result.to_dict(), **extra})
        return result


@dataclass
class Context:
    """What every part gets: the shared mock, a scratch directory and the sizes."""

    mock: MockProbe
    workdir: Path
    small: bool
    redis_url: str
    curator_python: str
    profile_dir: Path | None
    results_dir: Path

    def latency(self, full_s: float) -> float:
        """The mock latency for a part: the issue's in full runs, a tenth in smoke runs."""
        return full_s if not self.small else round(full_s / 10, 3)

    def curator(self) -> bool:
        return not self.small and Path(self.curator_python).exists()


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def render(parts: list[PartResult], meta: dict[str, Any]) -> str:
    lines = [
        "# examforge benchmark suite",
        "",
        f"- command: `{meta['command']}` (from the repository root)",
        (f"- date: {meta['date']}; total time {meta['total_s']:.0f} s; "
        f"sizes: {'small (CI smoke)' if meta['small'] else 'full'}"),
        f"- machine: {meta['machine']}; shared with other work, so ratios may be noisy",
        ("- every figure is a ratio against a baseline measured in the same run, minutes apart;"
        " each configuration was run once unless a part says otherwise"),
        "",
        "## Summary",
        "",
        "| part | figure | value | baseline | ratio | issue 8 target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in parts:
        if p.error:
            lines.append(f"| {p.name} | error: {p.error.splitlines()[-1][:150]} | | | | | |")
        for f in p.figures:
            met = {True: "yes", False: "**no**", None: "–"}[f.meets]
            lines.append(f"| {p.name} | {f.what} | {fmt(f.value)} {f.unit} | "
                         f"{fmt(f.baseline)} ({f.baseline_name}) | {fmt(f.ratio)} | "
                         f"{f.target or '–'} | {met} |")
    for p in parts:
        lines += ["", f"## {p.name}: {p.title}", "", f"({p.seconds:.0f} s)", ""]
        if p.error:
            lines += ["```", p.error[-2000:], "```", ""]
        lines += p.details
        figure_notes = [f"- {f.what}: {f.note}" for f in p.figures if f.note]
        if figure_notes:
            lines += ["", *figure_notes]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="tiny sizes (CI smoke)")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated parts: {','.join(PARTS + OPTIONAL_PARTS)}")
    p.add_argument("--results", default=str(BENCH / "results.md"),
                   help="markdown report; the JSON and the plots go beside it")
    p.add_argument("--redis-url", default=REDIS_URL,
                   help="Redis db the bench may flush (BENCH_REDIS_URL; never db 0 or 9)")
    p.add_argument("--curator-python", default=DEFAULT_CURATOR_PYTHON)
    p.add_argument("--profile", action="store_true",
                   help="py-spy the examforge worker in the overhead part (bench/profile-*.txt)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(names) - set(PARTS + OPTIONAL_PARTS)
    if unknown:
        print(f"unknown parts: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    from bench import measure

    measure.REDIS_URL = args.redis_url  # the default of every helper that flushes or waits
    results = Path(args.results).resolve()
    results.parent.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now().astimezone()
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="efbench-"))
    mock = MockProbe(0.5, None)  # as many questions per reply as asked
    ctx = Context(mock, workdir, args.small, args.redis_url, args.curator_python,
                  BENCH if args.profile else None, results.parent)
    parts: list[PartResult] = []
    try:
        for name in names:
            module = importlib.import_module(f"bench.parts.{name}")
            print(f"[bench] part {name}: {module.TITLE}", file=sys.stderr, flush=True)
            t_part = time.monotonic()
            try:
                part = module.run(ctx)
            except Exception:  # noqa: BLE001 - one failed part must not lose the others
                part = PartResult(name, module.TITLE, error=traceback.format_exc())
            part.seconds = time.monotonic() - t_part
            parts.append(part)
            for f in part.figures:
                print(f"[bench]   {f.what}: {fmt(f.value)} {f.unit} vs {fmt(f.baseline)} "
                      f"({f.baseline_name}) = {fmt(f.ratio)}", file=sys.stderr, flush=True)
            if part.error:
                print(f"[bench]   error: {part.error}", file=sys.stderr, flush=True)
    finally:
        mock.stop()
        if args.keep:
            print(f"[bench] scratch kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    from bench.report import machine

    meta = {"command": "python -m bench " + " ".join(shlex.quote(a) for a in argv),
            "date": started.isoformat(timespec="seconds"), "total_s": time.monotonic() - t0,
            "small": args.small, "machine": machine(), "root": str(ROOT)}
    plots: list[str] = []
    try:
        from bench.plots import plot_all

        plots = plot_all(parts, results.parent)
    except Exception:  # noqa: BLE001 - a missing matplotlib must not lose the figures
        print("[bench] plots not drawn:\n" + traceback.format_exc(), file=sys.stderr)
    meta["plots"] = plots
    text = render(parts, meta)
    if plots:
        text += "\n## Plots\n\n" + "\n".join(f"![{Path(p).stem}]({Path(p).name})"
                                             for p in plots) + "\n"
    results.write_text(text)
    results.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "parts": {p.name: {"title": p.title, "seconds": p.seconds,
                                          "error": p.error,
                                          "figures": [f.to_dict() for f in p.figures],
                                          "runs": p.runs} for p in parts}},
        indent=1, default=str))
    print(text)
    return 0 if all(p.error is None for p in parts) else 1
