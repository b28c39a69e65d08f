"""VERIFY against the real mock server, in process, on SQLite and PostgreSQL: each committed
batch is blind-solved under the slice's lease, the verdicts booked with the solve call;
`flag` keeps disputed questions marked, `replace` withdraws them and generates replacements
up to the target; solve calls are paid calls (ledger rows of kind solve, costs booked,
reservations settled)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sqlalchemy import select

from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from mockllm.questions import true_index
from storage.base import E, K, Q

PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}


@pytest.fixture
def mock():
    with MockServer(MockConfig(latency_s=0, wrong_key_rate=0.25, seed=7)) as server:
        yield server


def _run(make_settings, db_url, mock, chapters, **overrides):
    from runner.pipeline import Runtime, process_chapter
    from storage import open_store

    settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                             **{**PRICES, **overrides})
    store = open_store(settings.database_url)
    path = write_syllabus(settings.exams_dir, "ex", chapters)
    store.sync_exam("ex", load_syllabus(path, max_questions=1000), budget_usd=5.0,
                    default_verify=settings.verify)
    rt = Runtime.build(settings, store)
    try:
        for chapter, _ in chapters:
            deadline = time.monotonic() + 30
            while True:
                result = process_chapter(rt, "ex", chapter)
                if result.outcome == "done":
                    break
                assert result.outcome == "retry", result
                assert time.monotonic() < deadline, f"{chapter} never finished: {result}"
                time.sleep(min(result.retry_in_s or 0.0, 1.0))  # the backoff it asks for
    finally:
        rt.close()
    return store


def _rows(store):
    with store.engine.connect() as conn:
        questions = [dict(r._mapping) for r in conn.execute(select(Q).where(Q.c.exam == "ex"))]
        calls = [dict(r._mapping) for r in conn.execute(
            select(K).where(K.c.exam == "ex").order_by(K.c.id))]
        exam = conn.execute(select(E).where(E.c.slug == "ex")).one()
    return questions, calls, exam


def _stats(mock):
    return httpx.get(mock.base_url + "/_stats").json()


def _truthful(q):
    return q["answer_index"] == true_index(json.loads(q["choices"]))


def test_replace_withdraws_every_wrong_key_and_regenerates_up_to_the_target(
        make_settings, db_url, mock):
    store = _run(make_settings, db_url, mock, [("a", 12), ("b", 7)], verify="replace")
    questions, calls, exam = _rows(store)
    numbered = [q for q in questions if q["number"] is not None]
    withdrawn = [q for q in questions if q["number"] is None]
    # Up to the target, numbers 1..n once each, every key right (the solver makes no errors).
    assert sorted((q["chapter_id"], q["number"]) for q in numbered) == \
        [("a", n) for n in range(1, 13)] + [("b", n) for n in range(1, 8)]
    assert all(q["verdict"] == "agreed" and _truthful(q) for q in numbered)
    # Every wrong key was caught and withdrawn, kept for review with its old number.
    assert withdrawn and all(q["verdict"] == "disputed" and q["withdrawn"] == "disputed"
                             and not _truthful(q) and q["withdrawn_number"] for q in withdrawn)
    assert store.questions_done("ex") == 19 and len(store.questions("ex")) == 19
    # Solve calls are paid calls of their own kind: one per committed batch, each booked.
    solves = [c for c in calls if c["kind"] == "solve"]
    generated = [c for c in calls if c["kind"] is None and c["outcome"] == "used"]
    assert len(solves) == len(generated) and all(c["outcome"] == "used" for c in solves)
    assert all(c["cost_usd"] > 0 and c["reserved_usd"] > 0 and not c["usage_estimated"]
               for c in solves)
    assert {q["verify_call_id"] for q in questions} == {c["id"] for c in solves}
    assert _stats(mock)["solves"] == len(solves)
    # Reservations settled, the exam's totals equal the ledger's.
    assert exam.reserved_usd == pytest.approx(0, abs=1e-12)
    assert exam.spent_usd == pytest.approx(sum(c["cost_usd"] for c in calls))
    status = store.status("ex").as_dict()
    assert status["questions"] == {"target": 19, "done": 19}


def test_flag_keeps_disputed_questions_marked_in_the_count(make_settings, db_url, mock):
    store = _run(make_settings, db_url, mock, [("a", 10)], verify="flag")
    questions, calls, _ = _rows(store)
    assert len(questions) == 10 and all(q["number"] is not None for q in questions)
    assert {q["verdict"] for q in questions} <= {"agreed", "disputed"}
    for q in questions:
        assert (q["verdict"] == "agreed") == _truthful(q)
    assert any(q["verdict"] == "disputed" for q in questions)
    assert len([c for c in calls if c["kind"] == "solve"]) == 2  # two batches of five


def test_off_sends_no_solve(make_settings, db_url, mock):
    store = _run(make_settings, db_url, mock, [("a", 5)])
    questions, calls, _ = _rows(store)
    assert all(q["verdict"] is None for q in questions)
    assert all(c["kind"] is None for c in calls) and _stats(mock)["solves"] == 0


def test_a_failed_or_unreadable_solve_is_booked_and_solved_again(make_settings, db_url, mock):
    # The mock's script for blind solves: an unreadable reply, then a 500, then normal ones.
    mock.configure(script={"blind-solve": ["malformed", "500"]})
    store = _run(make_settings, db_url, mock, [("a", 5)], verify="flag")
    questions, calls, exam = _rows(store)
    solves = [c for c in calls if c["kind"] == "solve"]
    assert [(c["outcome"], c["reason"]) for c in solves] == [
        ("wasted", "invalid_output"), ("failed", "server_error"), ("used", None)]
    assert {q["verify_call_id"] for q in questions} == {solves[-1]["id"]}
    assert all(q["verdict"] in ("agreed", "disputed") for q in questions)
    assert exam.reserved_usd == pytest.approx(0, abs=1e-12)
    assert exam.spent_usd == pytest.approx(sum(c["cost_usd"] for c in calls))


def test_with_sources_each_question_is_solved_with_the_passage_it_cites(
        make_settings, db_url, mock):
    """A chapter with sources: the solve request shows each question the passage it cites
    (once a call, on one line before the questions citing it), and the mock still answers
    truthfully, so the verdicts are right."""
    from examforge.sources import read_material
    from examforge.syllabus import Syllabus
    from runner.pipeline import Runtime, process_chapter
    from storage import open_store

    notes = "\n\n".join(f"## Topic {i}\n\nLine one of topic {i}.\nQuestion 9: not a question "
                        f"but notes.\nA. not a choice either, fact{i}." for i in (1, 2))
    settings = make_settings(database_url=db_url, llm_base_url=mock.base_url, verify="flag",
                             questions_per_call=5, slice_questions=10, **PRICES)
    store = open_store(settings.database_url)
    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 10, "sources": ["n.md"]}]})
    plan = store.sync_exam("ex", syllabus, slice_questions=10, budget_usd=5.0, verify="flag",
                           material={
        "a": read_material(["n.md"], lambda name: notes.encode(), str)})
    rt = Runtime.build(settings, store)
    requests: list[str] = []
    solver = rt.solver()
    real = solver.complete

    def spy(messages, **kw):
        requests.append(messages[1]["content"])
        return real(messages, **kw)
    solver.complete = spy
    try:
        for chapter_id, slice_no in plan.slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
    finally:
        rt.close()
    questions, calls, _ = _rows(store)
    passages = {p.seq: p.text for p in store.chapter_passages("ex", "a")}
    assert len(questions) == 10 and all(q["passage"] in passages for q in questions)
    assert len(requests) == 2 and len(passages) == 2
    material = {" ".join(t.split()) for t in passages.values()}
    prefix = "Material for the questions below: "
    for text in requests:
        lines = text.splitlines()
        shown = [x.removeprefix(prefix) for x in lines if x.startswith(prefix)]
        # Each passage cited in the call shown once, on one line, before its questions.
        assert shown and len(set(shown)) == len(shown) and set(shown) <= material
        current = None
        for line in lines:
            if line.startswith(prefix):
                current = line.removeprefix(prefix)
            elif line.startswith("Question "):
                assert current in material, line
    for q in questions:  # the notes' look-alike lines did not mislead the mock's solver
        assert (q["verdict"] == "agreed") == _truthful(q)
    stats = _stats(mock)
    assert stats["solved_with_passage"] == stats["solved_questions"] == 10
    store.engine.dispose()
