"""Batch mode (issue 18) against the in-process mock: a round end to end, costs at the
discount, error lines and expiry retried in later rounds, a permanent error failing its
chapter, recovery paging past 100 foreign batches, and a chapter larger than one call."""

from __future__ import annotations

from examforge.errors import PauseCode, SliceReason
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from runner.batching import BatchRuntime, PassResult, run_pass
from examforge.syllabus import load_syllabus
from helpers import wait_for, write_syllabus
from storage import open_store
from storage.base import K, Q, S
from storage.models import BatchState, ExamMode
from storage.types import NotClaimedReason


def _setup(make_settings, db_url: str, mock: Any, tmp_path: Path, chapters, **overrides):
    settings = make_settings(**{"database_url": db_url, "llm_base_url": mock.base_url,
                                "batch_poll_s": 0.2, "batch_submit_lease_s": 10.0,
                                "batch_http_timeout_s": 5.0, **overrides})
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


def _paid_batch_lines(mock) -> list[dict[str, Any]]:
    return [u for u in mock.usage() if u.get("batch") and u.get("paid")]


def _each_custom_id_once(mock) -> list[str]:
    ids = [cid for b in _provider_batches(mock) for cid in _custom_ids(mock, b)]
    assert len(ids) == len(set(ids)), "a custom_id was submitted in two batches"
    return ids


def test_an_error_line_is_retried_in_a_later_batch_and_the_finished_kept(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # Chapter a's first line is a 500 error line; b's succeeds in the same batch.
    mock_llm.configure(script={"bx/a": ["500"]})
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 5)],
                             retry_base_s=0.05, retry_max_s=0.2)
    rt = rt_of(settings, store)
    total = _until_done(rt)
    calls, questions, slices = _rows(store)
    assert len(questions) == 10 and {s.state for s in slices} == {"done"}
    failed = [c for c in calls if c.outcome == "failed"]
    assert [(c.chapter_id, c.reason, c.status_code, c.cost_usd) for c in failed] == [
        ("a", "server_error", 500, 0.0)]
    used = [c for c in calls if c.outcome == "used"]
    assert sorted(c.chapter_id for c in used) == ["a", "b"]
    assert total.submitted == 2  # b finished in the first batch, never resubmitted
    ids = _each_custom_id_once(mock_llm)
    assert sorted(ids) == sorted(f"call-{c.id}" for c in calls)
    assert len(_paid_batch_lines(mock_llm)) == len(used) == 2


def test_an_expired_batch_keeps_its_finished_lines_and_retries_the_rest(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # Each line takes 0.3 s and the batch expires 0.55 s after its creation (0.1 s of it
    # validating): one or two of the four lines finish, the others come back batch_expired.
    mock_llm.configure(batch_request_s=0.3, batch_expire_after_s=0.55)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path,
                             [("a", 5), ("b", 5), ("c", 5), ("d", 5)],
                             retry_base_s=0.05, retry_max_s=0.2)
    rt = rt_of(settings, store)
    wait_for(lambda: (run_pass(rt, ["bx"]), store.exam_batches("bx")[-1].state == "done")[1],
             20, "the first batch to expire and be booked")
    batch = store.exam_batches("bx")[-1]  # the oldest (a next round may have started)
    assert batch.provider_status == "expired"
    calls, questions, _ = _rows(store)
    first = [c for c in calls if c.worker == batch.owner]
    finished = [c for c in first if c.outcome == "used"]
    expired = [c for c in first if c.outcome == "failed"]
    assert finished and expired and len(finished) + len(expired) == 4
    assert {c.reason for c in expired} == {"batch_expired"}
    assert all(c.cost_usd == 0 for c in expired)
    mock_llm.configure(batch_request_s=0.01, batch_expire_after_s=None)
    _until_done(rt)
    calls, questions, slices = _rows(store)
    assert len(questions) == 20 and {s.state for s in slices} == {"done"}
    # The finished chapters were never asked again: one used call each, in the first batch.
    used = [c for c in calls if c.outcome == "used"]
    assert len(used) == 4
    assert {c.id for c in finished} <= {c.id for c in used}
    ids = _each_custom_id_once(mock_llm)
    assert sorted(ids) == sorted(f"call-{c.id}" for c in calls)
    assert len(_paid_batch_lines(mock_llm)) == 4


def test_a_permanent_error_line_fails_its_chapter_with_the_reason(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    mock_llm.configure(script={"bx/b": ["400"]})
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 5)])
    rt = rt_of(settings, store)
    _until_done(rt)
    report = store.status("bx")
    states = {c.id: (c.state, c.last_error) for c in report.chapter_list}
    assert states["a"][0] == "done"
    assert states["b"][0] == "failed"
    assert "400" in states["b"][1] and "Invalid request" in states["b"][1]
    assert len(store.exam_batches("bx")) == 1  # not resubmitted


def test_recovery_pages_past_100_newer_batches_to_adopt_its_own(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # The create makes the batch and its reply is lost: the submission stays `creating`.
    mock_llm.configure(batch_create_lost=1)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             batch_submit_lease_s=4.0, batch_http_timeout_s=2.0)
    rt = rt_of(settings, store)
    run_pass(rt, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.creating.value and row.provider_batch_id is None
    assert row.create_attempts == 1
    mock_llm.seed_batches(150)  # another client's, newer: ours is on the second page
    wait_for(lambda: (run_pass(rt, ["bx"]), store.exam_batches("bx")[0].provider_batch_id)[1],
             20, "the recovery to adopt the batch")
    (row,) = store.exam_batches("bx")
    assert row.create_attempts == 1  # adopted, never created again
    ours = [b for b in _provider_batches(mock_llm)
            if (b.get("metadata") or {}).get("examforge_submission") == row.id]
    assert [b["id"] for b in ours] == [row.provider_batch_id]
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert len(questions) == 5 and [c.outcome for c in calls] == ["used"]
    assert len(_paid_batch_lines(mock_llm)) == 1


def test_an_upload_that_fails_sends_nothing_and_a_later_round_does(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    mock_llm.configure(batch_upload_fail=1)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             retry_base_s=0.05)
    rt = rt_of(settings, store)
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert [(c.outcome, c.cost_usd) for c in calls] == [("failed", 0.0), ("used", calls[1].cost_usd)]
    assert "upload failed" in calls[0].detail
    assert [b.state for b in store.exam_batches("bx")] == ["done", "abandoned"]
    assert len(questions) == 5 and len(_paid_batch_lines(mock_llm)) == 1


def test_the_reconciler_and_sync_workers_leave_a_submitted_batch_alone(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    from runner.pipeline import Runtime, process_chapter

    # The batch stays validating for a while: its slices and calls are held by it.
    mock_llm.configure(batch_validation_s=30)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             budget_usd=1.0)
    rt = rt_of(settings, store)
    run_pass(rt, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == "submitted"
    store.mark_enqueued("bx", [("a", 0)], "old-epoch")  # as if it had been sync once
    assert store.settle_orphans() == 0 and store.settle_cancelled() == 0
    assert store.fail_capped(1) == 0 and store.pause_spent() == []
    assert store.orphans(grace_s=0, epoch="new-epoch") == []
    assert store.lost_messages(min_age_s=0, queued=0, unacked=[]).lost == []
    calls, _, slices = _rows(store)
    assert [c.outcome for c in calls] == ["in_flight"] and slices[0].lease_owner == row.owner
    sync = Runtime.build(settings, store)
    try:
        result = process_chapter(sync, "bx", "a")
    finally:
        sync.close()
    assert result.outcome == "skipped" and result.not_claimed is NotClaimedReason.busy
    assert "held by batch/" in result.detail  # as people read it
    assert len(_rows(store)[0]) == 1  # no sync call was made


_REJECTED = __import__("re").compile(r"(\d+) (?:duplicate|near_duplicate) rejected")


def duplicate_rate(calls) -> tuple[int, int, float]:
    """(repeats, questions received, repeats / received) over an exam's calls: the
    questions the ledger notes as rejected repeats (exact or near-duplicates, at parse or at
    commit), against those plus the stored ones."""
    repeats = stored = 0
    for call in calls:
        stored += call.questions_stored
        found = [int(n) for n in _REJECTED.findall(call.detail or "")]
        if found:
            repeats += sum(found)
        elif (call.detail or "").startswith("every question was one the chapter already had"):
            repeats += call.requested
    received = repeats + stored
    return repeats, received, repeats / received if received else 0.0


def test_a_chapter_larger_than_one_call_reaches_its_target_in_rounds(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    """Rounds + numbered steering: the first round asks ceil(60/10) calls at once, each for
    its own numbers; what near-duplicate rejections leave missing is topped up by the next
    rounds. The duplicate rate is measured against sync mode on the same mock."""
    from runner.pipeline import Runtime, process_chapter

    mock_llm.configure(reword_rate=0.3, seed=7)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 60)],
                             questions_per_call=10, retry_base_s=0.05,
                             llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0)
    rt = rt_of(settings, store)
    _until_done(rt)
    calls, questions, slices = _rows(store)
    assert len(questions) == 60 and sorted(q.number for q in questions) == list(range(1, 61))
    assert slices[0].state == "done"
    first_round = [c for c in calls if c.worker == store.exam_batches("bx")[-1].owner]
    assert len(first_round) == 6
    assert [(c.first_number, c.requested) for c in first_round] == [
        (n, 10) for n in range(1, 61, 10)]
    batch_rate = duplicate_rate(calls)
    # The same chapter, synchronously (each prompt lists what the calls before it stored).
    write_syllabus(settings.exams_dir, "sx", [("a", 60)])
    syllabus = load_syllabus(settings.exams_dir / "sx" / "syllabus.json",
                             max_questions=settings.max_questions_per_chapter)
    store.sync_exam("sx", syllabus, (), slice_questions=settings.slice_questions)
    sync = Runtime.build(settings, store)
    try:
        for slice_no in (0, 1):  # SLICE_QUESTIONS=50: two slices, as in batch mode
            wait_for(lambda: process_chapter(sync, "sx", "a", slice_no).outcome == "done", 60,
                     "the sync chapter")
    finally:
        sync.close()
    sync_calls, sync_questions, _ = _rows(store, "sx")
    assert len(sync_questions) == 60
    sync_rate = duplicate_rate(sync_calls)
    print(f"\nduplicate rate, 60 questions, reword_rate 0.3 [{db_url.split(':')[0]}]: "
          f"batch {batch_rate[0]}/{batch_rate[1]} = {batch_rate[2]:.1%} in "
          f"{len(store.exam_batches('bx'))} rounds, {len(calls)} calls; sync "
          f"{sync_rate[0]}/{sync_rate[1]} = {sync_rate[2]:.1%}, {len(sync_calls)} calls; "
          f"cost per question: batch ${sum(c.cost_usd for c in calls) / 60:.7f}, sync "
          f"${sum(c.cost_usd for c in sync_calls) / 60:.7f}")
    # Batch lines cannot list what the other lines of their round write: more repeats than
    # sync, bounded by the numbered steering and the top-up rounds.
    assert batch_rate[2] < 0.6


def test_a_batch_over_the_enqueued_token_limit_is_retried_never_paused(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    mock_llm.configure(batch_enqueued_token_limit=100)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 5)],
                             retry_base_s=0.05, retry_max_s=0.2)
    rt = rt_of(settings, store)
    wait_for(lambda: (run_pass(rt, ["bx"]), store.exam_batches("bx")[-1].state == "done")[1],
             20, "the first batch to fail")
    first = store.exam_batches("bx")[-1]
    assert first.provider_status == "failed" and "Enqueued token limit" in (first.detail or "")
    calls, _, slices = _rows(store)
    mine = [c for c in calls if c.worker == first.owner]
    assert {(c.outcome, c.reason, c.cost_usd) for c in mine} == {
        ("failed", "batch_token_limit", 0.0)}
    assert store.status("bx").state != "paused"
    mock_llm.configure(batch_enqueued_token_limit=None)
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert len(questions) == 10 and len(_paid_batch_lines(mock_llm)) == 2


def test_the_budget_reserves_the_discounted_worst_case_and_pauses_when_nothing_fits(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    from sqlalchemy import select as sel

    from storage.base import E

    prices = {"llm_price_prompt_per_mtok": 10.0, "llm_price_completion_per_mtok": 40.0}
    # Exam bx measures one line's reservation; exam by (the same shape) gets a budget of one
    # and a half of it.
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)], **prices)
    rt = rt_of(settings, store)
    mock_llm.configure(batch_validation_s=3)
    run_pass(rt, ["bx"])
    (call,) = _rows(store)[0]  # in flight: its prompt is our count, as reserved
    worst = call.reserved_usd
    assert worst == pytest.approx(
        rt.client.worst_case_usd(call.prompt_tokens, call.max_tokens) * 0.5)
    mock_llm.configure(batch_validation_s=0.1)
    _until_done(rt)
    (call,) = _rows(store)[0]
    assert 0 < call.cost_usd < worst
    path = write_syllabus(settings.exams_dir, "by", [("a", 5), ("b", 5), ("c", 5), ("d", 5)])
    store.sync_exam("by", load_syllabus(path, max_questions=5000), (), budget_usd=1.5 * worst)
    store.set_exam_mode("by", ExamMode.batch)
    lines: list[int] = []

    def stopped() -> bool:
        run_pass(rt, ["by"])
        with store.engine.connect() as conn:
            exam = conn.execute(sel(E).where(E.c.slug == "by")).one()
        assert exam.spent_usd + exam.reserved_usd <= exam.budget_usd + 1e-9
        for b in store.exam_batches("by"):
            lines.append(b.requests)
        return exam.state == "paused" or store.status("by").finished

    wait_for(stopped, 60, "the exam to pause or finish within its budget", interval_s=0.2)
    report = store.status("by")
    assert report.state == "paused" and report.pause_code == PauseCode.budget
    assert set(lines) == {1}  # NoRoom: one line a round, never more than fits
    calls = _rows(store, "by")[0]
    assert calls and all(c.outcome == "used" for c in calls)
    assert len(_paid_batch_lines(mock_llm)) == 1 + len(calls)


def test_booking_a_batch_twice_changes_nothing(make_settings, db_url, mock_llm, tmp_path,
                                               rt_of):
    from runner.batching import process_results

    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 12)])
    rt = rt_of(settings, store)
    _until_done(rt)
    before = _rows(store)
    (row,) = store.exam_batches("bx")
    again = PassResult()
    process_results(rt, row, rt.api.retrieve(row.provider_batch_id), again)  # a second poller
    assert again.committed == 0
    after = _rows(store)
    assert [tuple(r) for r in after[0]] == [tuple(r) for r in before[0]]
    assert len(after[1]) == 12


def test_a_chapter_whose_lines_keep_failing_stops_at_its_attempt_cap(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    mock_llm.configure(script={"bx/a": ["500"] * 10})
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 5)],
                             max_attempts=2, retry_base_s=0.05, retry_max_s=0.1)
    rt = rt_of(settings, store)
    _until_done(rt)  # ends without a reconciler, as `run --batch` does
    states = {c.id: (c.state, c.last_error_code) for c in store.status("bx").chapter_list}
    assert states["b"][0] == "done"
    assert states["a"] == ("failed", SliceReason.attempt_cap)
    calls = [c for c in _rows(store)[0] if c.chapter_id == "a"]
    assert [(c.outcome, c.reason) for c in calls] == [("failed", "server_error")] * 2


@pytest.mark.parametrize("limit", ["requests", "bytes"])
def test_a_round_larger_than_the_size_limits_is_split_into_batches_within_them(
        make_settings, db_url, mock_llm, tmp_path, rt_of, limit):
    """BATCH_MAX_REQUESTS and BATCH_MAX_BYTES cap each input file: five one-call chapters
    under a cap of two requests (or of about two lines' bytes) go into several batches, each
    within the cap, every custom_id in exactly one of them, every question stored once."""
    line = 2500  # bytes: more than one line of these chapters takes
    caps = ({"batch_max_requests": 2} if limit == "requests"
            else {"batch_max_bytes": 2 * line})
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path,
                             [(c, 3) for c in "abcde"], **caps)
    rt = rt_of(settings, store)
    _until_done(rt)
    calls, questions, slices = _rows(store)
    assert len(questions) == 15 and {s.state for s in slices} == {"done"}
    batches = _provider_batches(mock_llm)
    assert len(batches) >= (3 if limit == "requests" else 2)
    ids: list[str] = []
    for batch in batches:
        content = httpx.get(
            f"{mock_llm.base_url}/files/{batch['input_file_id']}/content").content
        if limit == "requests":
            assert batch["request_counts"]["total"] <= 2
        else:
            assert len(content) <= 2 * line
        ids += _custom_ids(mock_llm, batch)
    assert len(ids) == len(set(ids)) == len(calls)
    paid = [u for u in mock_llm.usage() if u.get("batch") and u["billed"]]
    assert len(paid) == len([c for c in calls if c.outcome == "used"]) == 5


LINE_TOKENS = 1_700  # about what one line of these 3-question chapters enqueues


def test_a_round_over_batch_max_tokens_is_split_and_no_batch_fails_for_the_limit(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    """BATCH_MAX_TOKENS below the model's enqueued-token limit: five one-call chapters whose
    lines together exceed the limit go into several batches, one live at a time, none failed with
    token_limit_exceeded (without the cap the one round fails, and would fail again at
    every retry)."""
    # The limit holds three lines, not five; the cap two and a half (a margin: the provider's
    # tokenizer may count a little more than ours).
    mock_llm.configure(batch_enqueued_token_limit=int(3.3 * LINE_TOKENS))
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path,
                             [(c, 3) for c in "abcde"],
                             batch_max_tokens=int(2.5 * LINE_TOKENS))
    rt = rt_of(settings, store)
    # The cap holds the live batches together: a pass submits one batch of two lines, and
    # the next batch waits until that one has ended.
    run_pass(rt, ["bx"])
    assert [b.requests for b in store.exam_batches("bx")] == [2]
    _until_done(rt)
    calls, questions, slices = _rows(store)
    assert len(questions) == 15 and {s.state for s in slices} == {"done"}
    batches = _provider_batches(mock_llm)
    assert len(batches) >= 3 and {b["status"] for b in batches} == {"completed"}
    assert [c.outcome for c in calls] == ["used"] * 5
    ids = _each_custom_id_once(mock_llm)
    assert sorted(ids) == sorted(f"call-{c.id}" for c in calls)


def test_a_request_over_batch_max_tokens_fails_its_chapter_with_the_reason(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 3)],
                             batch_max_tokens=100)
    rt = rt_of(settings, store)
    run_pass(rt, ["bx"])
    calls, questions, slices = _rows(store)
    assert [s.state for s in slices] == ["failed"]
    assert "over BATCH_MAX_TOKENS (100)" in slices[0].last_error
    assert not calls and not questions and not _provider_batches(mock_llm)


def test_a_request_larger_than_batch_max_bytes_fails_its_chapter_with_the_reason(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    """A line no batch file can hold (BATCH_MAX_BYTES below one request) is not retried
    round after round: its chapter fails at once, saying which setting to change, and
    nothing is uploaded or paid."""
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 3)],
                             batch_max_bytes=1024)
    rt = rt_of(settings, store)
    run_pass(rt, ["bx"])
    calls, questions, slices = _rows(store)
    assert [s.state for s in slices] == ["failed"]
    assert "over BATCH_MAX_BYTES (1,024)" in slices[0].last_error
    assert not calls and not questions and not _provider_batches(mock_llm)
    assert store.exam_batches("bx") == []


def test_a_flex_tier_setting_leaves_batch_lines_at_the_batch_price(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    """LLM_SERVICE_TIER is for synchronous calls: batch lines are sent no service_tier (the
    mock would refuse a flex line for capacity, as OpenAI's flex does) and each is booked at
    the batch discount of its usage, as the mock bills it, not also at flex's half."""
    mock_llm.configure(flex_unavailable_rate=1.0)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 4)],
                             llm_service_tier="flex", llm_price_prompt_per_mtok=1.0,
                             llm_price_completion_per_mtok=4.0)
    rt = rt_of(settings, store)
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert len(questions) == 9 and [c.outcome for c in calls] == ["used", "used"]
    for batch in _provider_batches(mock_llm):
        content = httpx.get(f"{mock_llm.base_url}/files/{batch['input_file_id']}/content")
        assert all("service_tier" not in json.loads(line)["body"]
                   for line in content.text.splitlines() if line)
    by_call = {int(u["custom_id"].split("-")[1]): u for u in _paid_batch_lines(mock_llm)}
    for call in calls:
        u = by_call[call.id]
        assert call.cost_usd == pytest.approx(
            (u["prompt_tokens"] * 1.0 + u["completion_tokens"] * 4.0) / 1e6 * 0.5)


def test_the_rate_limits_do_not_hold_back_a_batch(make_settings, db_url, mock_llm, tmp_path,
                                                  rt_of):
    """Providers count batch requests apart from the synchronous rate limits: LLM_RPM and
    LLM_TPM (one request and 10 tokens a minute here) hold back no line of a batch."""
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path,
                             [("a", 5), ("b", 5), ("c", 5), ("d", 5)], llm_rpm=1, llm_tpm=10)
    rt = rt_of(settings, store)
    assert run_pass(rt, ["bx"]).submitted == 1
    assert [b.requests for b in store.exam_batches("bx")] == [4]
    _until_done(rt, timeout_s=30)
    calls, questions, _ = _rows(store)
    assert len(questions) == 20 and [c.outcome for c in calls] == ["used"] * 4


def test_a_line_without_usage_is_booked_at_the_clients_own_count(make_settings, db_url,
                                                                 mock_llm, tmp_path, rt_of):
    # Two lines, the first without usage: booked at the prompt the client counted when it
    # planned the call (with the schema and framing it reserves for: at least the bill) and
    # the reply as received, never 0, and flagged as our count.
    mock_llm.configure(batch_usage_dropped=1)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 4)],
                             llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0)
    _until_done(rt_of(settings, store))
    calls, questions, _ = _rows(store)
    assert len(questions) == 9 and [c.outcome for c in calls] == ["used", "used"]
    paid = {int(u["custom_id"].split("-")[1]): u
            for u in mock_llm.usage() if u.get("batch") and u["billed"]}
    estimated = [c for c in calls if c.usage_estimated]
    assert len(estimated) == 1, [(c.id, c.usage_estimated) for c in calls]
    for call in calls:
        billed = paid[call.id]
        if call.usage_estimated:
            assert call.prompt_tokens >= billed["prompt_tokens"] > 0
            assert call.completion_tokens >= billed["completion_tokens"] > 0
        else:
            assert (call.prompt_tokens, call.completion_tokens) == (
                billed["prompt_tokens"], billed["completion_tokens"])
        assert call.cost_usd > 0


def test_a_finished_batch_whose_files_are_gone_is_booked_at_its_worst_case_and_sent_again(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    from runner.batching import BATCH_FILE_TRIES

    mock_llm.configure(batch_output_lost=1)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 4)],
                             llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0)
    rt = rt_of(settings, store)
    _until_done(rt)
    calls, questions, slices = _rows(store)
    # The two lines of the first batch ran and were billed, and their replies are gone: booked
    # wasted at their worst case (the prompt and max_tokens at the batch price), not $0 and
    # not in flight; the slices went to a second round, which stored the exam once.
    assert len(questions) == 9 and {s.state for s in slices} == {"done"}
    lost = [c for c in calls if c.reason == "batch_output_lost"]
    assert len(lost) == 2 and all(c.outcome == "wasted" for c in lost), [tuple(c) for c in calls]
    for call in lost:
        # The call's reservation: its prompt (with the reservation's margin) and max_tokens.
        worst = rt.client.batch_worst_case_usd(call.prompt_tokens, call.max_tokens)
        assert call.cost_usd == pytest.approx(worst) and call.completion_tokens == call.max_tokens
        assert worst >= (call.prompt_tokens * 1.0 + call.max_tokens * 4.0) / 1e6 * 0.5
    # Nothing in flight; the second round's lines (it may send spares after a failed round)
    # are booked like any.
    assert all(c.outcome in ("used", "wasted") for c in calls), [tuple(c) for c in calls]
    batches = store.exam_batches("bx")
    gone = [b for b in batches if "files gone at the provider" in (b.detail or "")]
    assert len(batches) >= 2 and len(gone) == 1, [(b.provider_status, b.detail) for b in batches]
    assert {b.state for b in batches} == {BatchState.done.value}
    billed = [u for u in mock_llm.usage() if u.get("batch") and u["billed"]]
    assert len(billed) == len(calls)  # what the provider billed, and the ledger booked each
    assert BATCH_FILE_TRIES >= 2
