"""process_chapter: claim, call, validate, commit, against a scripted fake provider."""

from __future__ import annotations

from examforge.errors import PauseCode, SliceReason
import json
import threading
import time

import httpx
import pytest
from fakellm import question, reply

from runner.pipeline import process_chapter
from storage.types import NotClaimedReason
from helpers import fake_runtimes, write_syllabus


@pytest.fixture
def env(make_settings, tmp_path):
    with fake_runtimes(make_settings) as build:
        yield build


def _status(rt):
    return rt.store.status("ex").as_dict()


def test_a_chapter_takes_exactly_the_calls_its_questions_need(env):
    rt, fake = env([("a", 12), ("b", 5)])
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert process_chapter(rt, "ex", "b").outcome == "done"
    assert fake.calls == 3 + 1  # ceil(12 / 5) + ceil(5 / 5)
    report = _status(rt)
    assert report["questions"] == {"target": 17, "done": 17}
    assert report["usage"]["calls"] == 4
    assert report["usage"]["prompt_tokens"] == 400 and report["usage"]["completion_tokens"] == 200


def test_the_user_message_names_chapter_and_count(env):
    rt, fake = env([("a", 7)])
    process_chapter(rt, "ex", "a")
    user = fake.requests[-1]["messages"][-1]["content"]
    assert "Chapter id: a" in user and "Chapter title: Chapter a" in user
    assert "Number of questions: 2" in user  # the second call asks only for what is missing
    # mock-model (the default LLM_MODEL: the bundled mock) is sent the reply's schema.
    assert fake.requests[0]["response_format"]["type"] == "json_schema"


def test_a_short_reply_is_kept_and_the_rest_asked_for(env):
    rt, fake = env([("a", 5)])
    fake.script = [lambda req, n: reply(json.dumps({"questions": [question(900), question(901)]}))]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert fake.calls == 2
    assert "Number of questions: 3" in fake.requests[1]["messages"][-1]["content"]


def test_extras_are_dropped(env):
    rt, fake = env([("a", 5)])
    fake.script = [lambda req, n: reply(json.dumps(
        {"questions": [question(i) for i in range(900, 912)]}))]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert fake.calls == 1 and _status(rt)["questions"]["done"] == 5
    assert len(rt.store.questions("ex")) == 5


def test_transient_error_releases_with_backoff_and_honours_retry_after(env):
    rt, fake = env([("a", 5)], retry_base_s=0.01)
    fake.script = [lambda req, n: httpx.Response(429, headers={"Retry-After": "2"},
                                                 json={"error": {"message": "slow down"}})]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "retry" and result.retry_in_s >= 2.0
    # A duplicate delivery arriving early makes no call: the backoff lives in the database.
    early = process_chapter(rt, "ex", "a")
    assert early.outcome == "retry" and early.not_claimed is NotClaimedReason.backoff
    assert fake.calls == 1
    report = _status(rt)
    assert report["usage"]["calls_failed"] == 1
    assert "429" in report["chapter_list"][0]["last_error"]


@pytest.mark.parametrize("status", [400, 404, 422])
def test_permanent_errors_fail_the_chapter_at_once(env, status):
    rt, fake = env([("a", 5)])
    fake.script = [lambda req, n: httpx.Response(status, json={"error": "bad request"})]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "failed" and "permanent" in result.detail
    assert fake.calls == 1
    assert process_chapter(rt, "ex", "a").outcome == "skipped"
    assert fake.calls == 1


def test_a_rejected_api_key_fails_the_chapter_and_pauses_the_exam(env):
    rt, fake = env([("a", 5), ("b", 5), ("c", 5)])
    fake.script = [lambda req, n: httpx.Response(401, json={"error": {"message": "bad key"}})]
    assert process_chapter(rt, "ex", "a").outcome == "failed"
    # The other chapters make no call while the exam is paused.
    assert process_chapter(rt, "ex", "b").outcome == "skipped"
    assert process_chapter(rt, "ex", "c").outcome == "skipped"
    assert fake.calls == 1
    report = _status(rt)
    assert report["state"] == "paused"
    assert "sk-test" not in json.dumps(report)  # the key never reaches the database
    assert rt.store.resume("ex") == [("a", 0), ("b", 0), ("c", 0)]
    for chapter in "abc":
        assert process_chapter(rt, "ex", chapter).outcome == "done"


@pytest.mark.parametrize("bad", [
    lambda req, n: reply("Sure! {\"questions\": ["),
    lambda req, n: reply('{"questions": [', finish_reason="length"),
    lambda req, n: reply(""),
    lambda req, n: reply("I'm sorry, but I can't help with that."),
    lambda req, n: reply(json.dumps({"items": []})),
    lambda req, n: reply(json.dumps({"questions": [{**question(1), "choices": ["a", "b"]}]})),
    lambda req, n: reply(json.dumps({"questions": [{**question(1), "answer_index": 7}]})),
], ids=["malformed", "truncated", "empty", "refusal", "wrong_schema", "bad_choices", "bad_index"])
def test_invalid_output_is_never_stored_and_re_asked_a_bounded_number_of_times(env, bad):
    rt, fake = env([("a", 5)], max_reasks=2)
    fake.script = [bad] * 10
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "failed" and "invalid output" in result.detail
    assert fake.calls == 3  # the first ask and two re-asks
    report = _status(rt)
    assert report["questions"]["done"] == 0
    assert report["usage"]["calls_wasted"] == 3
    assert report["usage"]["completion_tokens"] == 150  # wasted tokens are still counted


def test_one_invalid_reply_is_re_asked_then_the_chapter_completes(env):
    rt, fake = env([("a", 5)])
    fake.script = [lambda req, n: reply("```json\n" + json.dumps(
        {"questions": [question(i) for i in range(800, 805)]}) + "\n```")]
    assert process_chapter(rt, "ex", "a").outcome == "done"  # fenced JSON is fine
    rt2, fake2 = env([("b", 5)])
    fake2.script = [lambda req, n: reply("not json")]
    assert process_chapter(rt2, "ex", "b").outcome == "done"
    assert fake2.calls == 2


def test_duplicate_questions_across_calls_are_asked_again(env):
    rt, fake = env([("a", 10)])
    same = [question(i) for i in range(700, 705)]
    fake.script = [lambda req, n: reply(json.dumps({"questions": same}))] * 2
    assert process_chapter(rt, "ex", "a").outcome == "done"
    texts = [q["question"] for q in rt.store.questions("ex")]
    assert len(texts) == 10 and len(set(texts)) == 10
    assert fake.calls == 3


def test_a_second_delivery_while_the_first_runs_makes_no_call(env):
    rt, fake = env([("a", 10)])
    started, release = threading.Event(), threading.Event()

    def slow(req, n):
        started.set()
        release.wait(10)
        return fake.valid(n, "a")

    fake.script = [slow]
    first: list[object] = []
    worker = threading.Thread(target=lambda: first.append(process_chapter(rt, "ex", "a")))
    worker.start()
    assert started.wait(5)
    second = process_chapter(rt, "ex", "a")
    assert second.outcome == "retry" and second.not_claimed is NotClaimedReason.busy
    assert 0 < second.retry_in_s <= rt.settings.lease_s + 1
    release.set()
    worker.join(10)
    assert first[0].outcome == "done"
    assert fake.calls == 2
    assert process_chapter(rt, "ex", "a").outcome == "skipped"


def test_heartbeat_keeps_the_lease_through_a_call_longer_than_several_ttls(env):
    # Three TTLs of call. A lease of 1.5 s, six beats long: one of 0.8 s was lost once in a
    # full fast-tier run, where a stall of 0.6 s anywhere in the process (another test's
    # leftover threads, a collection) sat between the claim and the first beat.
    rt, fake = env([("a", 5)], lease_s=1.5, heartbeat_s=0.25)
    fake.script = [lambda req, n: (time.sleep(4.5), fake.valid(n, "a"))[1]]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert _status(rt)["questions"]["done"] == 5


def test_without_heartbeat_a_long_call_loses_the_lease_and_its_result(env):
    rt, fake = env([("a", 5)], lease_s=0.8, heartbeat_s=0.2)
    rt.keeper.hold = lambda owner: threading.Event()  # a worker that never renews
    taken: list[object] = []

    def slow(req, n):
        time.sleep(1.2)
        taken.append(rt.store.claim("ex", "a", "thief", 30.0, 8))
        return fake.valid(n, "a")

    fake.script = [slow]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "lost"
    report = _status(rt)
    assert report["questions"]["done"] == 0
    assert report["usage"]["calls_wasted"] == 1


def test_backoff_restarts_small_after_progress(env):
    rt, fake = env([("a", 20)], retry_base_s=1.0, retry_max_s=64.0)
    err = lambda req, n: httpx.Response(503, json={"error": "down"})  # noqa: E731
    for _ in range(4):  # four failed attempts in a row: the backoff grows
        fake.script = [err]
        result = process_chapter(rt, "ex", "a")
        rt.store.engine.dispose()
        with rt.store.engine.begin() as conn:  # skip the wait instead of sleeping
            conn.exec_driver_sql("UPDATE slice SET not_before_at = NULL")
    assert result.retry_in_s >= 4.0
    fake.script = [lambda req, n: fake.valid(n, "a"), err]  # progress, then a failure
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "retry" and result.retry_in_s <= 1.0


def test_only_consecutive_auth_failures_count_towards_the_pause(env):
    rt, fake = env([("a", 5), ("b", 5), ("c", 5), ("d", 5)], auth_failure_limit=2)
    denied = lambda req, n: httpx.Response(403, json={"error": "forbidden"})  # noqa: E731
    fake.script = [denied]
    assert process_chapter(rt, "ex", "a").outcome == "failed"
    assert _status(rt)["state"] == "active"  # one failure is not yet a pattern
    assert process_chapter(rt, "ex", "b").outcome == "done"  # a success resets the count
    fake.script = [denied]
    assert process_chapter(rt, "ex", "c").outcome == "failed"
    assert _status(rt)["state"] == "active"
    fake.script = [denied]
    assert process_chapter(rt, "ex", "d").outcome == "failed"
    assert _status(rt)["state"] == "paused"


def test_enqueue_plan_of_a_paused_exam_says_so(env):
    rt, fake = env([("a", 5), ("b", 5)])
    fake.script = [lambda req, n: httpx.Response(401, json={"error": "bad key"})]
    process_chapter(rt, "ex", "a")
    from examforge.syllabus import load_syllabus as load

    plan = rt.store.sync_exam("ex", load(rt.settings.exams_dir / "ex" / "syllabus.json",
                                         max_questions=100))
    assert plan.exam_paused and "401" in plan.exam_paused
    assert plan.to_enqueue == [] and set(plan.skipped) == {"a", "b"}


def test_a_target_raised_while_the_chapter_runs_adds_a_slice_for_the_new_numbers(env):
    rt, fake = env([("a", 10)])
    from examforge.syllabus import load_syllabus as load

    def raise_target(req, n):
        path = write_syllabus(rt.settings.exams_dir, "ex", [("a", 20)])
        plan = rt.store.sync_exam("ex", load(path, max_questions=100))
        # enqueue sees it unfinished and publishes both slices (the running one is a no-op)
        assert plan.to_enqueue == ["a"] and plan.slices == [("a", 0), ("a", 1)]
        return fake.valid(n, "a")

    fake.script = [raise_target]
    assert process_chapter(rt, "ex", "a", 0).outcome == "done"  # numbers 1-10
    assert _status(rt)["questions"] == {"target": 20, "done": 10}
    assert process_chapter(rt, "ex", "a", 1).outcome == "done"  # numbers 11-20
    report = _status(rt)
    assert report["questions"] == {"target": 20, "done": 20}
    assert [(s["first"], s["last"], s["state"]) for s in report["chapter_list"][0]["slices"]] \
        == [(1, 10, "done"), (11, 20, "done")]
    assert [q["number"] for q in rt.store.questions("ex")] == list(range(1, 21))
    assert fake.calls == 4


def test_every_call_that_got_an_answer_records_its_endpoint(env):
    # used, wasted (invalid output) and failed (a 503) alike; no fallback is configured here.
    rt, fake = env([("a", 5)], max_reasks=2, retry_base_s=0.01)
    fake.script = [lambda req, n: httpx.Response(503), lambda req, n: reply("not json")]
    assert process_chapter(rt, "ex", "a").outcome == "retry"
    time.sleep(0.05)
    assert process_chapter(rt, "ex", "a").outcome == "done"
    report = _status(rt)
    assert (report["usage"]["calls_failed"], report["usage"]["calls_wasted"],
            report["usage"]["calls_used"]) == (1, 1, 1)
    assert set(report["usage_by_endpoint"]) == {"primary"}
    assert report["usage_by_endpoint"]["primary"]["calls"] == 3


def test_a_reply_past_its_deadline_is_wasted_with_its_prompt_booked_and_retried(env):
    # A read timeout means no complete reply within LLM_TIMEOUT_S: the call was sent, the
    # provider may bill it, so it is wasted (not failed), with our count of the prompt.
    rt, fake = env([("a", 5)], llm_price_prompt_per_mtok=1000.0,
                   llm_price_completion_per_mtok=0.0)

    def never_finishes(req, n):
        raise httpx.ReadTimeout("the reply trickled past the deadline", request=req)

    fake.script = [never_finishes]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "retry"
    report = _status(rt)
    assert report["usage"]["calls_wasted"] == 1 and report["usage"]["calls_failed"] == 0
    assert report["usage"]["prompt_tokens"] > 0 and report["cost_usd"] > 0
    assert report["chapter_list"][0]["last_error_code"] == SliceReason.transient
    assert report["chapter_list"][0]["last_error"].startswith("transient: deadline")  # as people read it
    time.sleep(0.1)
    assert process_chapter(rt, "ex", "a").outcome == "done"


def test_an_oversized_reply_is_wasted_and_re_asked_then_fails_the_chapter(env):
    rt, fake = env([("a", 5)], llm_max_reply_bytes=2048, max_reasks=2)
    huge = lambda req, n: reply("x" * 10_000)  # noqa: E731
    fake.script = [huge, huge, huge]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "failed" and "reply_too_large" in result.detail
    assert fake.calls == 3  # the first call and MAX_REASKS re-asks
    usage = _status(rt)["usage"]
    assert usage["calls_wasted"] == 3 and usage["calls_used"] == 0


# --- spend and rate control ------------------------------------------------------------------

def _chapter(rt):
    return _status(rt)["chapter_list"][0]


def test_every_call_sends_max_tokens_sized_from_the_questions_asked(env):
    rt, fake = env([("a", 7)], llm_max_tokens_per_question=300)
    process_chapter(rt, "ex", "a")
    assert [r["max_tokens"] for r in fake.requests] == [
        rt.settings.max_tokens(5), rt.settings.max_tokens(2)]


def test_a_budget_stops_the_exam_before_it_is_exceeded_and_a_raised_one_finishes_it(env):
    # Each call's worst case is its max_tokens at $1000 per million: $0.50 per question asked.
    # The fake bills 50 completion tokens a call ($0.05), so the budget shrinks calls to what
    # still fits, then pauses the exam when not even one question does.
    rt, fake = env([("a", 60)], slice_questions=100, llm_price_prompt_per_mtok=0.0,
                   llm_price_completion_per_mtok=1000.0, llm_max_tokens_per_question=500)
    rt.store.set_budget("ex", 1.0)
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "skipped" and "paused" in result.detail
    report = _status(rt)
    assert report["state"] == "paused" and report["pause_code"] == PauseCode.budget
    assert report["spent_usd"] <= report["budget_usd"] == 1.0
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0
    asked = [int(r["messages"][-1]["content"].split("Number of questions: ")[1].split()[0])
             for r in fake.requests]
    assert asked[0] == 1 and max(asked) == 1  # $0.60 for one question fits; two do not
    assert all(rt.settings.max_tokens(n) * 1e-3 <= 1.0 for n in asked)
    # The chapter was handed back, not failed, and no attempt was counted against it.
    assert _chapter(rt)["state"] == "pending" and _chapter(rt)["attempts_since_progress"] == 0
    paid_before = fake.calls
    rt.store.set_budget("ex", 100.0)
    assert _status(rt)["state"] == "active"
    assert process_chapter(rt, "ex", "a").outcome == "done"
    report = _status(rt)
    assert report["questions"]["done"] == 60
    assert report["usage"]["calls_used"] == fake.calls  # nothing paid twice, nothing wasted
    assert fake.calls > paid_before


def test_no_room_while_others_are_in_flight_waits_uncounted_instead_of_pausing(env):
    rt, fake = env([("a", 5), ("b", 5)], llm_price_prompt_per_mtok=0.0,
                   llm_price_completion_per_mtok=1000.0, llm_max_tokens_per_question=200)
    rt.store.set_budget("ex", 1.2)  # one call's worst case (5 questions) is $1.10
    held = threading.Event()
    release = threading.Event()

    def slow(req, n):
        held.set()
        release.wait(10)
        return fake.valid(n, "a")

    fake.script = [slow]
    first = threading.Thread(target=process_chapter, args=(rt, "ex", "a"))
    first.start()
    assert held.wait(10)
    result = process_chapter(rt, "ex", "b")  # $1.10 is reserved by "a"; $0.10 left
    release.set()
    first.join(10)
    assert result.outcome == "retry" and result.reason is SliceReason.budget_wait
    assert _status(rt)["state"] == "active"
    b = [c for c in _status(rt)["chapter_list"] if c["id"] == "b"][0]
    assert b["attempts_since_progress"] == 0


def test_an_exhausted_quota_pauses_the_exam_at_once_and_resume_continues(env):
    rt, fake = env([("a", 5), ("b", 5)])
    quota = lambda req, n: httpx.Response(429, json={"error": {  # noqa: E731
        "message": "You exceeded your current quota, please check your plan and billing "
                   "details.", "type": "insufficient_quota", "code": "insufficient_quota"}})
    fake.script = [quota]
    result = process_chapter(rt, "ex", "a")
    assert result.outcome == "skipped"
    report = _status(rt)
    assert report["state"] == "paused" and report["pause_code"] == PauseCode.provider
    assert "exceeded your current quota" in report["pause_reason"]
    # Nothing else is sent for this exam, and the chapter is not failed.
    assert process_chapter(rt, "ex", "b").outcome == "skipped"
    assert fake.calls == 1
    assert _chapter(rt)["state"] == "pending"
    rt.store.resume("ex")
    assert process_chapter(rt, "ex", "a").outcome == "done"


def test_a_rate_limit_429_never_counts_toward_the_attempt_cap(env):
    rt, fake = env([("a", 5)], retry_base_s=0.01, max_attempts=2)
    limited = lambda req, n: httpx.Response(  # noqa: E731
        429, headers={"retry-after-ms": "20"},
        json={"error": {"message": "Rate limit reached", "type": "requests",
                        "code": "rate_limit_exceeded"}})
    fake.script = [limited] * 5
    for _ in range(5):
        result = process_chapter(rt, "ex", "a")
        assert result.outcome == "retry" and result.reason is SliceReason.rate_limited
        assert result.retry_in_s == pytest.approx(0.02)
        time.sleep(0.05)
    assert _chapter(rt)["attempts_since_progress"] == 0  # five refusals, cap of two: alive
    assert process_chapter(rt, "ex", "a").outcome == "done"


def test_a_reply_without_usage_is_booked_at_our_own_count_and_marked(env):
    rt, fake = env([("a", 5)], llm_price_prompt_per_mtok=1.0,
                   llm_price_completion_per_mtok=2.0)

    def no_usage(req, n):
        response = fake.valid(n)
        body = json.loads(response.content)
        del body["usage"]
        return httpx.Response(200, json=body)

    fake.script = [no_usage]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    report = _status(rt)
    assert report["usage"]["calls_estimated"] == 1
    assert report["usage"]["prompt_tokens"] > 0 and report["usage"]["completion_tokens"] > 0
    assert report["cost_usd"] > 0
    assert report["usage"]["estimated_cost_usd"] == pytest.approx(report["cost_usd"])


def test_one_write_transaction_per_paid_call(env):
    """The claim records the first call, and each commit records the next one: a chapter of
    four calls takes five write transactions (the claim, four commits; the last commit starts
    no fifth call). It took ten before: mark_picked, the claim, then a start and a commit for
    each call."""
    from sqlalchemy import event

    rt, fake = env([("a", 20)])
    writes: list[str] = []

    @event.listens_for(rt.store.engine, "begin")
    def _count(conn):  # type: ignore[no-untyped-def]
        if not conn.get_execution_options().get("examforge_read_only"):
            writes.append("write")

    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert fake.calls == 4 and len(writes) == 5
    calls = rt.store.status("ex").usage
    assert calls.calls_used == 4 and calls.calls_in_flight == 0


def test_a_call_that_must_wait_for_the_limiter_is_started_after_the_wait(env):
    # With a limit of one request at a time, the next call cannot be admitted inside the
    # commit: it is recorded after the wait, in a transaction of its own, never before.
    rt, fake = env([("a", 10)], llm_rpm=120, llm_rate_burst_s=0.5)
    started = time.monotonic()
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert time.monotonic() - started >= 0.4  # 120 RPM: the second call waited ~0.5 s
    assert fake.calls == 2 and _status(rt)["usage"]["calls_used"] == 2


def test_the_lease_keeper_thread_stops(env):
    rt, _ = env([("a", 5)])
    process_chapter(rt, "ex", "a")
    thread = rt.keeper._thread
    assert thread is not None and thread.is_alive()
    rt.keeper.stop()
    assert not thread.is_alive()


def test_a_stop_after_the_next_call_was_recorded_sends_it_not(env):
    # Ctrl-C (or SIGTERM) between the commit that recorded the next call and its request:
    # the stop waited for that call too (a whole call more than those in flight, on top of
    # paying for it). It is recorded as not sent ($0) and the slice is handed back.
    rt, fake = env([("a", 15)])
    commit = rt.store.commit_batch

    planned = []

    def commit_then_stop(*args, **kwargs):
        committed = commit(*args, **kwargs)
        if not rt.stopping.is_set():
            planned.append(committed.next_call)  # the next call is recorded, not sent
            rt.stopping.set()  # the signal lands here
        return committed

    rt.store.commit_batch = commit_then_stop
    result = process_chapter(rt, "ex", "a")
    assert len(planned) == 1 and isinstance(planned[0], int)
    assert result.outcome == "retry" and "handed back" in (result.detail or "")
    assert fake.calls == 1
    from sqlalchemy import select

    from storage.store import K

    with rt.store.engine.connect() as conn:
        rows = [(r.outcome, r.reason, r.cost_usd, r.detail) for r in conn.execute(
            select(K.c.outcome, K.c.reason, K.c.cost_usd, K.c.detail).order_by(K.c.id))]
    assert [r[:3] for r in rows] == [("used", None, rows[0][2]), ("failed", "unexpected", 0.0)]
    assert (rows[1][3] or "").startswith("not sent:"), rows
    assert rt.store.status("ex").usage.calls_in_flight == 0
