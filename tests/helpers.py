"""Helpers shared by test modules: `from helpers import wait_for, write_syllabus`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest


def write_syllabus(exams_dir: Path, slug: str, chapters: list[tuple[str, int]] | dict[str, Any],
                   title: str = "Test exam") -> Path:
    """Write EXAMS_DIR/SLUG/syllabus.json from (id, questions) pairs or a raw object."""
    folder = exams_dir / slug
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(chapters, dict):
        data = chapters
    else:
        data = {"title": title, "chapters": [
            {"id": cid, "title": f"Chapter {cid}", "questions": n} for cid, n in chapters]}
    path = folder / "syllabus.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str,
             interval_s: float = 0.1) -> Any:
    """Poll `predicate` until it is truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
