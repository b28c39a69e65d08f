"""A mixed chapter (issue 32) whose run is SIGKILLed, then run again: every type's counts
are exact, each item is stored once, each blind solve is booked once and the keys the solver
disputed (under `replace`) are withdrawn and generated again as their own type. A real
`python -m producer run` process is the point: the kill lands between the steps of a
commit or a solve (EXAMFORGE_TEST_VERIFY_CRASH), which no in-process test can do."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import select

from harness import assert_stored_exactly_once, dump
from storage.base import Q

pytestmark = pytest.mark.e2e

TYPES = {"mcq": 2, "multi": 2, "truefalse": 2, "short": 2, "numeric": 2}


@pytest.mark.parametrize("database,step", [("sqlite", "solve_answered"),
                                           ("postgres", "after_commit")])
def test_a_mixed_chapter_killed_mid_run_ends_with_exactly_its_counts(deploy, mock, database,
                                                                     step):
    mock.configure(wrong_key_rates={"short": 0.3, "truefalse": 0.3, "multi": 0.3}, seed=5)
    dep = deploy(database, verify="replace", questions_per_call=5,
                 verify_max_disputed_in_row=50)
    dep.syllabus("vx", {"title": "Mixed", "chapters": [
        {"id": "a", "title": "Mixed", "questions": 10, "types": TYPES}]})
    proc = dep.spawn_cli("run", "vx", EXAMFORGE_TEST_VERIFY_CRASH=step)
    assert proc.wait(timeout=60) == -9, proc.stdout.read().decode() if proc.stdout else ""
    done = dep.cli_in_process("run", "vx", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_stored_exactly_once(dep, "vx", {"a": 10})
    with dep.store.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(Q).where(Q.c.exam == "vx"))]
    numbered = [q for q in rows if q["number"] is not None]
    assert Counter(q["type"] for q in numbered) == TYPES, dump(numbered)
    assert {q["verdict"] for q in numbered} == {"agreed"}, dump(numbered)
    assert all(q["verdict"] == "disputed" for q in rows if q["number"] is None)
    calls = dep.calls("vx")
    used = [c for c in calls if c["kind"] == "solve" and c["outcome"] == "used"]
    assert {q["verify_call_id"] for q in rows} == {c["id"] for c in used}, dump(calls)
