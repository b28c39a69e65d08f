"""The commands README gives a new user are the ones that work (issue 10)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _commands(prefix: str) -> list[str]:
    """Every `prefix ...` command in README, in code blocks or inline code, joined across the
    line breaks of a wrapped paragraph."""
    text = re.sub(r"\n\s*", " ", README)
    return re.findall(re.escape(prefix) + r"[^`#&|]*", text)


def test_every_worker_command_shows_progress():
    # Celery's default level, WARNING, hides the line per committed batch.
    commands = _commands("celery -A tasks worker")
    assert commands
    for command in commands:
        assert re.search(r"(-l info|--loglevel[ =]INFO)\b", command), command


def test_flower_is_started_the_way_flower_accepts():
    commands = _commands("celery -A tasks flower")
    assert commands
    for command in commands:
        assert "--port=5555" in command and not re.search(r"--port \d", command), command
        assert "--address=127.0.0.1" in command, command
    assert "examforge.reconcile" in README[README.index("**Flower.**"):][:1200]
