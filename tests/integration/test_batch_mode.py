"""Batch mode (issue 18) against the in-process mock: a round end to end, costs at the
discount, error lines and expiry retried in later rounds, a permanent error failing its
chapter, recovery paging past 100 foreign batches, and a chapter larger than one call."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from examforge.batching import BatchRuntime, PassResult, run_pass
from examforge.syllabus import load_syllabus
from helpers import wait_for, write_syllabus
from storage import open_store
from storage.base import K, Q, S
from storage.models import BatchState, ExamMode


def _setup(make_settings, db_url: str, mock: Any, tmp_path: Path, chapters, **overrides):
    settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                             batch_poll_s=0.2, batch_submit_lease_s=10.0,
                             batch_http_timeout_s=5.0, **overrides)
    store = open_store(settings.database_url)
    path = write_syllabus(settings.exams_dir, "bx", chapters)
    syllabus = load_syllabus(path, max_questions=settings.max_questions_per_chapter)
    store.sync_exam("bx", syllabus, (), slice_questions=settings.slice_questions)
    store.set_exam_mode("bx", ExamMode.batch)
    return settings, store


def _until_done(rt: BatchRuntime, exam: str = "bx", timeout_s: float = 60) -> PassResult:
    total = PassResult()

    def finished() -> bool:
        result = run_pass(rt, [exam])
        for name, value in result.as_dict().items():
            setattr(total, name, getattr(total, name) + value)
        report = rt.store.status(exam)
        return report.finished and not rt.store.live_batches(exam)

    wait_for(finished, timeout_s, "the exam to finish in batch mode", interval_s=0.2)
    return total


def _rows(store, exam: str = "bx"):
    with store.engine.connect() as conn:
        calls = conn.execute(select(K).where(K.c.exam == exam).order_by(K.c.id)).all()
        questions = conn.execute(select(Q).where(Q.c.exam == exam)).all()
        slices = conn.execute(select(S).where(S.c.exam == exam)).all()
    return calls, questions, slices


def _provider_batches(mock) -> list[dict[str, Any]]:
    out, after = [], None
    while True:
        params = {"limit": 100, **({"after": after} if after else {})}
        page = httpx.get(mock.base_url + "/batches", params=params).json()
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["last_id"]


def _custom_ids(mock, batch: dict[str, Any]) -> list[str]:
    content = httpx.get(f"{mock.base_url}/files/{batch['input_file_id']}/content").content
    return [json.loads(line)["custom_id"] for line in content.decode().splitlines() if line]


@pytest.fixture
def rt_of():
    made = []

    def make(settings, store):
        rt = BatchRuntime.build(settings, store)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


def test_a_batch_round_end_to_end_costs_the_discount(make_settings, db_url, mock_llm,
                                                     tmp_path, rt_of):
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 4)],
                             llm_price_prompt_per_mtok=1.0,
                             llm_price_completion_per_mtok=4.0)
    rt = rt_of(settings, store)
    total = _until_done(rt)
    calls, questions, slices = _rows(store)
    assert len(questions) == 9 and {s.state for s in slices} == {"done"}
    assert [c.outcome for c in calls] == ["used", "used"]
    assert all(c.worker.startswith("batch/") for c in calls)
    batches = store.exam_batches("bx")
    assert len(batches) == 1 and batches[0].state == BatchState.done.value
    assert batches[0].provider_status == "completed" and batches[0].request_completed == 2
    assert total.submitted == 1 and total.committed == 9
    # The cost: the usage the mock logged for each batch line, at the price, times 0.5.
    paid = [u for u in mock_llm.usage() if u.get("batch") and u["billed"]]
    assert len(paid) == 2
    by_call = {int(u["custom_id"].split("-")[1]): u for u in paid}
    for call in calls:
        u = by_call[call.id]
        assert (call.prompt_tokens, call.completion_tokens) == (u["prompt_tokens"],
                                                                u["completion_tokens"])
        expected = (u["prompt_tokens"] * 1.0 + u["completion_tokens"] * 4.0) / 1e6 * 0.5
        assert call.cost_usd == pytest.approx(expected)
    usage = batches[0].usage
    assert usage["input_tokens"] == sum(c.prompt_tokens for c in calls)
    assert usage["output_tokens"] == sum(c.completion_tokens for c in calls)
    # Every custom_id names a call of the ledger, in exactly one provider batch.
    ids = [cid for b in _provider_batches(mock_llm) for cid in _custom_ids(mock_llm, b)]
    assert sorted(ids) == sorted(f"call-{c.id}" for c in calls)
