"""The layers stay one-way: import-linter checks pyproject's contracts (producer -> tasks ->
runner -> storage -> examforge, the mock server apart, no cycle among the siblings of a
package) over the whole import graph, function-local imports included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
    assert "0 broken" in result.stdout
