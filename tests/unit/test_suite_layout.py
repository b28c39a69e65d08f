"""The suite's own layout: test modules are imported by their base name (rootdir-relative
import mode, no packages), so two files of one name in two tiers stop the whole run at
collection, which a run of one tier alone never shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
