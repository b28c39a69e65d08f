"""Verification is bounded (issue 27, defect 3), on SQLite and PostgreSQL: under
VERIFY=replace against the mock with its solver always wrong (solver_error_rate 1: every key
disputed), a slice stops after VERIFY_MAX_DISPUTED_IN_ROW disputed keys in a row, its exam
paused with the pause code `disputes` and a reason that says what to check, having spent no
more than the worst case `examforge.estimate.replace_worst_case` states, in calls and in
dollars; with a budget below that, the budget stops it first. `resume` clears the pause, and
the slice counts its disputes afresh."""

from __future__ import annotations

import threading

import httpx
import pytest
from sqlalchemy import select

from examforge.estimate import replace_worst_case
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from storage.base import E, K, Q

PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}
TARGET = 10


@pytest.fixture
def mock():
    with MockServer(MockConfig(latency_s=0, solver_error_rate=1.0, seed=9)) as server:
        yield server


def _setup(make_settings, db_url, mock, budget_usd, slug="ex"):
    from storage import open_store

    settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                             questions_per_call=5, **PRICES)
    store = open_store(settings.database_url)
    path = write_syllabus(settings.exams_dir, slug, [("a", TARGET)])
    store.sync_exam(slug, load_syllabus(path, max_questions=1000), verify="replace",
                    budget_usd=budget_usd)
    return settings, store


def _work(settings, store, slug="ex", deadline_s=30.0):
    """A worker on the slice until it ends (done, or skipped: its exam paused). One that
    never ends (a solver disputing without end) is stopped at the deadline, and fails."""
    from runner.pipeline import Runtime, process_chapter

    rt = Runtime.build(settings, store)
    ended: list = []

    def work() -> None:
        while not rt.stopping.is_set():
            result = process_chapter(rt, slug, "a")
            if result.outcome != "retry":
                ended.append(result)
                return
            rt.stopping.wait(min(result.retry_in_s or 0.0, 0.5))

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(deadline_s)
    try:
        if thread.is_alive():
            rt.stopping.set()
            thread.join(30)
            pytest.fail(f"the slice never stopped in {deadline_s}s: "
                        f"{len(_ledger(store, slug)[0])} calls")
        return ended[0]
    finally:
        rt.close()


def _ledger(store, slug="ex"):
    with store.engine.connect() as conn:
        calls = [dict(r._mapping) for r in conn.execute(
            select(K).where(K.c.exam == slug).order_by(K.c.id))]
        exam = conn.execute(select(E).where(E.c.slug == slug)).one()
        questions = [dict(r._mapping) for r in conn.execute(select(Q).where(Q.c.exam == slug))]
    return calls, exam, questions


def _worst(settings, calls):
    """The stated worst case, for the largest prompts this slice's calls had."""
    gen = max(c["prompt_tokens"] for c in calls if c["kind"] is None)
    solve = max(c["prompt_tokens"] for c in calls if c["kind"] == "solve")
    return replace_worst_case(settings, TARGET, gen, solve)


def _stats(mock):
    return httpx.get(mock.base_url + "/_stats").json()


@pytest.mark.parametrize("budget_usd", [None, 1.0])  # none, and one above the worst case
def test_a_solver_that_disputes_every_key_stops_the_slice_at_its_worst_case(
        make_settings, db_url, mock, budget_usd):
    settings, store = _setup(make_settings, db_url, mock, budget_usd=budget_usd)
    result = _work(settings, store)
    assert result.outcome == "skipped" and "paused" in result.detail, result
    calls, exam, questions = _ledger(store)
    wc = _worst(settings, calls)
    # 20 in a row at 5 a round: 4 generation calls and their 4 solves, then the pause.
    assert (wc.rounds, wc.calls, wc.questions) == (4, 8, 20)
    assert len(calls) == wc.calls and all(c["outcome"] == "used" for c in calls)
    assert _stats(mock)["solves"] == wc.rounds
    assert len(questions) == wc.questions
    assert all(q["withdrawn"] == "disputed" and q["number"] is None for q in questions)
    assert sum(c["cost_usd"] for c in calls) <= wc.usd <= (budget_usd or wc.usd)
    assert all(c["cost_usd"] <= c["reserved_usd"] for c in calls)
    assert exam.state == "paused" and exam.pause_code == "disputes"
    assert exam.pause_reason.startswith("the solver disputed 20 of 20 keys"), \
        exam.pause_reason
    assert "check VERIFY_MODEL" in exam.pause_reason
    # Paused: a worker sends nothing more.
    assert _work(settings, store).outcome == "skipped"
    assert len(_ledger(store)[0]) == wc.calls
    # `resume` clears the pause; the slice counts its disputes afresh (the solver is still
    # always wrong: the same worst case again, then the same pause).
    assert store.resume("ex") == [("a", 0)]
    assert _ledger(store)[1].state == "active"
    _work(settings, store)
    calls, exam, _ = _ledger(store)
    assert len(calls) == 2 * wc.calls and exam.pause_code == "disputes"


def test_with_a_budget_below_the_worst_case_the_budget_stops_it_first(make_settings, db_url,
                                                                      mock):
    # The worst case of this slice, measured on an exam of its own without a budget.
    settings, store = _setup(make_settings, db_url, mock, budget_usd=None)
    _work(settings, store)
    wc = _worst(settings, _ledger(store)[0])
    budget = wc.usd / 4
    settings, store = _setup(make_settings, db_url, mock, budget, slug="eb")
    _work(settings, store, "eb")
    calls, exam, _ = _ledger(store, "eb")
    # A call that does not fit asks for fewer questions (down to one), so a budget may
    # take more, smaller rounds: at most 2 * VERIFY_MAX_DISPUTED_IN_ROW calls, never more
    # dollars than the budget.
    assert exam.state == "paused" and exam.pause_code == "budget", exam.pause_reason
    assert sum(c["cost_usd"] for c in calls) <= budget + 1e-9
    assert 0 < len(calls) <= 2 * settings.verify_max_disputed_in_row
