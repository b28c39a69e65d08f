"""Sum a CPU log written with EXAMFORGE_CPU_LOG (tests/speed_guard.py): by file and by test,
and how the run ended: when each pytest-xdist worker ran out of tests, and the tests still
running in the last minutes (the tail that a faster machine would not shorten).

    EXAMFORGE_CPU_LOG=/tmp/cpu.jsonl python -m pytest -n 6 --dist worksteal
    python tests/cpu_report.py /tmp/cpu.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str, top: int = 30) -> None:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += r["cpu_s"]
        f[1] += r["wall_s"]
        f[2] += 1
    total = sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} s CPU, {sum(r['wall_s'] for r in rows):.0f} s wall")
    print("\nby file (CPU s, wall s, tests):")
    for name, (c, w, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:8.1f} {w:8.1f} {n:5d}  {name}")
    print("\nby test (CPU s, wall s):")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")
    if rows and "at" in rows[0]:
        tail(rows)


def tail(rows: list[dict], minutes: float = 2.0) -> None:
    start = min(r["at"] for r in rows)
    end = max(r["at"] + r["wall_s"] for r in rows)
    print(f"\nthe run: {end - start:.0f} s from the first test's start to the last one's end")
    last: dict[str, float] = defaultdict(float)
    for r in rows:
        last[r["worker"]] = max(last[r["worker"]], r["at"] + r["wall_s"] - start)
    print("each worker's last test ended at: " + ", ".join(
        f"{w} {t:.0f} s" for w, t in sorted(last.items(), key=lambda kv: kv[1])))
    print(f"\nrunning in the last {minutes:g} minutes (start s, wall s, worker):")
    for r in sorted(rows, key=lambda r: r["at"]):
        if r["at"] + r["wall_s"] > end - minutes * 60 and r["wall_s"] > 5:
            print(f"{r['at'] - start:8.0f} {r['wall_s']:8.1f}  {r['worker']}  {r['test']}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
