"""Files a README walk-through leaves behind are ignored by git (issue 10)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", [
    "celerybeat-schedule", "celerybeat-schedule.db", "celerybeat-schedule-wal",
    "celerybeat-schedule.dat", "examforge.db", "demo-run/worker.log",
    "exams/cloud-practitioner/generated.jsonl",
])
def test_what_running_the_readme_leaves_behind_is_ignored(path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    result = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT)
    assert result.returncode == 0, f"{path} is not in .gitignore"
