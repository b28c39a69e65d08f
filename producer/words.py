"""Words the command line prints (imported by every command: nothing heavy here)."""

from __future__ import annotations

from datetime import datetime, timezone


def plural(n: int, noun: str, many: str | None = None) -> str:
    """"1 exam", "2 exams"; `many` for a noun whose plural is not a plain s ("batches"). By
    hand: no installed library pluralises nouns, and the CLI counts a handful."""
    return f"{n} {noun}" if n == 1 else f"{n} {many or noun + 's'}"


def when(epoch: float | None) -> str | None:
    """An epoch on the database's clock as ISO 8601 UTC, to the second."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def duration(seconds: float | None) -> str:
    """1h02m, 3m05s, 42s."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
