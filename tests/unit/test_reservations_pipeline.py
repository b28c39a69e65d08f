"""process_chapter against a scripted fake provider: cancel means no new call, and the budget
wait cannot go on for ever (issue 16, items 3 and 10)."""

from __future__ import annotations

from examforge.errors import PauseCode
import pytest

from runner.pipeline import process_chapter
from helpers import fake_runtimes, wait_lease_expired
from storage.store import Claimed


@pytest.fixture
def env(make_settings):
    with fake_runtimes(make_settings) as build:
        yield build


def test_a_cancel_that_commits_after_the_commit_recorded_the_next_call_stops_its_send(env):
    """Cancel: the first commit records the slice's next call in its own transaction, and a
    cancel commits right after it, before the worker sends that call. The provider sees no
    request after the cancel returned; the recorded call is booked as never sent."""
    rt, fake = env([("a", 20)])
    rt.store.set_budget("ex", 100.0)
    commit = rt.store.commit_batch
    seen_at_cancel: list[int] = []

    def commit_then_cancel(*args, **kwargs):
        committed = commit(*args, **kwargs)
        if not seen_at_cancel:
            assert isinstance(committed.next_call, int)  # recorded, not sent yet
            assert rt.store.cancel("ex") == 1
            seen_at_cancel.append(fake.calls)
        return committed

    rt.store.commit_batch = commit_then_cancel  # type: ignore[method-assign]
    result = process_chapter(rt, "ex", "a")
    assert seen_at_cancel == [1]
    assert fake.calls == 1, "a request reached the provider after cancel returned"
    assert result.outcome == "skipped" and result.detail == "cancelled"
    report = rt.store.status("ex").as_dict()
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0
    assert report["usage"]["calls_used"] == 1
    chapter = report["chapter_list"][0]
    assert chapter["state"] == "cancelled"


def test_a_dead_holders_reservation_cannot_keep_another_chapter_waiting(env):
    """The budget-wait loop: a dead worker's call held most of what was left of the budget,
    so "others are in flight" was true for ever and chapter b was handed back every two
    seconds, uncounted, with the exam active. Now its reservation is settled at its worst
    case when no room is found, nothing live is in flight, and the exam is paused."""
    rt, fake = env([("a", 5), ("b", 5)], llm_price_prompt_per_mtok=0.0,
                   llm_price_completion_per_mtok=1000.0, llm_max_tokens_per_question=200,
                   lease_s=1.0)
    rt.store.set_budget("ex", 1.2)
    dead = rt.store.claim("ex", "a", "dead", 1.0, 8)
    assert isinstance(dead, Claimed)
    rt.store.start_call(dead, 1, 5, lease_s=1.0, max_tokens=1100, reserve_usd=1.1)
    wait_lease_expired(rt.store, "ex", "a")
    result = process_chapter(rt, "ex", "b")
    assert result.outcome == "skipped" and "paused" in result.detail, result
    assert fake.calls == 0  # $0.10 left: not even one question's worst case ($0.20+) fits
    report = rt.store.status("ex").as_dict()
    assert report["state"] == "paused" and report["pause_code"] == PauseCode.budget
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0
    assert report["spent_usd"] == pytest.approx(1.1)
