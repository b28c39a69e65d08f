"""Replies used in full and calls sized to them (issue 16, items 7, 11 and 12): a reply cut at
max_tokens keeps its complete questions and is never re-asked at the same size; every usable
question of a reply counts, whatever the call asked for; max_tokens follows the completion
tokens per question this database has seen."""

from __future__ import annotations

import json
import re

import pytest
from fakellm import question, reply
from sqlalchemy import insert, select

from examforge import sizing
from examforge.neardup import is_near, signature
from runner.pipeline import process_chapter
from examforge.settings import MAX_TOKENS_OVERHEAD
from helpers import fake_runtimes
from storage.store import K

_ASKED = re.compile(r"Number of questions: (\d+)")


@pytest.fixture
def env(make_settings):
    with fake_runtimes(make_settings) as build:
        yield build


def asked(request: dict) -> tuple[int, int]:
    """(questions asked, max_tokens) of a request the fake received."""
    n = int(_ASKED.search(request["messages"][-1]["content"]).group(1))  # type: ignore[union-attr]
    return n, request["max_tokens"]


def calls(rt, exam="ex"):
    with rt.store.engine.connect() as conn:
        return conn.execute(select(K).where(K.c.exam == exam).order_by(K.c.id)).all()


def cut_reply(items: list[dict], complete: int, max_tokens: int):
    """A reply cut at max_tokens after `complete` whole objects, mid-way into the next."""
    body = json.dumps({"questions": items}, indent=2)
    closes = [m.end() for m in re.finditer(r"\n    }", body)]
    head = body[:closes[complete - 1] + 40] if complete else body[:60]
    return reply(head, finish_reason="length", completion_tokens=max_tokens)


# --- item 7: truncation ----------------------------------------------------------------------

def test_truncation_a_cut_reply_is_re_asked_smaller(env):
    """The fixed allowance (400 a question) was cut after 3 of 5 questions: the 3 are stored
    with the call, and the next call asks for fewer, never 5 at 2,100 again."""
    rt, fake = env([("a", 10)], llm_max_tokens_sizing="fixed")
    fake.script = [lambda req, n: cut_reply([question(900 + i) for i in range(n)], 3,
                                            json.loads(req.content)["max_tokens"])]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    first, second = asked(fake.requests[0]), asked(fake.requests[1])
    assert first == (5, rt.settings.max_tokens(5))
    assert second[0] < first[0] and second != first
    rows = calls(rt)
    assert rows[0].outcome == "used" and rows[0].questions_stored == 3
    assert "3 complete questions kept" in rows[0].detail
    assert "next calls ask for fewer (at most 3 questions a call, was 5)" in rows[0].detail
    stored = [q["question"] for q in rt.store.questions("ex")]
    assert stored[:3] == [f"[c] Question number {900 + i}?" for i in range(3)]
    assert len(stored) == 10
    # A reply that arrives whole eases the count back: a one-off cut does not shrink the run.
    assert [asked(r)[0] for r in fake.requests] == [5, 3, 4]


def test_truncation_below_the_allowance_is_re_asked_with_more_room(env):
    """A call sized from history (52 tokens a question) that is cut gets twice the room per
    question for the rest of the run; a cut reply with nothing whole is wasted, and its
    detail says how the next call differs."""
    rt, fake = env([("a", 5)])
    _history(rt, [40.0] * sizing.HISTORY_MIN_CALLS)
    fake.script = [lambda req, n: reply('{"questions": [{"question": "Wh', finish_reason="length",
                                        completion_tokens=360)]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    first, second = asked(fake.requests[0]), asked(fake.requests[1])
    assert first == (5, MAX_TOKENS_OVERHEAD + 5 * 52)
    assert second == (5, MAX_TOKENS_OVERHEAD + 5 * 104)  # the same count, more room
    rows = calls(rt)[sizing.HISTORY_MIN_CALLS:]
    assert rows[0].outcome == "wasted" and rows[0].reason == "invalid_output"
    assert rows[0].detail.startswith("truncated: ")
    assert "next calls ask with more room (104 tokens a question, was 52)" in rows[0].detail


def test_after_a_cut_whole_replies_ease_the_room_back(env):
    rt, fake = env([("a", 20)])
    _history(rt, [40.0] * sizing.HISTORY_MIN_CALLS)  # 52 a question
    fake.script = [lambda req, n: reply('{"questions": [', finish_reason="length")]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert [asked(r) for r in fake.requests] == [
        (5, MAX_TOKENS_OVERHEAD + 5 * 52), (5, MAX_TOKENS_OVERHEAD + 5 * 104),
        (5, MAX_TOKENS_OVERHEAD + 5 * 52), (5, MAX_TOKENS_OVERHEAD + 5 * 52),
        (5, MAX_TOKENS_OVERHEAD + 5 * 52)]


def test_truncation_never_repeats_a_size_until_the_re_ask_cap(env):
    rt, fake = env([("a", 5)], llm_max_tokens_sizing="fixed", max_reasks=3)
    fake.script = [lambda req, n: reply('{"questions": [', finish_reason="length")] * 10
    assert process_chapter(rt, "ex", "a").outcome == "failed"
    sizes = [asked(r) for r in fake.requests]
    assert len(sizes) == 4 and len(set(sizes)) == 4  # the cap holds; no size twice
    assert [n for n, _ in sizes] == [5, 2, 1, 1]  # fewer, fewer, then more room for one


# --- item 11: every usable question is used --------------------------------------------------

def reworded(text: str) -> str:
    return f"Which of the following is {text}"


def test_extras_a_reply_with_more_than_asked_some_repeats_fills_the_slice_without_a_re_ask(
        env, db_url):
    """The slice lacks one question; the call asks for 1 and gets 5: a near-duplicate of a
    stored question, an exact repeat, then three new ones. The first new one is stored and
    the slice is done with that call (it was wasted and re-asked before)."""
    rt, fake = env([("a", 6)], database_url=db_url, near_dup_scope="chapter")
    assert is_near(signature(reworded(question(1)["question"])),
                   signature(question(1)["question"]))
    fake.script = [
        lambda req, n: reply(json.dumps({"questions": [question(i) for i in range(1, 6)]})),
        lambda req, n: reply(json.dumps({"questions": [
            {**question(1), "question": reworded(question(1)["question"])}, question(2),
            question(10), question(11), question(12)]})),
    ]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert fake.calls == 2 and asked(fake.requests[1])[0] == 1
    stored = [q["question"] for q in rt.store.questions("ex")]
    assert stored == [question(i)["question"] for i in (1, 2, 3, 4, 5, 10)]
    rows = calls(rt)
    assert [r.outcome for r in rows] == ["used", "used"] and rows[1].questions_stored == 1
    assert "1 duplicate rejected" in rows[1].detail
    assert "1 near_duplicate rejected" in rows[1].detail
    assert "2 beyond the target not stored" in rows[1].detail
    assert _status(rt)["usage"]["calls_wasted"] == 0


def _status(rt):
    return rt.store.status("ex").as_dict()


def test_a_model_that_repeats_itself_is_asked_for_a_few_more_near_the_end(env):
    """Two of the ten questions the run has seen were repeats of stored ones: the slice's
    last call, lacking 4, asks for 5 (bounded by QUESTIONS_PER_CALL), and stores 4."""
    rt, fake = env([("a", 12)])
    fake.script = [
        lambda req, n: reply(json.dumps({"questions": [question(i) for i in range(101, 106)]})),
        lambda req, n: reply(json.dumps({"questions": [question(101), question(102)] + [
            question(i) for i in range(106, 109)]})),
    ]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert [asked(r)[0] for r in fake.requests] == [5, 5, 5]
    assert len(rt.store.questions("ex")) == 12 and fake.calls == 3
    assert "1 beyond the target not stored" in calls(rt)[-1].detail


# --- item 12: max_tokens from history --------------------------------------------------------

def _history(rt, per_question: list[float], exam="ex", model=None, requested=5):
    """Used calls with real usage, as earlier runs would have left them."""
    model = model or rt.client.model
    with rt.store.engine.begin() as conn:
        conn.execute(insert(K), [{
            "exam": exam, "chapter_id": "old", "slice_no": 0, "attempt": 1, "first_number": 1,
            "requested": requested, "worker": "w", "outcome": "used",
            "completion_tokens": round(p * requested), "prompt_tokens": 100,
            "questions_stored": requested, "model": model, "max_tokens": 2100,
            "started_at": 0.0, "finished_at": 1.0} for p in per_question])


def test_max_tokens_without_history_is_the_documented_allowance(env):
    rt, fake = env([("a", 10)])
    _history(rt, [40.0] * (sizing.HISTORY_MIN_CALLS - 1))  # one call short of history
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert {asked(r)[1] for r in fake.requests} == {MAX_TOKENS_OVERHEAD + 5 * 400}


@pytest.mark.parametrize(("history", "per_question"), [
    ([40.0] * 19 + [300.0], 52),        # p95 (nearest rank) of 20 is the 19th: 40 x 1.3
    ([40.0] * 18 + [300.0] * 2, 390),   # the two long replies are the top 10 %: 300 x 1.3
    ([10.0] * 30, 50),                  # the floor
    ([1000.0] * 30, 400),               # never above the documented allowance
])
def test_max_tokens_with_history_is_its_p95_with_margin_and_floor(env, history, per_question):
    rt, fake = env([("a", 10)])
    _history(rt, history)
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert [asked(r)[1] for r in fake.requests] == [MAX_TOKENS_OVERHEAD + 5 * per_question] * 2
    assert [r.max_tokens for r in calls(rt)[len(history):]] == [
        MAX_TOKENS_OVERHEAD + 5 * per_question] * 2


def test_max_tokens_uses_the_models_history_until_the_exam_has_its_own(env):
    rt, fake = env([("a", 5)])
    _history(rt, [40.0] * 25, exam="other")
    _history(rt, [40.0] * 25, exam="third", model="another-model")
    _history(rt, [300.0])  # the exam's own: too few yet (and one of the model's 26)
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert asked(fake.requests[0])[1] == MAX_TOKENS_OVERHEAD + 5 * 52


def test_history_is_read_once_per_process_and_exam_not_per_call(env, monkeypatch):
    """And never inside one of the store's transactions (the claim and the commits plan the
    next call): a second connection there could wait on a pool its own transaction holds."""
    rt, fake = env([("a", 40), ("b", 40)], slice_questions=100)
    reads = []
    real = rt.store.completion_history
    monkeypatch.setattr(rt.store, "completion_history",
                        lambda *a, **k: reads.append(rt.store.engine.pool.checkedout())
                        or real(*a, **k))
    for chapter in "ab":
        assert process_chapter(rt, "ex", chapter).outcome == "done"
    assert fake.calls == 16 and reads == [0]  # one read, no connection held meanwhile


def test_the_reservation_ratio_improves_with_history(env):
    """The same chapter run twice: with the fixed allowance each call reserves several times
    what it costs; sized from the first run's calls, much less."""
    prices = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}
    rt, fake = env([("a", 100)], slice_questions=100, llm_max_tokens_sizing="fixed", **prices)
    rt.store.set_budget("ex", 100.0)
    assert process_chapter(rt, "ex", "a").outcome == "done"
    rt2, _ = env([("a", 100), ("b", 100)], slice_questions=100, **prices)
    assert process_chapter(rt2, "ex", "b").outcome == "done"

    def ratio(chapter: str) -> float:
        rows = [r for r in calls(rt2) if r.chapter_id == chapter]
        return sum(r.reserved_usd for r in rows) / sum(r.cost_usd for r in rows)

    # The fake bills 100 prompt and 50 completion tokens a call: 10 a question, so history
    # sizes the floor (50 a question), 350 max_tokens against 2,100.
    assert {r.max_tokens for r in calls(rt2) if r.chapter_id == "b"} == {350}
    assert ratio("a") > 3 * ratio("b")
