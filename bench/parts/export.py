"""`python -m producer export` of 100,000 questions (JSONL, JSON, CSV) against a bare
sqlite3 + json.dumps loop, and its peak RSS at 100,000 against 100 questions (issue 8, row 7).

The exams are seeded straight into one SQLite database (bench.seed). Every command is timed
from process launch to exit and its peak RSS read from the kernel (rusage); each is run
`REPEATS` times and the fastest kept (the machine is shared). The "net" ratio subtracts each
command's time at 100 questions (interpreter start-up and imports) from its time at 100,000."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

from bench.measure import ROOT, wait_child
from bench.report import table
from bench.seed import seed_exam
from bench.suite import Context, Figure, PartResult
from bench.systems.embedded import ef_env

NAME = "export"
TITLE = "export of 100,000 questions against a bare sqlite3 + json.dumps loop; peak RSS"
CHAPTERS = 20
FORMATS = ("jsonl", "json", "csv")


# The "net of start-up" ratio only once the bare loop's own work is at least this long: below
# it (the CI smoke's 5,000 questions) the difference of two start-ups is noise.
NET_MIN_S = 0.5

def bare_main(argv: list[str]) -> int:
    """`python -m bench.parts.export DB SLUG OUT`: the bare loop, one JSON line per question."""
    db, slug, out = argv
    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT q.exam, q.chapter_id, q.number, q.question, q.choices, q.answer_index, "
        "q.explanation, q.model, q.created_at FROM question q JOIN slice c "
        "ON c.exam = q.exam AND c.chapter_id = q.chapter_id AND q.number >= c.first_number "
        "AND q.number < c.first_number + c.target "
        "WHERE q.exam = ? ORDER BY c.position, q.number", (slug,))
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"exam": r[0], "chapter_id": r[1], "number": r[2],
                                "question": r[3], "choices": json.loads(r[4]),
                                "answer_index": r[5], "explanation": r[6], "model": r[7],
                                "created_at": r[8]}, ensure_ascii=False) + "\n" for r in rows)
    return 0


def measure(cmd: list[str], env: dict[str, str], repeats: int) -> tuple[float, float, float]:
    """(fastest wall s, its CPU s, the largest peak RSS in MB) of `repeats` runs of `cmd`."""
    best: tuple[float, float] | None = None
    rss = 0.0
    for _ in range(repeats):
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        usage = wait_child(proc, 600, started=started)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stderr.close()
        if usage.code != 0:
            raise RuntimeError(f"{' '.join(cmd[2:5])} exit {usage.code}: {err[-800:]}")
        if best is None or usage.wall_s < best[0]:
            best = (usage.wall_s, usage.cpu_s)
        rss = max(rss, usage.max_rss_mb)
    assert best is not None
    return best[0], best[1], rss


def seeded(ctx: Context) -> tuple[str, dict[int, str]]:
    """The database with one exam per size (seeded once, shared with the status part)."""
    path = ctx.workdir / "seeded.db"
    sizes = (100, 5_000) if ctx.small else (100, 100_000)
    slugs = {n: f"seed-{n}" for n in sizes}
    if not path.exists():
        for n, slug in slugs.items():
            seed_exam(f"sqlite:///{path}", slug, n, CHAPTERS)
    return f"sqlite:///{path}", slugs


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    repeats = 1 if ctx.small else 2
    t0 = time.monotonic()
    db_url, slugs = seeded(ctx)
    part.details.append(f"Seeded {' and '.join(f'{n:,}' for n in slugs)} questions in "
                        f"{CHAPTERS} chapters each in {time.monotonic() - t0:.1f} s.")
    env = ef_env(ctx.workdir, db_url, ctx.mock.url, 10, "unused", ctx.redis_url)
    db_path = db_url[len("sqlite:///"):]
    small_n, big_n = sorted(slugs)
    got: dict[tuple[str, int], tuple[float, float, float]] = {}
    for n, slug in slugs.items():
        out = ctx.workdir / f"bare-{n}.jsonl"
        got[("bare", n)] = measure([sys.executable, "-m", "bench.parts.export", db_path, slug,
                                    str(out)], env, repeats)
        for fmt in FORMATS:
            path = ctx.workdir / f"export-{n}.{fmt}"
            got[(fmt, n)] = measure([sys.executable, "-m", "producer", "export", slug,
                                     "--format", fmt, "-o", str(path)], env, repeats)
            if fmt == "jsonl":
                with open(path, encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines != n:
                    raise RuntimeError(f"export of {n} questions wrote {lines} lines")
    for (what, n), (wall, cpu, rss) in got.items():
        part.runs.append({"what": what, "questions": n, "wall_s": wall, "cpu_s": cpu,
                          "peak_rss_mb": rss})
    bare_big, bare_small = got[("bare", big_n)], got[("bare", small_n)]
    rows = []
    for fmt in ("bare",) + FORMATS:
        big, small = got[(fmt, big_n)], got[(fmt, small_n)]
        net = (big[0] - small[0]) / max(bare_big[0] - bare_small[0], 1e-9)
        rows.append([fmt if fmt == "bare" else f"`export --format {fmt}`", f"{small[0]:.2f}",
                     f"{big[0]:.2f}", f"{big[1]:.2f}", f"{big[0] / bare_big[0]:.2f}",
                     f"{net:.2f}", f"{small[2]:.0f}", f"{big[2]:.0f}",
                     f"{big[2] / small[2]:.2f}"])
        if fmt == "bare":
            continue
        target = "≤ 1.5x (moonshot ≤ 1.2x)" if fmt == "jsonl" else ""
        part.figures.append(Figure(
            f"export {big_n:,} questions ({fmt}) vs the bare loop, launch to exit", big[0],
            bare_big[0], "bare sqlite3 + json.dumps loop", "s", target,
            target_max=1.5 if fmt == "jsonl" else None))
        if bare_big[0] - bare_small[0] >= NET_MIN_S:
            part.figures.append(Figure(
                f"export {big_n:,} questions ({fmt}) vs the bare loop, net of start-up",
                big[0] - small[0], bare_big[0] - bare_small[0], "bare loop, net", "s", target,
                target_max=1.5 if fmt == "jsonl" else None,
                note="each command's time at 100 questions subtracted"))
        part.figures.append(Figure(
            f"export ({fmt}) peak RSS at {big_n:,} vs {small_n} questions", big[2], small[2],
            f"the same at {small_n}", "MB", "≤ 1.5x (flat)" if fmt == "jsonl" else "",
            target_max=1.5 if fmt == "jsonl" else None))
    part.details += ["", *table(("command", f"s at {small_n}", f"s at {big_n:,}",
                                 f"CPU s at {big_n:,}", "ratio to bare", "net ratio to bare",
                                 f"peak RSS MB at {small_n}", f"peak RSS MB at {big_n:,}",
                                 "RSS ratio"), rows)]
    return part


if __name__ == "__main__":
    raise SystemExit(bare_main(sys.argv[1:]))
