"""Issue 16 in the ledger, on SQLite and PostgreSQL: a billed reply is booked at what it cost.

process_chapter against the scripted fake provider: a 200 with usage whose content cannot be
used is wasted invalid output at that usage and re-asked (never a transient retry); a body cut
after its headers is wasted at its worst case, estimated, and in the exam's spent_usd; list
content is a valid reply."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from fakellm import question, reply
from sqlalchemy import select

from runner.pipeline import Runtime, process_chapter
from examforge.tokens import count_messages, reserve_prompt_tokens
from helpers import fake_runtimes, wait_for
from storage.store import K

PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 2.0}


@pytest.fixture
def env(db_url: str, make_settings: Any) -> Iterator[Any]:
    with fake_runtimes(make_settings, database_url=db_url, **PRICES) as build:
        yield build


def _calls(rt: Runtime) -> list[dict[str, Any]]:
    with rt.store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(K).where(K.c.exam == "ex")
                                                       .order_by(K.c.id))]


def _cost(prompt: int, completion: int) -> float:
    return (prompt * 1.0 + completion * 2.0) / 1e6


def test_an_unusable_200_with_usage_is_wasted_at_its_usage_and_re_asked(env: Any) -> None:
    rt, fake = env([("a", 5)], max_reasks=3)
    broken = lambda req, n: httpx.Response(200, json={  # noqa: E731
        "choices": [{"message": {"content": [42]}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 400, "completion_tokens": 600}})
    fake.script = [broken, broken]
    rt.store.set_budget("ex", 10.0)
    result = process_chapter(rt, "ex", "a")
    # Re-asked within the attempt (not handed back to a transient retry's backoff).
    assert result.outcome == "done", result
    assert fake.calls == 3
    calls = _calls(rt)
    wasted = [c for c in calls if c["outcome"] == "wasted"]
    assert [(c["reason"], c["prompt_tokens"], c["completion_tokens"], c["usage_estimated"])
            for c in wasted] == [("invalid_output", 400, 600, False)] * 2
    assert all(c["cost_usd"] == pytest.approx(_cost(400, 600)) for c in wasted)
    report = rt.store.status("ex").as_dict()
    assert report["spent_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))
    assert report["spent_usd"] >= 2 * _cost(400, 600)
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0


def test_unusable_200s_past_the_re_ask_cap_fail_the_chapter_without_a_transient_retry(
        env: Any) -> None:
    rt, fake = env([("a", 5)], max_reasks=1)
    broken = lambda req, n: httpx.Response(200, json={  # noqa: E731
        "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 10}})
    fake.script = [broken, broken, broken]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "failed" and "invalid output" in result.detail, result
    assert fake.calls == 2  # the call and MAX_REASKS=1 re-ask
    assert [c["outcome"] for c in _calls(rt)] == ["wasted", "wasted"]


class _CutStream(httpx.SyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: len(self.body) // 2]
        raise httpx.RemoteProtocolError("peer closed connection without sending complete "
                                        "message body: received 100 bytes, expected 200")


def test_a_cut_body_is_booked_at_its_worst_case_in_spent_and_retried(env: Any) -> None:
    rt, fake = env([("a", 5)], llm_max_tokens_per_question=100)
    requests: list[Any] = []

    def cut(req: httpx.Request, n: int) -> httpx.Response:
        requests.append(json.loads(req.content))
        full = fake.valid(n).content
        return httpx.Response(200, headers={"content-length": str(len(full))},
                              stream=_CutStream(full))

    fake.script = [cut]
    rt.store.set_budget("ex", 10.0)
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "retry" and "reply_cut" in result.detail, result
    [call] = _calls(rt)
    # Our count of the prompt as sent, with the reservation's margin for a model whose
    # encoding we do not have.
    prompt = reserve_prompt_tokens(rt.client.count_prompt(requests[0]["messages"]),
                                   rt.client.model)
    assert prompt >= count_messages(requests[0]["messages"], rt.client.model)
    max_tokens = rt.settings.max_tokens(5)
    assert (call["outcome"], call["reason"], call["usage_estimated"]) == (
        "wasted", "reply_cut", True)
    assert (call["prompt_tokens"], call["completion_tokens"]) == (prompt, max_tokens)
    assert call["cost_usd"] == pytest.approx(_cost(prompt, max_tokens))
    report = rt.store.status("ex").as_dict()
    assert report["spent_usd"] == pytest.approx(_cost(prompt, max_tokens))  # never $0
    assert report["reserved_usd"] == 0
    assert report["usage"]["calls_estimated"] == 1
    # A transient retry: the chapter comes back after its backoff and finishes.
    wait_for(lambda: process_chapter(rt, "ex", "a").outcome == "done", 10,
             "the chapter to finish after its backoff", interval_s=0.05)
    assert fake.calls == 2


def test_list_content_is_a_valid_reply(env: Any) -> None:
    rt, fake = env([("a", 5)])

    def parts(req: httpx.Request, n: int) -> httpx.Response:
        text = json.dumps({"questions": [question(900 + i) for i in range(n)]})
        body = json.loads(reply(text).content)
        body["choices"][0]["message"]["content"] = [{"type": "text", "text": text[:7]},
                                                    {"type": "text", "text": text[7:]}]
        return httpx.Response(200, json=body)

    fake.script = [parts]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert fake.calls == 1
    [call] = _calls(rt)
    assert call["outcome"] == "used" and call["cost_usd"] == pytest.approx(_cost(100, 50))
    assert len(rt.store.questions("ex")) == 5
