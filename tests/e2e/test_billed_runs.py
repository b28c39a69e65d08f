"""Issue 16 end to end, with real Redis, worker processes and the mock: a billed reply is booked
at what it cost (cut bodies, list content), and a JSON schema leaves no call wasted on broken
JSON. The mock's own usage log is the bill."""

from __future__ import annotations

import json

import pytest

from examforge.errors import ErrorKind
from harness import assert_stored_exactly_once, dump

pytestmark = pytest.mark.e2e

PROMPT_PRICE, COMPLETION_PRICE = 1.0, 2.0  # USD per million tokens, for these tests
PRICES = {"llm_price_prompt_per_mtok": PROMPT_PRICE,
          "llm_price_completion_per_mtok": COMPLETION_PRICE}


def _bill(records: list[dict]) -> float:
    return sum(u["prompt_tokens"] * PROMPT_PRICE + u["completion_tokens"] * COMPLETION_PRICE
               for u in records if u["billed"]) / 1_000_000


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_cut_and_list_content_replies_are_all_booked_and_every_chapter_done(deploy, mock,
                                                                            database):
    chapters = [(f"ch-{i}", 10) for i in range(8)]
    # A share of the replies cut after their headers or in parts, and at least one of each.
    mock.configure(latency_s=0.02, fault_rate=0.3, faults=["cut", "list_content"], seed=16,
                   script={"exam/ch-0": ["cut", "cut"], "exam/ch-1": ["list_content"]})
    dep = deploy(database, llm_max_tokens_per_question=200, reconcile_interval_s=1,
                 retry_base_s=0.1, **PRICES)
    dep.syllabus("exam", chapters)
    assert dep.cli("enqueue", "exam", "--budget-usd", "50").returncode == 0
    dep.worker(4)
    dep.beat()
    report = dep.wait_done("exam", 90)
    assert report["chapters"]["done"] == len(chapters), dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "exam", dict(chapters))
    usage, stats, calls = mock.usage(), mock.stats(), dep.calls("exam")
    cut = [u for u in usage if u["outcome"] == "cut"]
    parts = [u for u in usage if u["outcome"] == "list_content"]
    assert len(cut) >= 2 and len(parts) >= 1, dump(stats["outcomes"])
    # Every request the mock billed has its ledger row; a cut one is wasted at its worst case.
    assert len(calls) == stats["billed_calls"] == stats["calls_total"], dump(calls)
    booked_cut = [c for c in calls if c["reason"] == ErrorKind.reply_cut]
    assert len(booked_cut) == len(cut) == stats["billed_undelivered_calls"], dump(booked_cut)
    assert all(c["outcome"] == "wasted" and c["usage_estimated"]
               and c["completion_tokens"] == c["max_tokens"] for c in booked_cut)
    assert sum(c["cost_usd"] for c in booked_cut) >= _bill(cut) - 1e-9
    # List content was read: each such reply stored its questions.
    assert report["usage"]["calls_used"] == len(calls) - len(booked_cut)
    # The exam's cost, and what its budget counts, never below the provider's bill.
    bill = _bill(usage)
    print("\nBILLED " + json.dumps({"database": database, "calls": len(calls), "cut": len(cut),
                                     "list_content": len(parts), "bill_usd": round(bill, 6),
                                     "cost_usd": round(report["cost_usd"], 6)}))
    assert report["cost_usd"] >= bill - 1e-9, (report["cost_usd"], bill)
    assert report["spent_usd"] == pytest.approx(report["cost_usd"])
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0


BROKEN = ("malformed", "fenced", "wrong_schema", "bad_choices", "bad_index", "empty")


def test_no_call_is_wasted_on_broken_json_under_a_json_schema(deploy, mock):
    # The mock breaks 30 % of its replies: broken JSON and wrong schemas, which a schema
    # prevents, and errors and short replies, which it does not.
    mock.configure(latency_s=0.02, fault_rate=0.3, seed=7,
                   faults=[*BROKEN, "500", "429", "short", "duplicate"], retry_after_s=0,
                   script={"exam/ch-0": ["malformed", "500"], "exam/ch-1": ["wrong_schema", "429"]})
    dep = deploy("sqlite", llm_response_format="json_schema", retry_base_s=0.1,
                 reconcile_interval_s=1, max_reasks=6)
    chapters = [(f"ch-{i}", 10) for i in range(8)]
    dep.syllabus("exam", chapters)
    assert dep.cli("enqueue", "exam").returncode == 0
    dep.worker(4)
    dep.beat()
    report = dep.wait_done("exam", 90)
    assert report["chapters"]["done"] == len(chapters), dump(report) + dep.worker_logs()
    broken = [c for c in dep.calls("exam") if c["outcome"] == "wasted"
              and (c["detail"] or "").startswith(("malformed_json", "wrong_schema", "empty"))]
    assert broken == [], dump(broken)
    stats = mock.stats()
    assert stats["schema_prevented"] > 0, dump(stats)  # the faults were drawn, and prevented
    assert stats["outcomes"].get("500", 0) + stats["outcomes"].get("429", 0) > 0
