"""No reservation outlives its call, the budget holds, cancel means no new call (issue 16,
items 2, 3, 4 and 10): real worker processes killed with real signals, real Redis, the mock's
own counts and usage log, both databases."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from harness import Deployment, dump
from helpers import wait_for, wait_lease_expired

pytestmark = pytest.mark.e2e

PROMPT_PRICE, COMPLETION_PRICE = 1.0, 2.0  # USD per million tokens, for these tests
PRICES = {"llm_price_prompt_per_mtok": PROMPT_PRICE,
          "llm_price_completion_per_mtok": COMPLETION_PRICE}


def _billed(record: dict[str, Any]) -> float:
    return (record["prompt_tokens"] * PROMPT_PRICE
            + record["completion_tokens"] * COMPLETION_PRICE) / 1_000_000


def _sent(mock: Any, slug: str) -> int:
    """Requests of the exam the mock received (counted on arrival)."""
    return sum(n for key, n in mock.stats()["calls_by_chapter"].items()
               if key.startswith(f"{slug}/"))


def _in_flight(dep: Deployment, slug: str) -> dict[str, dict[str, Any]]:
    return {c["chapter_id"]: c for c in dep.calls(slug) if c["outcome"] == "in_flight"}


def _naive_file(dep: Deployment, chapter: str, n: int):
    path = dep.workdir / "checkpoint.jsonl"
    path.write_text("".join(json.dumps({
        "chapter_id": chapter, "question": f"Imported question {i} of {chapter}: pick one.",
        "choices": ["first", "second", "third", "fourth"], "answer_index": i % 4,
        "explanation": "From the old run."}) + "\n" for i in range(n)), encoding="utf-8")
    return path


def test_dead_calls_are_settled_by_cancel_import_a_lowered_target_and_regenerate(deploy, mock):
    """Dead calls. A worker is SIGKILLed with four calls in flight and its leases lapse; no
    other worker and no reconciler run. Then the user cancels a, imports b, lowers c's target
    and regenerates d, and each of those settles its chapter's dead call in its own
    transaction. Afterwards nothing is reserved, nothing is in flight, and each dead call is
    booked at no less than the mock billed for it."""
    mock.configure(latency_s=20)  # every call is still in flight when the worker dies
    dep = deploy("postgres", lease_s=2, llm_timeout_s=40, llm_max_tokens_per_question=200,
                 **PRICES)
    chapters = ["a", "b", "c", "d"]
    dep.syllabus("exam", [(c, 10) for c in chapters])
    assert dep.cli_in_process("enqueue", "exam", "--budget-usd", "10").returncode == 0
    worker = dep.worker(4)
    wait_for(lambda: len(_in_flight(dep, "exam")) == 4 and mock.stats()["inflight"] == 4, 60,
             "four calls in flight")
    dep.kill(worker, signal.SIGKILL)
    # The mock notices each hang-up and bills the reply it generated anyway.
    wait_for(lambda: len([u for u in mock.usage() if u["billed"]]) == 4, 30,
             "the mock to bill the four abandoned replies")
    bill = {u["chapter"].split("/")[1]: _billed(u) for u in mock.usage() if u["billed"]}
    for chapter in chapters:
        wait_lease_expired(dep.store, "exam", chapter)
    assert dep.status("exam")["reserved_usd"] > 0

    assert dep.cli_in_process("cancel", "exam", "--chapter", "a").returncode == 0
    assert set(_in_flight(dep, "exam")) == {"b", "c", "d"}
    result = dep.cli_in_process("import", "exam", str(_naive_file(dep, "b", 10)))
    assert result.returncode == 0, result.stderr
    assert set(_in_flight(dep, "exam")) == {"c", "d"}
    dep.syllabus("exam", [("a", 10), ("b", 10), ("c", 5), ("d", 10)])
    result = dep.cli_in_process("enqueue", "exam", "--regenerate", "d")
    assert result.returncode == 0, result.stderr

    report = dep.status("exam")
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0, dump(report)
    calls = {c["chapter_id"]: c for c in dep.calls("exam") if c["worker"] != "import"}
    assert set(calls) == set(chapters)
    for chapter, call in calls.items():
        assert (call["outcome"], call["reason"], call["usage_estimated"]) == (
            "wasted", "crash_before_commit", True), dump(call)
        assert call["cost_usd"] >= bill[chapter] > 0, (chapter, call["cost_usd"], bill)
    assert report["spent_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls.values()))
    print("\nDEAD_CALLS " + json.dumps({c: {"booked_usd": round(calls[c]["cost_usd"], 6),
                                            "billed_usd": round(bill[c], 6)} for c in chapters}))


def test_a_reply_reporting_twice_its_reservation_pauses_the_exam_at_once(deploy, mock):
    """Budget. The provider reports (and bills) 8 times what a call used, as one whose
    tokenizer counts higher or that ignores max_tokens: well over twice the reservation. Two
    calls fit the budget; a's reply comes back first and takes spent past it. The exam is
    paused by that settle, while b's call is still in flight (before, a waited for b,
    "others are in flight", and the exam stayed active). No call starts after it, and spent
    exceeds the budget by no more than the overshoot of the calls that were in flight."""
    mock.configure(latency_s=0.3, usage_factor=8, stall_s=4, script={"exam/b": ["stall"]})
    dep = deploy("sqlite", llm_max_tokens_per_question=200, llm_timeout_s=20, **PRICES)
    dep.syllabus("exam", [("a", 20), ("b", 20)])
    budget = 0.006  # two calls' worst case (about $0.0026 each) fit; one reply passes it
    assert dep.cli_in_process("enqueue", "exam", "--budget-usd", str(budget)).returncode == 0
    dep.worker(2)
    paused = wait_for(lambda: (lambda r: r if r["state"] == "paused" else None)(
        dep.status("exam")), 60, "the budget to pause the exam", interval_s=0.05)
    assert paused["pause_code"] == "budget", paused["pause_reason"]
    assert set(_in_flight(dep, "exam")) == {"b"}, "paused only once b's call had settled"
    # b's reply is committed, then its worker lets the slice go (a transaction after it):
    # both, before the slices are looked at.
    report = wait_for(lambda: (lambda r: r if r["usage"]["calls_in_flight"] == 0 and all(
        c["lease_owner"] is None for c in r["chapter_list"]) else None)(dep.status("exam")),
        30, "b to settle and its slice to be let go")
    assert report["state"] == "paused" and report["reserved_usd"] == 0
    calls = dep.calls("exam")
    assert [c["chapter_id"] for c in calls] == ["a", "b"] or \
        sorted(c["chapter_id"] for c in calls) == ["a", "b"], dump(calls)
    assert all(c["cost_usd"] >= 2 * c["reserved_usd"] > 0 for c in calls), dump(calls)
    # The bound docs/how-to/budgets-and-limits.md states: spent passes the budget only by what the calls in flight cost
    # beyond their reservations.
    overshoot = sum(max(0.0, c["cost_usd"] - c["reserved_usd"]) for c in calls)
    assert budget < report["spent_usd"] <= budget + overshoot + 1e-9, dump(report)
    assert _sent(mock, "exam") == 2  # nothing sent after the pause, nothing unbooked
    chapters = {c["id"]: c for c in report["chapter_list"]}
    assert all(c["state"] == "pending" and c["attempts_since_progress"] == 0
               for c in chapters.values()), dump(chapters)
    print("\nBUDGET_OVERSHOOT " + json.dumps({
        "budget_usd": budget, "spent_usd": round(report["spent_usd"], 6),
        "overshoot_usd": round(overshoot, 6),
        "cost_over_reserved": [round(c["cost_usd"] / c["reserved_usd"], 2) for c in calls]}))


@pytest.mark.parametrize("database", [  # both databases' checks: test_reservations.py
    "sqlite", pytest.param("postgres", marks=pytest.mark.large)])
def test_no_call_is_sent_after_cancel_returns(deploy, mock, database):
    """Cancel. A real worker generates; `producer cancel` returns; from then on the mock sees
    no new request for the exam. The calls in flight at the cancel are settled by their
    replies, and every request the mock saw is a call of the ledger."""
    mock.configure(latency_s=0.15)
    dep = deploy(database)
    dep.syllabus("exam", [(f"ch-{i}", 40) for i in range(6)])
    assert dep.cli_in_process("enqueue", "exam").returncode == 0
    dep.worker(6)
    wait_for(lambda: dep.status("exam")["questions"]["done"] >= 10, 60, "a few commits")
    result = dep.cli_in_process("cancel", "exam")
    assert result.returncode == 0, result.stderr
    at_cancel = _sent(mock, "exam")
    wait_for(lambda: dep.status("exam")["usage"]["calls_in_flight"] == 0, 30,
             "the calls in flight at the cancel to settle")
    wait_for(lambda: mock.stats()["inflight"] == 0, 30, "the mock to answer them")
    assert _sent(mock, "exam") == at_cancel, "a request reached the mock after cancel returned"
    calls = dep.calls("exam")
    not_sent = [c for c in calls if (c["detail"] or "").startswith("not sent")]
    assert len(calls) - len(not_sent) == at_cancel, dump(calls[-10:])
    report = dep.status("exam")
    assert report["chapters"]["cancelled"] + report["chapters"]["done"] == 6
    assert report["reserved_usd"] == 0
    print("\nCANCEL " + json.dumps({"database": database, "sent": at_cancel,
                                    "recorded_not_sent": len(not_sent)}))
