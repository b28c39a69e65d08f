"""Summaries of a py-spy `--format raw` profile (collapsed stacks, one `frame;frame;... count`
line per distinct stack): where the active samples of a worker go.

    python -m bench.profile bench/profile-overhead.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# (label, regex) in the order shown; a stack counts for every label it matches. A regex that
# starts with "leaf:" is matched against the innermost frame only.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("the chapter task (tasks.app.generate_chapter)", r"generate_chapter \(tasks/app\.py"),
    ("  the store (storage/)", r"\(storage/"),
    ("    waiting for the process's SQLite writer lock", r"leaf:StoreBase\._write \("),
    ("    claim (lease + first ledger row)", r"Leases\.claim \("),
    ("    commit_batch (questions + next ledger row)", r"Ledger\.commit_batch \("),
    ("    building statements and their cache keys (sqlalchemy/sql)",
     r"\(storage/.*\(sqlalchemy/sql/"),
    ("    executing them (sqlalchemy/engine)", r"\(storage/.*_execute_context \("),
    ("    in the sqlite3 driver (do_execute)", r"\(storage/.*do_execute \("),
    ("    COMMIT (SQLite)", r"\(storage/.*(_connection_commit_impl|do_commit) \("),
    ("    BEGIN IMMEDIATE", r"_on_begin \("),
    ("    the one-round-trip steps (PostgreSQL: storage/fastpath.py, ef_* functions)",
     r"(_claim_fast|_commit_fast|_start_fast|may_send) \("),
    ("    in the psycopg driver, waiting for the server included", r"\(storage/.*\(psycopg/"),
    ("  the model call (httpx, httpcore)", r"\((httpx|httpcore)/"),
    ("  token counting (tiktoken)", r"\(tiktoken/"),
    ("  reply validation (examforge.output)", r"\(examforge/output\.py"),
    ("  logging", r"\(logging/|\(examforge/logs\.py"),
    ("Celery, kombu and redis-py outside the task (receive, ack)",
     r"^(?!.*generate_chapter \().*\((celery|kombu|redis)/"),
    ("idle pool threads waiting for work", r"leaf:_worker \(concurrent/futures/thread\.py"),
    ("the lease heartbeat thread", r"\(runner/heartbeat\.py"),
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
        leaf = pattern.startswith("leaf:")
        rx = re.compile(pattern[5:] if leaf else pattern)
        n = sum(count for stack, count in stacks
                if rx.search(stack.rsplit(";", 1)[-1] if leaf else stack))
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
    with open(sys.argv[1]) as f:
        print("\n".join(summarise(f.read())))
