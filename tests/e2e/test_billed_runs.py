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


BROKEN = ("malformed", "fenced", "wrong_schema", "bad_choices", "bad_index", "empty")


# PostgreSQL only here: the booking of every billed reply (cut bodies, list content, unusable
# 200s) runs on both databases in tests/integration/test_billed_ledger.py.
@pytest.mark.parametrize("database", ["postgres"])
def test_every_billed_reply_is_booked_and_none_is_wasted_on_broken_json(deploy, mock, database):
    """Two cases of the issue in one run (each run's processes take most of its time): a share
    of the replies cut after their headers or sent as content parts, and 30 % of the others
    broken (JSON and schema faults, which the schema prevents, and 500s, which it does not)."""
    chapters = [(f"ch-{i}", 10) for i in range(8)]
    mock.configure(latency_s=0.02, fault_rate=0.3, seed=16,
                   faults=["cut", "list_content", *BROKEN, "500"],
                   script={"exam/ch-0": ["cut", "malformed", "cut"],
                           "exam/ch-1": ["500", "list_content", "wrong_schema"]})
    # A 6 s deadline (3 s by default here): on a loaded machine a whole reply once came after
    # 3 s, the client booked it as a deadline at its worst case, and the mock, which bills only
    # a reply it delivers, did not (21 calls booked against 20 billed). A real provider bills
    # it: the mock's side of that is noted, not fixed, here.
    dep = deploy(database, llm_response_format="json_schema", llm_max_tokens_per_question=200,
                 reconcile_interval_s=1, retry_base_s=0.1, llm_timeout_s=6, **PRICES)
    dep.syllabus("exam", chapters)
    assert dep.cli_in_process("enqueue", "exam", "--budget-usd", "50").returncode == 0
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
    billed = [u for u in usage if u["billed"]]
    assert len([c for c in calls if c["outcome"] != "failed"]) == len(billed), dump(calls)
    booked_cut = [c for c in calls if c["reason"] == ErrorKind.reply_cut]
    assert len(booked_cut) == len(cut) == stats["billed_undelivered_calls"], dump(booked_cut)
    assert all(c["outcome"] == "wasted" and c["usage_estimated"]
               and c["completion_tokens"] == c["max_tokens"] for c in booked_cut)
    assert sum(c["cost_usd"] for c in booked_cut) >= _bill(cut) - 1e-9
    # The exam's cost, and what its budget counts, never below the provider's bill.
    bill = _bill(usage)
    print("\nBILLED " + json.dumps({"database": database, "calls": len(calls), "cut": len(cut),
                                     "list_content": len(parts), "bill_usd": round(bill, 6),
                                     "cost_usd": round(report["cost_usd"], 6),
                                     "schema_prevented": stats["schema_prevented"]}))
    assert report["cost_usd"] >= bill - 1e-9, (report["cost_usd"], bill)
    assert report["spent_usd"] == pytest.approx(report["cost_usd"])
    assert report["reserved_usd"] == 0 and report["usage"]["calls_in_flight"] == 0
    # Under the schema, no call was wasted on broken JSON, though the faults were drawn.
    broken = [c for c in calls if c["outcome"] == "wasted"
              and (c["detail"] or "").startswith(("malformed_json", "wrong_schema", "empty"))]
    assert broken == [], dump(broken)
    assert stats["schema_prevented"] >= 2 and stats["outcomes"].get("500", 0) >= 1, dump(stats)
