"""The suite's guard on its own speed (tests/speed_guard.py), run on a small suite of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

SUITE = '''
import time
import pytest

def test_quick():
    pass

def test_long_and_unmarked():
    time.sleep(0.6)

@pytest.mark.slow
def test_long_and_marked():
    time.sleep(0.6)
'''


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_small.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: slow\nunmarked_limit_s = 0.3\nsuite_budget_s = 1000\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "speed_guard", "-p", "no:cacheprovider",
         "-q", str(tmp_path), *args], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)}, timeout=120)


@pytest.mark.slow  # each starts a pytest of its own
@pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_an_unmarked_test_over_the_limit_fails_the_run_by_name(tmp_path, args):
    result = _run(tmp_path, *args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "3 passed" in result.stdout
    over = [line for line in result.stdout.splitlines() if "not marked slow" in line]
    assert len(over) == 1 and "test_long_and_unmarked (call) took" in over[0], result.stdout
    assert "suite time: " in result.stdout and "of its budget of 1000 s" in result.stdout


@pytest.mark.slow
def test_a_run_within_the_limit_passes(tmp_path):
    result = _run(tmp_path, "-k", "not unmarked")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not marked slow" not in result.stdout
