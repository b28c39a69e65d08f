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


# Exceptions that never leave the module that raises them: control flow, caught next to it.
_PRIVATE_FLOW = {"examforge.output.ItemInvalid", "examforge.retry.HandBack",
                 "examforge.llm._Unreachable", "examforge.llm._FormatRefused",
                 "examforge.llm._TooLarge",
                 # Raised by item_types.check_answer, caught by its one caller
                 # (examforge.output.check_item), which raises ItemInvalid.
                 "examforge.item_types.TypeInvalid",
                 # Raised by a timer in the PDF extractor's child process, caught next to it.
                 "examforge.pdf_extract._PageTooCostly"}


def test_every_error_is_in_the_one_tree():
    """examforge/errors.py draws the one error tree: an exception class defined anywhere else
    in examforge, storage, runner, tasks or producer is either in it (a subclass of
    ExamforgeError, defined in examforge.errors) or one of the few private ones above."""
    import importlib
    import inspect
    import pkgutil

    from examforge.errors import ExamforgeError

    strays = []
    for root in ("examforge", "storage", "runner", "tasks", "producer"):
        package = importlib.import_module(root)
        names = [root] + [m.name for m in pkgutil.walk_packages(package.__path__, root + ".")
                          if ".migrations" not in m.name and not m.name.endswith("__main__")]
        for name in names:
            module = importlib.import_module(name)
            for cls_name, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ != name or not issubclass(cls, BaseException):
                    continue
                where = f"{name}.{cls_name}"
                if where in _PRIVATE_FLOW:
                    continue
                if name != "examforge.errors" or not issubclass(cls, ExamforgeError):
                    strays.append(where)
    assert strays == []
