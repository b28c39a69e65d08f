"""Summaries of a py-spy `--format raw` profile (collapsed stacks, one `frame;frame;... count`
line per distinct stack): where the active samples of a worker go.

    python -m bench.profile bench/profile-overhead.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# (label, regex on the stack) in the order shown; a stack counts for every label it matches.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("the chapter task (examforge.pipeline.process_chapter)", r"process_chapter \("),
    ("  store writes (storage: claim, start_call, commit_batch, ...)", r"\(storage/"),
    ("    SQLite COMMIT", r"storage/.*;(do_commit|commit) \("),
    ("    BEGIN IMMEDIATE", r"_on_begin \("),
    ("    SQLAlchemy compile + execute", r"storage/.*(_compile_w_cache|_execute_context) \("),
    ("  the model call (httpx)", r"\(httpx/"),
    ("  reply validation (examforge.output)", r"\(examforge/output\.py"),
    ("  logging", r"\(logging/|\(examforge/logs\.py"),
    ("Celery and kombu outside the task (receive, ack, publish)", r"^(?!.*process_chapter \().*"
                                                                  r"\((celery|kombu)/"),
    ("the lease heartbeat thread", r"\(examforge/heartbeat\.py"),
)


def parse(text: str) -> list[tuple[str, int]]:
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack, int(count)))
    return stacks


def _frame_name(frame: str) -> str:
    # "commit (sqlalchemy/engine/base.py:1234)" -> "commit (sqlalchemy/engine/base.py)"
    return re.sub(r":\d+\)$", ")", frame.strip())


def summarise(text: str, top: int = 12) -> list[str]:
    """Markdown lines: shares of active samples by category, and the top functions by their
    own (leaf) samples."""
    stacks = parse(text)
    total = sum(n for _, n in stacks)
    if not total:
        return ["(no samples)"]
    lines = [f"{total} active samples.", "", "| where | share of active samples |", "|---|---|"]
    for label, pattern in CATEGORIES:
        rx = re.compile(pattern)
        n = sum(count for stack, count in stacks if rx.search(stack))
        depth = (len(label) - len(label.lstrip())) // 2
        lines.append(f"| {'· ' * depth}{label.strip()} | {n / total:.0%} |")
    leaves: Counter[str] = Counter()
    for stack, count in stacks:
        leaves[_frame_name(stack.split(";")[-1])] += count
    lines += ["", "| function (own samples) | share |", "|---|---|"]
    for name, n in leaves.most_common(top):
        lines.append(f"| `{name}` | {n / total:.1%} |")
    return lines


if __name__ == "__main__":
    print("\n".join(summarise(open(sys.argv[1]).read())))
