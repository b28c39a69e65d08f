"""Cost. Cost equals the bill to 1e-6 with cached tokens at their price: `producer run` (a real
process) against the mock caching prompt prefixes as OpenAI does, on both databases. The bill
is the mock's own usage log, priced here apart from examforge's code."""

from __future__ import annotations

import pytest

from harness import dump

pytestmark = pytest.mark.e2e

# ~2,000 tokens of guidance: the prompt's fixed head is over OpenAI's 1024-token minimum, so a
# chapter's calls after its first read it from the mock's prompt cache.
GUIDANCE = "Services in scope: " + "EC2, S3, RDS, IAM, VPC, ELB, EBS, EFS, KMS, SQS, " * 75


def _library_prices(model: str) -> tuple[float, float, float]:
    """genai-prices' own figures for `model` (prompt, completion, cached), read here directly."""
    from genai_prices import Usage, calc_price

    mp = calc_price(Usage(input_tokens=0, output_tokens=0), model).model_price
    return float(mp.input_mtok), float(mp.output_mtok), float(mp.cache_read_mtok)


def _bill(usage_log: list[dict], prompt: float, completion: float, cached: float) -> float:
    return sum((u["prompt_tokens"] - u["cached_tokens"]) * prompt + u["cached_tokens"] * cached
               + u["completion_tokens"] * completion
               for u in usage_log if u["billed"]) / 1_000_000


@pytest.mark.parametrize(("database", "settings"), [
    # The model's prices from genai-prices' data, its cached price included.
    ("sqlite", {"llm_model": "gpt-4o-mini"}),
    # The LLM_PRICE_* settings, a cached price among them.
    ("postgres", {"llm_model": "mock-model", "llm_price_prompt_per_mtok": 1.0,
                  "llm_price_completion_per_mtok": 2.0,
                  "llm_price_cached_prompt_per_mtok": 0.25}),
])
def test_cost_equals_the_bill_with_cached_tokens_at_their_price(deploy, mock, database, settings):
    mock.configure(latency_s=0)
    # A deadline no loaded machine reaches: a reply past it is booked at its worst case, above
    # the bill, which is right, and not what this test compares.
    dep = deploy(database, llm_timeout_s=60, **settings)
    dep.syllabus("exam", {"title": "Cached exam", "chapters": [
        {"id": f"ch-{i}", "title": f"Chapter {i}", "questions": 15, "prompt": GUIDANCE}
        for i in range(2)]})
    run = dep.cli_in_process("run", "exam", "-c", "2", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    report = dep.status("exam")
    assert report["chapters"]["done"] == 2, dump(report)
    if "llm_price_prompt_per_mtok" in settings:
        prices = (1.0, 2.0, 0.25)
    else:
        prices = _library_prices(settings["llm_model"])
        assert prices[2] < prices[0]  # the data has a cached discount for this model
    usage = mock.usage()
    billed_cached = sum(u["cached_tokens"] for u in usage if u["billed"])
    assert billed_cached > 0, "the mock cached nothing: the test checks nothing"
    bill = _bill(usage, *prices)
    # The exam's cost in the database (status, the call rows, the exam's spent) is the bill.
    assert report["cost_usd"] == pytest.approx(bill, abs=1e-6), (report["cost_usd"], bill)
    calls = dep.calls("exam")
    assert sum(c["cost_usd"] for c in calls) == pytest.approx(bill, abs=1e-6)
    assert report["spent_usd"] == pytest.approx(bill, abs=1e-6)
    # The cached tokens on the rows and in status are the mock's.
    assert sum(c["cached_tokens"] for c in calls) == billed_cached
    assert report["usage"]["cached_tokens"] == billed_cached
    assert f"({billed_cached} of them cached)" in dep.cli_in_process("status", "exam").stdout
    assert report["usage"]["prompt_tokens"] == sum(u["prompt_tokens"] for u in usage if u["billed"])
