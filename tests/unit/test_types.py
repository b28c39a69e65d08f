"""The type checker is a test: it found a crash (a frozen dataclass written to) that no
scenario test had reached yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mypy_finds_no_errors():
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
