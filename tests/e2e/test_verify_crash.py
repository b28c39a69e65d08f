"""VERIFY with real processes: `producer run` SIGKILLed at each step of a blind solve, then
resumed by one of the four entry points (`run`, `enqueue` with a worker, `POST /runs` of a
`serve --local`, a reconciler pass with a worker). Whatever the step, no verdict is lost,
every pending verdict is solved exactly once, the mock is paid for a solve again only when
the killed one was already in flight (sent), and every paid call is in the ledger. The kills
use EXAMFORGE_TEST_VERIFY_CRASH (runner.verify.test_hook: the process SIGKILLs itself at
that step).

Each step meets one entry point here (and each entry point one step: a Latin square, not
the 16 pairs): what each entry point does with every state a kill leaves is proved on both
databases at the integration tier (tests/integration/test_pending_verdicts.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select

from apiserver import ApiServer
from harness import assert_stored_exactly_once, dump
from helpers import wait_for
from mockllm.questions import true_index
from storage.base import Q, S

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


def _resume(dep, entry):
    """Go on after the kill through `entry`, until the exam is done."""
    if entry == "run":
        done = dep.cli_in_process("run", "vx", timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    if entry == "enqueue":
        enq = dep.cli_in_process("enqueue", "vx")
        assert enq.returncode == 0, enq.stdout + enq.stderr
        dep.worker(2)
    elif entry == "api":
        server = ApiServer.start(dep, "--local")
        with server.client() as c:
            r = c.post("/exams/vx/runs", headers={"Idempotency-Key": "after-kill"})
            assert r.status_code == 202, r.text
    else:  # a reconciler pass (beat's), with a worker for what it publishes
        dep.worker(2)
        dep.beat()
    report = dep.wait_done("vx", timeout_s=90)
    assert report["chapters"]["done"] == 1, dump(report) + dep.worker_logs()


# Each step once, each entry point at least once; the steps that leave verdicts pending
# meet the three entry points that are not `run`. `verdicts_committed` leaves none pending
# (a never-enqueued slice with nothing owed is the reconciler's to leave alone).
MATRIX = [("sqlite", "after_commit", "reconcile"), ("sqlite", "solve_recorded", "enqueue"),
          ("sqlite", "solve_answered", "api"), ("sqlite", "verdicts_committed", "run"),
          ("postgres", "solve_answered", "reconcile")]


@pytest.mark.parametrize("database,step,entry", MATRIX)
def test_a_run_killed_at_a_step_of_a_blind_solve_resumes_exactly_once(deploy, mock, database,
                                                                      step, entry):
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
    solves_before = mock.stats()["solves"]

    # The entry point's own environment verifies nothing: the exam's policy rules.
    dep.env["VERIFY"] = "off"
    _resume(dep, entry)
    assert_stored_exactly_once(dep, "vx", {"a": 10})
    if entry == "reconcile" and step != "verdicts_committed":
        with dep.store.engine.connect() as conn:
            code = conn.execute(select(S.c.requeue_code).where(S.c.exam == "vx")).scalar()
        assert code == "verdicts_pending"
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
    # Solved exactly once after the kill: one solve per batch booked since (the mock counts
    # every solve it answered).
    booked_before = 1 if step == "verdicts_committed" else 0
    assert mock.stats()["solves"] - solves_before == len(used) - booked_before, dump(calls)
    generated = [c for c in calls if c["kind"] is None and c["outcome"] == "used"]
    assert len(_paid_generations(mock)) == len(generated), dump(calls)
    exam = dep.status("vx")
    assert exam["questions"] == {"target": 10, "done": 10}


def test_a_celery_worker_killed_mid_solve_is_taken_over_and_paid_once_more_at_most(deploy,
                                                                                   mock):
    """The same with real Celery workers and the reconciler, two chapters at once: the worker
    SIGKILLs itself once a solve's reply is in and before its verdicts are booked; another
    worker takes the slices over once their leases lapse and solves what was pending."""
    mock.configure(wrong_key_rate=0.3, seed=5)
    dep = deploy("postgres", verify="replace", budget_usd=5, **PRICES)
    dep.syllabus("vx", [("a", 10), ("b", 10)])
    doomed = dep.worker(2, EXAMFORGE_TEST_VERIFY_CRASH="solve_answered")
    enq = dep.cli_in_process("enqueue", "vx")
    assert enq.returncode == 0, enq.stdout + enq.stderr
    assert doomed.wait(timeout=60) == -9, dep.worker_logs()
    in_flight = [c for c in dep.calls("vx") if c["outcome"] == "in_flight"]
    assert any(c["kind"] == "solve" for c in in_flight), dump(in_flight)
    dep.worker(2)
    dep.beat()
    report = dep.wait_done("vx", timeout_s=90)
    assert report["chapters"]["done"] == 2, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "vx", {"a": 10, "b": 10})
    questions, calls = _questions(dep), dep.calls("vx")
    assert not [q for q in questions if q["verdict"] == "pending"]
    assert all(q["verdict"] == "agreed" and
               q["answer_index"] == true_index(json.loads(q["choices"]))
               for q in questions if q["number"] is not None)
    solves = [c for c in calls if c["kind"] == "solve"]
    used = [c for c in solves if c["outcome"] == "used"]
    lost = [c for c in calls if c["outcome"] == "wasted"]
    # Lost: exactly the calls in flight at the kill, each booked by the takeover.
    assert sorted(c["id"] for c in lost) == sorted(c["id"] for c in in_flight), dump(calls)
    assert all(c["reason"] == "crash_before_commit" for c in lost)
    # Paid at the mock: each booked solve once, plus the lost ones that had been sent (the
    # one whose reply was in at least; the other chapter's may have been recorded only).
    lost_solves = [c for c in lost if c["kind"] == "solve"]
    assert 1 <= len(_paid_solves(mock)) - len(used) <= len(lost_solves), dump(calls)
    assert {q["verify_call_id"] for q in questions} == {c["id"] for c in used}
