"""Batch mode seen and stopped from the CLI (issue 18, Observability): `status` and
`status --json` list an exam's provider batches while one is in flight, its chapters read as
waiting on it; `cancel` cancels it at the provider (the in-process mock), the lines it
finished are still committed and paid once, the rest booked failed at $0; a cancel that
cannot reach the provider is done by the runner's next poll."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from helpers import wait_for, write_syllabus
from sqlalchemy import select

from producer.views import when
from runner.batching import BatchRuntime, run_pass
from examforge.syllabus import load_syllabus
from storage import open_store
from storage.base import K, Q, S
from storage.models import BatchState, ExamMode

CHAPTERS = [(c, 5) for c in "abcdef"]  # 6 calls of 5 questions: one batch of 6 lines


@pytest.fixture
def batch_exam(make_settings, mock_llm, tmp_path, monkeypatch, db_url):
    """A batch-mode exam `bx` on SQLite and on PostgreSQL, the CLI's environment pointing at
    it and the mock, and a batch runtime to drive passes by hand."""
    settings = make_settings(database_url=db_url, llm_base_url=mock_llm.base_url,
                             batch_poll_s=0.2,
                             batch_submit_lease_s=10.0, batch_http_timeout_s=5.0,
                             llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0)
    store = open_store(settings.database_url)
    path = write_syllabus(settings.exams_dir, "bx", CHAPTERS)
    store.sync_exam("bx", load_syllabus(path, max_questions=settings.max_questions_per_chapter), (),
                   slice_questions=settings.slice_questions)
    store.set_exam_mode("bx", ExamMode.batch)
    for name, value in {"DATABASE_URL": settings.database_url,
                        "LLM_BASE_URL": mock_llm.base_url, "LLM_API_KEY": "sk-test",
                        "EXAMS_DIR": str(settings.exams_dir),
                        "BATCH_HTTP_TIMEOUT_S": "5"}.items():
        monkeypatch.setenv(name, value)
    from examforge.settings import load_settings

    load_settings.cache_clear()
    rt = BatchRuntime.build(settings, store)
    yield settings, store, rt
    rt.close()
    load_settings.cache_clear()


def _cli(capsys, *args: str) -> tuple[int, str]:
    from producer.cli import main

    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def _in_flight(store, rt, mock, done_at_least: int) -> Any:
    """Pass until the exam's one batch is at the provider with some lines done, not all."""
    mock.configure(batch_request_s=0.4)
    run_pass(rt, ["bx"])
    [row] = store.live_batches("bx")
    assert row.state == BatchState.submitted.value and row.provider_batch_id

    def some_done() -> Any:
        run_pass(rt, ["bx"])  # polls: records the provider's counts
        now = store.batch(row.id)
        return now if now.request_completed >= done_at_least else None

    row = wait_for(some_done, 20, f"{done_at_least} lines of the batch done", interval_s=0.1)
    mock.configure(batch_request_s=2.0)  # the batch surely still runs when the test acts
    return row


def _provider(mock, batch_id: str) -> dict[str, Any]:
    return httpx.get(f"{mock.base_url}/batches/{batch_id}").json()


def _until_no_live_batch(store, rt) -> None:
    def settled() -> bool:
        run_pass(rt, ["bx"])
        return not store.live_batches("bx")

    wait_for(settled, 30, "the exam's batches to be booked", interval_s=0.1)


def test_status_shows_a_batch_in_flight_and_cancel_stops_it_keeping_what_it_finished(
        batch_exam, mock_llm, capsys):
    settings, store, rt = batch_exam
    row = _in_flight(store, rt, mock_llm, done_at_least=2)
    assert row.request_completed < 6
    # status: the batch's table, and the chapters waiting on it rather than running.
    code, text = _cli(capsys, "status", "bx")
    assert code == 0
    assert row.provider_batch_id in text and row.id in text and "in_progress" in text
    # The table's columns: requests (total, completed, failed), created and expires.
    header = next(line for line in text.splitlines() if "submission" in line)
    assert all(col in header for col in ("requests", "completed", "failed", "created",
                                         "expires")), text
    assert when(row.created_at)[:10] in text and when(row.expires_at)[:10] in text
    assert "waiting on batch" in text
    assert f"waiting on the provider's batch {row.provider_batch_id} (in_progress" in text
    # status --json carries the batches and each waiting chapter's reason.
    code, text = _cli(capsys, "status", "bx", "--json")
    data = json.loads(text)
    assert data["mode"] == "batch"
    [b] = data["batches"]
    assert b["id"] == row.provider_batch_id and b["submission"] == row.id
    assert b["state"] == "submitted" and b["status"] == "in_progress" and b["live"]
    assert b["requests"]["total"] == 6 and b["requests"]["completed"] >= 2
    assert b["created_at"].endswith("+00:00") and b["expires_at"] > b["created_at"]
    waiting = [c for c in data["chapter_list"] if c["waiting_on"]]
    assert waiting and all(c["batch"] == row.id and c["state"] == "running" for c in waiting)
    # cancel: the slices, and the batch at the provider.
    code, text = _cli(capsys, "cancel", "bx")
    assert code == 0 and f"cancelling 1 provider batch of bx: {row.provider_batch_id}" in text
    assert store.batch(row.id).cancel_requested
    assert _provider(mock_llm, row.provider_batch_id)["status"] in ("cancelling", "cancelled")
    _until_no_live_batch(store, rt)
    assert _provider(mock_llm, row.provider_batch_id)["status"] == "cancelled"
    done = store.batch(row.id)
    assert done.state == BatchState.done.value and done.provider_status == "cancelled"
    with store.engine.connect() as conn:
        calls = conn.execute(select(K).where(K.c.exam == "bx").order_by(K.c.id)).all()
        questions = conn.execute(select(Q).where(Q.c.exam == "bx")).all()
        slices = conn.execute(select(S).where(S.c.exam == "bx")).all()
    used = [c for c in calls if c.outcome == "used"]
    failed = [c for c in calls if c.outcome == "failed"]
    # Every line is booked once: what the provider finished is committed (kept, as a
    # synchronous reply that comes after a cancel is), the cancelled lines failed at $0.
    assert len(calls) == 6 and len(used) + len(failed) == 6
    assert len(used) == done.request_completed >= 2
    assert all(c.reason == "batch_cancelled" and c.cost_usd == 0 for c in failed)
    assert len(questions) == 5 * len(used)
    paid = [u for u in mock_llm.usage() if u.get("batch") and u["billed"]]
    assert sorted(int(u["custom_id"].split("-")[1]) for u in paid) == [c.id for c in used]
    assert sum(c.cost_usd for c in used) == pytest.approx(sum(
        (u["prompt_tokens"] * 1.0 + u["completion_tokens"] * 4.0) / 1e6 * 0.5 for u in paid))
    # No slice is held any more, none is left to do: nothing is submitted again.
    assert all(s.lease_owner is None for s in slices)
    assert {s.state for s in slices} <= {"done", "cancelled"}
    run_pass(rt, ["bx"])
    assert len(store.exam_batches("bx")) == 1
    code, text = _cli(capsys, "status", "bx")
    assert "cancelled" in text and "waiting on" not in text


def test_a_cancel_that_cannot_reach_the_provider_is_done_by_the_next_poll(
        batch_exam, mock_llm, capsys, monkeypatch):
    settings, store, rt = batch_exam
    row = _in_flight(store, rt, mock_llm, done_at_least=1)
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    from examforge.settings import load_settings

    load_settings.cache_clear()
    code, text = _cli(capsys, "cancel", "bx")
    assert code == 0
    assert f"batch {row.provider_batch_id}: " in text and "next pass" in text
    assert store.batch(row.id).cancel_requested
    assert _provider(mock_llm, row.provider_batch_id)["status"] == "in_progress"
    _until_no_live_batch(store, rt)  # the runner's poll sends the cancel
    assert _provider(mock_llm, row.provider_batch_id)["status"] == "cancelled"
    assert store.batch(row.id).provider_status == "cancelled"


def test_a_batch_cancelled_a_moment_before_is_reported_cancelled_not_left_for_later(
        batch_exam, mock_llm, capsys):
    """The provider refuses (409) a cancel of a batch already cancelled: another process
    (a batch runner's poll) sent one first, and this process's row has not seen it yet. The
    cancel reads the batch and says it is cancelled, instead of leaving it for later."""
    settings, store, rt = batch_exam
    row = _in_flight(store, rt, mock_llm, done_at_least=1)
    httpx.post(f"{mock_llm.base_url}/batches/{row.provider_batch_id}/cancel").raise_for_status()
    assert store.batch(row.id).provider_status == "in_progress"
    wait_for(lambda: _provider(mock_llm, row.provider_batch_id)["status"] == "cancelled", 20,
             "the batch cancelled at the provider")
    code, text = _cli(capsys, "cancel", "bx")
    assert code == 0 and f"cancelling 1 provider batch of bx: {row.provider_batch_id}" in text
    assert "next pass" not in text
    _until_no_live_batch(store, rt)
    assert store.batch(row.id).provider_status == "cancelled"


def test_a_cancel_before_the_create_means_no_batch_is_created(batch_exam, mock_llm, capsys):
    """`cancel` while a submission is between its upload and its create (no provider batch
    id yet): the mark stops the create; the submission is abandoned, its calls booked not
    sent at $0, and nothing reaches the provider's batch list."""
    settings, store, rt = batch_exam
    upload = rt.api.upload

    def upload_then_cancel(filename: str, content: bytes) -> str:
        file_id = upload(filename, content)
        code, text = _cli(capsys, "cancel", "bx")  # another process's cancel, right now
        assert code == 0 and "not at the provider yet" in text
        return file_id

    rt.api.upload = upload_then_cancel  # type: ignore[method-assign]
    run_pass(rt, ["bx"])
    assert httpx.get(f"{mock_llm.base_url}/batches").json()["data"] == []
    [row] = store.exam_batches("bx")
    assert row.state == BatchState.abandoned.value and "cancelled" in (row.detail or "")
    with store.engine.connect() as conn:
        calls = conn.execute(select(K).where(K.c.exam == "bx")).all()
        slices = conn.execute(select(S).where(S.c.exam == "bx")).all()
    assert len(calls) == 6 and all(c.outcome == "failed" and c.cost_usd == 0 for c in calls)
    assert {s.state for s in slices} == {"cancelled"} and all(
        s.lease_owner is None for s in slices)
    run_pass(rt, ["bx"])  # nothing to submit: the chapters are cancelled
    assert len(store.exam_batches("bx")) == 1
