"""Flex (issue 18): an exam generated at LLM_SERVICE_TIER=flex against the mock refusing a share
of flex calls with OpenAI's 429 "Resource unavailable". Real processes (`producer run`, and
`enqueue` + a Celery worker), on both databases: the exam finishes, never pauses, no chapter
fails at an attempt cap of two, and its booked cost is the mock's usage log priced at the flex
factor, priced here apart from examforge's code."""

from __future__ import annotations

import pytest

from harness import dump

pytestmark = pytest.mark.e2e

PRICES = (1.0, 2.0, 0.25)  # prompt, completion, cached prompt: USD per million tokens
FLEX_FACTOR = 0.5


def _bill(usage_log: list[dict], factor: float) -> float:
    prompt, completion, cached = PRICES
    return factor * sum((u["prompt_tokens"] - u["cached_tokens"]) * prompt
                        + u["cached_tokens"] * cached + u["completion_tokens"] * completion
                        for u in usage_log if u["billed"]) / 1_000_000


@pytest.mark.parametrize(("database", "mode"), [("sqlite", "run"), ("postgres", "worker")])
def test_a_flex_exam_finishes_never_pauses_and_costs_the_bill_at_the_flex_price(
        deploy, mock, database, mode):
    mock.configure(latency_s=0.01, flex_latency_factor=3.0, flex_unavailable_rate=0.4)
    dep = deploy(database, llm_service_tier="flex", llm_price_prompt_per_mtok=PRICES[0],
                 llm_price_completion_per_mtok=PRICES[1],
                 llm_price_cached_prompt_per_mtok=PRICES[2],
                 # Counted, 40 % refusals would fail most chapters at two attempts.
                 max_attempts=2, retry_base_s=0.05, retry_max_s=0.4, llm_flex_timeout_s=20)
    dep.syllabus("exam", [(f"ch-{i}", 15) for i in range(4)])
    if mode == "run":
        run = dep.cli_in_process("run", "exam", "-c", "2", timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]
        report = dep.status("exam")
    else:
        assert dep.cli_in_process("enqueue", "exam").returncode == 0
        dep.worker(4)
        report = dep.wait_done("exam", 150)
    assert report["chapters"]["done"] == 4 and report["chapters"]["failed"] == 0, dump(report)
    assert report["state"] != "paused" and report["pause_reason"] is None, dump(report)
    assert report["questions"] == {"target": 60, "done": 60}

    usage = mock.usage()
    # Every request asked for flex; the mock refused some with its unbilled 429.
    assert {u["service_tier"] for u in usage} == {"flex"}
    refused = [u for u in usage if u["status"] == 429 and u["outcome"] == "resource_unavailable"]
    assert refused and not any(u["billed"] for u in refused), "no refusal: the test checks nothing"
    calls = dep.calls("exam")
    failed = [c for c in calls if c["reason"] == "resource_unavailable"]
    assert len(failed) == len(refused)
    assert all(c["outcome"] == "failed" and c["cost_usd"] == 0 and c["status_code"] == 429
               for c in failed)
    # Every billed call is booked at the flex tier the reply reported, at half the price.
    billed = [u for u in usage if u["billed"]]
    booked = [c for c in calls if c["outcome"] in ("used", "wasted")]
    assert len(booked) == len(billed) and {c["service_tier"] for c in booked} == {"flex"}
    bill = _bill(usage, FLEX_FACTOR)
    assert bill > 0
    assert sum(c["cost_usd"] for c in calls) == pytest.approx(bill, abs=1e-6)
    assert report["cost_usd"] == pytest.approx(bill, abs=1e-6)
    assert report["spent_usd"] == pytest.approx(bill, abs=1e-6)
    assert report["cost_usd"] == pytest.approx(_bill(usage, 1.0) * FLEX_FACTOR, abs=1e-6)
    # The mock's own bill at its flex factor says the same.
    assert report["usage_by_tier"]["flex"]["cost_usd"] == pytest.approx(bill, abs=1e-6)
    assert "by service tier: flex" in dep.cli_in_process("status", "exam").stdout
