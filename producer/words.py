"""Words the command line prints (imported by every command: nothing heavy here)."""

from __future__ import annotations


def plural(n: int, noun: str) -> str:
    """"1 exam", "2 exams". By hand: every noun the CLI counts (exam, chapter, slice,
    question, call) takes a plain s, and no installed library pluralises nouns."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
