"""The commands that need no database start at once: `--help`, `--version` and the mock's
`--help` import neither SQLAlchemy, Celery, httpx nor the settings (0.5 s of imports, against
0.15 s for the whole start). What is imported is checked, not the time, which a loaded
machine would make flaky: `python -X importtime` names every module a run imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "celery", "httpx", "pydantic_settings", "rich", "asyncio")


def _imported(*argv: str, **env_vars: str) -> set[str]:
    """The top-level packages `python -X importtime ARGV` imports; it must exit 0."""
    env = {**os.environ, **env_vars, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert lines, "python -X importtime printed nothing"
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines}


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ("-m", "producer", "--version"),
    ("-m", "producer", "--help"),
    ("-m", "producer", "status", "--help"),
    ("-m", "producer", "enqueue", "--help"),
    ("-m", "producer", "mock-llm", "--help"),
    ("-m", "mockllm", "--help"),
], ids=" ".join)
def test_a_command_that_needs_no_database_imports_none_of_its_libraries(
        argv: tuple[str, ...]) -> None:
    imported = _imported(*argv)
    assert "click" in imported or "argparse" in imported  # the measure sees the parser
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


@pytest.mark.slow
def test_a_command_that_runs_imports_its_implementation(tmp_path: Path) -> None:
    """The counter-check: the measure does see a command's libraries once it runs."""
    imported = _imported("-m", "producer", "migrate",
                         DATABASE_URL=f"sqlite:///{tmp_path / 'examforge.db'}")
    assert {"sqlalchemy", "pydantic_settings", "rich"} <= imported
