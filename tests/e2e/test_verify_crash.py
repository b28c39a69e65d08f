"""VERIFY with real processes: `producer run` SIGKILLed at each step of a blind solve, then
run again. Whatever the step, no verdict is lost, every question is solved, the mock is paid
for a solve again only when the killed one was already in flight (sent), and every paid call
is in the ledger. The kills use EXAMFORGE_TEST_VERIFY_CRASH (runner.verify.test_hook: the
process SIGKILLs itself at that step)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from harness import assert_stored_exactly_once, dump
from mockllm.questions import true_index
from storage.base import Q

PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}
# The first batch's questions are committed pending; the kill comes at the step named.
STEPS = ["after_commit", "solve_recorded", "solve_answered", "verdicts_committed"]


def _questions(dep):
    with dep.store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(Q).where(Q.c.exam == "vx"))]


def _paid_solves(mock):
    return [u for u in mock.usage() if u["chapter"] == "blind-solve" and u["paid"]]


def _paid_generations(mock):
    return [u for u in mock.usage() if u["chapter"] != "blind-solve" and u["paid"]]


@pytest.mark.parametrize("database,step", [("sqlite", s) for s in STEPS]
                         + [("postgres", "solve_answered")])
def test_a_run_killed_at_a_step_of_a_blind_solve_resumes_exactly_once(deploy, mock, database,
                                                                      step):
    mock.configure(wrong_key_rate=0.3, seed=11)
    dep = deploy(database, verify="replace", budget_usd=5, **PRICES)
    dep.syllabus("vx", [("a", 10)])
    proc = dep.spawn_cli("run", "vx", EXAMFORGE_TEST_VERIFY_CRASH=step)
    assert proc.wait(timeout=60) == -9, proc.stdout.read().decode() if proc.stdout else ""
    calls = dep.calls("vx")
    solves = [c for c in calls if c["kind"] == "solve"]
    pending = [q for q in _questions(dep) if q["verdict"] == "pending"]
    # Where the kill left it.
    if step == "after_commit":
        assert len(pending) == 5 and not solves and not _paid_solves(mock)
    elif step in ("solve_recorded", "solve_answered"):
        assert len(pending) == 5 and [c["outcome"] for c in solves] == ["in_flight"]
        assert len(_paid_solves(mock)) == (1 if step == "solve_answered" else 0)
    else:
        assert not pending and [c["outcome"] for c in solves] == ["used"]
    first_verdicts = {q["id"]: q["verdict"] for q in _questions(dep) if q["verdict"] != "pending"}

    done = dep.cli("run", "vx", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_stored_exactly_once(dep, "vx", {"a": 10})
    questions = _questions(dep)
    calls = dep.calls("vx")
    numbered = [q for q in questions if q["number"] is not None]
    # Every question solved, every stored key right (the solver makes no errors here), and
    # the verdicts booked before the kill kept as they were.
    assert not [q for q in questions if q["verdict"] == "pending"]
    assert all(q["verdict"] == "agreed" and
               q["answer_index"] == true_index(json.loads(q["choices"])) for q in numbered)
    assert all(q["withdrawn"] == "disputed" for q in questions if q["number"] is None)
    assert {i: v for i, v in ((q["id"], q["verdict"]) for q in questions)
            if i in first_verdicts} == first_verdicts
    solves = [c for c in calls if c["kind"] == "solve"]
    used = [c for c in solves if c["outcome"] == "used"]
    lost = [c for c in solves if c["outcome"] != "used"]
    # One solve booked per solved batch; the killed holder's in-flight solve (if any) booked
    # by the takeover at its worst case.
    assert {q["verify_call_id"] for q in questions} == {c["id"] for c in used}, dump(calls)
    assert len(lost) == (1 if step in ("solve_recorded", "solve_answered") else 0), dump(calls)
    assert all(c["reason"] == "crash_before_commit" and c["cost_usd"] > 0 for c in lost)
    # Paid at the mock: each booked solve once, plus the one that was in flight when killed
    # (sent and answered, never booked by its holder); a solve recorded but never sent is
    # never paid.
    assert len(_paid_solves(mock)) == len(used) + (1 if step == "solve_answered" else 0), \
        dump(calls)
    generated = [c for c in calls if c["kind"] is None and c["outcome"] == "used"]
    assert len(_paid_generations(mock)) == len(generated), dump(calls)
    exam = dep.status("vx")
    assert exam["questions"] == {"target": 10, "done": 10}
