"""The blind solve (examforge.verify) against the mock's wrong keys and truthful solver
(mockllm: wrong_key_rate, solver_error_rate): the mock knows each question's true answer
from its choices, never from the key; the solver sees the choices reordered, no key."""

from __future__ import annotations

import json

import httpx

from examforge import verify
from examforge.errors import OutputInvalid
from mockllm import MockConfig, MockServer
from mockllm.questions import true_index
from mockllm_support import body


def _generate(http: httpx.Client, n: int, chapter: str) -> list[dict]:
    r = http.post("/chat/completions", json=body(n=n, chapter_id=chapter))
    assert r.status_code == 200
    return json.loads(r.json()["choices"][0]["message"]["content"])["questions"]


def _solve(http: httpx.Client, questions: list[dict]) -> tuple[list[int | None], dict]:
    items = [verify.item(q["question"], q["choices"]) for q in questions]
    messages = verify.build_messages(items)
    text = messages[1]["content"]
    # Blind: no key, no explanation.
    assert "answer_index" not in text and all(q["explanation"] not in text for q in questions)
    r = http.post("/chat/completions", json={
        "model": "mock-model", "messages": messages,
        "max_tokens": verify.max_tokens(len(items)), "response_format": {"type": "json_object"}})
    assert r.status_code == 200
    content = r.json()["choices"][0]["message"]["content"]
    return verify.parse_answers(content, items), r.json()["usage"]


def test_wrong_keys_are_drawn_at_their_rate_and_the_truth_comes_from_the_choices():
    with MockServer(MockConfig(latency_s=0, wrong_key_rate=0.2, seed=3)) as mock, \
            httpx.Client(base_url=mock.base_url, timeout=10) as http:
        qs = [q for i in range(20) for q in _generate(http, 10, f"ch-{i}")]
    wrong = sum(q["answer_index"] != true_index(q["choices"]) for q in qs)
    assert all(true_index(q["choices"]) is not None for q in qs)
    assert 0.12 < wrong / len(qs) < 0.28, wrong


def test_a_truthful_solver_catches_every_wrong_key_and_disputes_no_right_one():
    with MockServer(MockConfig(latency_s=0, wrong_key_rate=0.3, seed=1)) as mock, \
            httpx.Client(base_url=mock.base_url, timeout=10) as http:
        qs = [q for i in range(5) for q in _generate(http, 10, f"c{i}")]
        picked, usage = _solve(http, qs[:25])
        picked += _solve(http, qs[25:])[0]
        stats = http.get("/_stats").json()
    assert usage["completion_tokens"] > 0
    for q, pick in zip(qs, picked):
        assert pick == true_index(q["choices"])
    assert stats["solves"] == 2 and stats["solved_questions"] == 50
    assert stats["solver_errors"] == 0


def test_the_solvers_own_errors_are_drawn_at_their_rate_and_repeat_for_a_question():
    with MockServer(MockConfig(latency_s=0, solver_error_rate=0.1, seed=2)) as mock, \
            httpx.Client(base_url=mock.base_url, timeout=10) as http:
        qs = [q for i in range(30) for q in _generate(http, 10, f"x{i}")]
        first = [p for i in range(0, len(qs), 25) for p in _solve(http, qs[i:i + 25])[0]]
        again = [p for i in range(0, len(qs), 25) for p in _solve(http, qs[i:i + 25])[0]]
    errors = sum(p != true_index(q["choices"]) for q, p in zip(qs, first))
    assert 0.05 < errors / len(qs) < 0.15, errors
    assert first == again  # a re-solve (after a crash) asks and gets the same thing


def test_parse_answers_maps_letters_back_and_reads_what_it_can():
    items = [verify.item(f"q{i}?", ["w", "x", "y", "z"]) for i in range(3)]
    letter = {i: "ABCD"[items[i].order.index(2)] for i in range(3)}  # where "y" is shown
    reply = json.dumps({"answers": [{"n": 1, "choice": letter[0]},
                                    {"n": 3, "choice": letter[2].lower()}, {"n": 9, "choice": "A"}]})
    assert verify.parse_answers(reply, items) == [2, None, 2]
    assert verify.parse_answers("```json\n" + reply + "\n```", items) == [2, None, 2]
    for bad in ("", "B", '{"answer": []}'):
        try:
            verify.parse_answers(bad, items)
        except OutputInvalid:
            continue
        raise AssertionError(bad)
