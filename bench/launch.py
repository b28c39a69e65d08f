"""Launch to exit of the commands that only read (issue 28): `status`, `exams`, `review` and
`export` of a small exam (100 questions in 8 chapters, seeded with bench.seed) on a SQLite
database, against `--version`, which opens nothing.

    python bench/launch.py                                # writes bench/results-launch.md
    python bench/launch.py --before /tmp/main-checkout    # the same commands of another
                                                          # checkout, in the same rounds

Each command runs `--runs` times (default 5) in rounds, every command once per round in
turn, so that a burst of someone else's load falls on all of them alike; the figure is the
median. One untimed round first writes the bytecode caches (PYTHONDONTWRITEBYTECODE is
dropped, as a deployment has its .pyc files). `--before DIR` runs `python -m producer` from
DIR (its code first on sys.path) with this interpreter, so both sides share the installed
libraries; the database is seeded by this checkout's code (both must read its schema).

`--instructions` also counts the instructions of one launch of each command under valgrind
(callgrind): a figure the machine's load does not move, where seconds on a shared 2-core
machine move by 2x from one minute to the next (about a minute per launch).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/launch.py` puts bench/ first, not the root
    sys.path.insert(0, str(ROOT))
from bench.measure import child_pythonpath  # noqa: E402

SLUG = "small"
QUESTIONS, CHAPTERS = 100, 8
DEFAULT_RESULTS = ROOT / "bench" / "results-launch.md"


def commands(out_dir: Path) -> dict[str, list[str]]:
    """The measured commands, by the name the table gives them."""
    return {
        "--version": ["--version"],
        f"status {SLUG}": ["status", SLUG],
        "exams": ["exams"],
        f"review {SLUG}": ["review", SLUG],
        f"export {SLUG}": ["export", SLUG, "-o", str(out_dir / f"{SLUG}.jsonl")],
    }


def launch(root: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of `python -m producer ARGV` run from `root`, launch to exit."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "producer", *argv], cwd=root,
                            env={**env, "PYTHONPATH": child_pythonpath(root)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{root}: python -m producer {' '.join(argv)}: exit "
                           f"{proc.returncode}: {err[-800:]}")
    return wall, usage.ru_utime + usage.ru_stime


def instructions(root: Path, argv: list[str], env: dict[str, str]) -> float:
    """Millions of instructions one launch of `python -m producer ARGV` executes (callgrind)."""
    result = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-m", "producer", *argv], cwd=root, env={**env, "PYTHONPATH": child_pythonpath(root)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind {' '.join(argv)}: exit {result.returncode}: "
                           f"{result.stderr[-800:]}")
    return int(found.group(1)) / 1e6


def measure(sides: dict[str, Path], runs: int, workdir: Path, count: bool = False
            ) -> tuple[dict[tuple[str, str], list[tuple[float, float]]],
                       dict[tuple[str, str], float]]:
    from bench.seed import seed_exam

    db = workdir / "examforge.db"
    seed_exam(f"sqlite:///{db}", SLUG, QUESTIONS, CHAPTERS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(DATABASE_URL=f"sqlite:///{db}", EXAMS_DIR=str(workdir / "exams"))
    cmds = commands(workdir)
    got: dict[tuple[str, str], list[tuple[float, float]]] = {
        (side, name): [] for side in sides for name in cmds}
    for timed in [False] + [True] * runs:  # the first round writes the bytecode caches
        for name, argv in cmds.items():
            for side, root in sides.items():
                result = launch(root, argv, env)
                if timed:
                    got[(side, name)].append(result)
    counted = {(side, name): instructions(root, argv, env)
               for name, argv in cmds.items() for side, root in sides.items()} if count else {}
    return got, counted


def report(sides: dict[str, Path], runs: int,
           got: dict[tuple[str, str], list[tuple[float, float]]],
           counted: dict[tuple[str, str], float], argv: list[str]) -> str:
    names = list(commands(Path(".")))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# Launch to exit of the read commands",
        "",
        f"`{' '.join(['python', 'bench/launch.py', *map(shlex.quote, argv)])}`, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} cores ({platform.machine()}), Python {platform.python_version()}, "
        f"load average {load} at the end (the machine is shared: compare the columns of one "
        "run, not absolute seconds across runs).",
        "",
        f"An empty SQLite database but for one finished exam of {QUESTIONS} questions in "
        f"{CHAPTERS} chapters (bench.seed). Median of {runs} launches of each command, "
        "launch to exit, in rounds (each round runs every command once); CPU is user + "
        "system of the same launches. Issue 28's target: at most 0.5 s for status, exams, "
        "review and export."
        + (" M instructions: one launch of each under valgrind (callgrind), which the "
           "machine's load does not move." if counted else ""),
        "",
    ]
    head = ["command"]
    for side in sides:
        head += [f"{side}: s", f"{side}: CPU s", f"{side}: × --version"]
        if counted:
            head += [f"{side}: M instructions", f"{side}: instr. × --version"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        row = [f"`{name}`"]
        for side in sides:
            walls = [w for w, _ in got[(side, name)]]
            cpus = [c for _, c in got[(side, name)]]
            base = statistics.median(w for w, _ in got[(side, "--version")])
            row += [f"{statistics.median(walls):.2f}", f"{statistics.median(cpus):.2f}",
                    f"{statistics.median(walls) / base:.1f}"]
            if counted:
                row += [f"{counted[(side, name)]:,.0f}",
                        f"{counted[(side, name)] / counted[(side, '--version')]:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Every launch, s: " + "; ".join(
        f"{side} `{name}` " + " ".join(f"{w:.2f}" for w, _ in got[(side, name)])
        for side in sides for name in names) + ".", ""]
    for side, root in sides.items():
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        lines.append(f"- {side}: commit {commit}{' with local changes' if dirty else ''}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/launch.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed launches of each command")
    p.add_argument("--before", type=Path, default=None, metavar="DIR",
                   help="another checkout measured in the same rounds (the 'before' column)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--instructions", action="store_true",
                   help="also count each command's instructions under valgrind (one launch)")
    args = p.parse_args(argv)
    sides = {"this": ROOT} if args.before is None else {"before": args.before.resolve(),
                                                        "after": ROOT}
    with tempfile.TemporaryDirectory(prefix="ef-launch-") as tmp:
        got, counted = measure(sides, args.runs, Path(tmp), args.instructions)
    text = report(sides, args.runs, got, counted, sys.argv[1:] if argv is None else argv)
    args.results.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
