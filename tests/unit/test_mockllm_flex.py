"""The mock's service tiers: ``service_tier`` validated and echoed as OpenAI does, flex slower and
sometimes refused with its unbilled 429 "resource unavailable"."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from mockllm import MockServer
from mockllm.usage import UsageLog, UsageRecord
from mockllm_support import chat


def _log(server: MockServer) -> UsageLog:
    log = UsageLog()
    for record in server.usage():
        log.add(UsageRecord.from_dict(record))
    return log


@pytest.mark.parametrize("asked, served", [(None, "default"), ("auto", "default"), ("default", "default"),
                                           ("scale", "default"), ("flex", "flex"), ("priority", "priority")])
def test_the_reply_and_the_usage_log_name_the_tier_that_served(
        server: MockServer, client: httpx.Client, asked: str | None, served: str) -> None:
    extra: dict[str, Any] = {} if asked is None else {"service_tier": asked}
    reply = chat(client, **extra)
    assert reply.status_code == 200 and reply.json()["service_tier"] == served
    [record] = server.usage()
    assert record["service_tier"] == served and record["billed"] and record["paid"]


@pytest.mark.parametrize("value, code", [("fast", "invalid_value"), ("FLEX", "invalid_value"), (1, "invalid_type")])
def test_an_unknown_tier_is_a_400_naming_service_tier(server: MockServer, client: httpx.Client, value: Any,
                                                      code: str) -> None:
    reply = chat(client, service_tier=value)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "service_tier" and error["code"] == code
    assert "'auto', 'default', 'flex', 'scale', and 'priority'" in error["message"]
    assert not any(r["billed"] for r in server.usage())


def test_flex_refused_for_capacity_is_an_unbilled_429(server: MockServer, client: httpx.Client) -> None:
    # A scripted fault stays for the next served call: a refusal draws no outcome. The tight
    # rate limit shows a refusal charges none of it either.
    server.configure(flex_unavailable_rate=1.0, script={"aws-saa/ch-1": ["500"]}, rpm=60, burst_fraction=0.02)
    refused = chat(client, service_tier="flex")
    assert refused.status_code == 429 and "retry-after" not in refused.headers
    error = refused.json()["error"]
    assert error["code"] == "resource_unavailable" and error["type"] == "rate_limit_error"
    assert error["message"].startswith("Resource unavailable") and error["param"] is None
    # Other tiers are served: only flex lacks capacity.
    assert chat(client, service_tier="auto").status_code == 500
    assert chat(client).status_code == 429  # the rate limit: one request in the bucket, taken by the 500
    records = server.usage()
    assert [(r["status"], r["outcome"], r["service_tier"], r["billed"]) for r in records] == [
        (429, "resource_unavailable", "flex", False), (500, "500", "default", False),
        (429, "rate_limited", "default", False)]
    assert server.stats()["outcomes"]["resource_unavailable"] == 1


def test_a_share_of_flex_calls_is_refused_and_the_draws_are_seeded(server: MockServer,
                                                                    client: httpx.Client) -> None:
    server.configure(flex_unavailable_rate=0.5)
    first = [chat(client, service_tier="flex").status_code for _ in range(40)]
    assert set(first) == {200, 429} and 8 <= first.count(429) <= 32
    server.reset()
    assert [chat(client, service_tier="flex").status_code for _ in range(40)] == first
    stats = server.stats()
    assert stats["billed_calls"] == first.count(200)
    assert stats["billed_flex_tokens"] == stats["billed_tokens"] > 0


def test_flex_takes_flex_latency_factor_times_the_latency(server: MockServer, client: httpx.Client) -> None:
    server.configure(latency_s=0.1, flex_latency_factor=6)

    def timed(**extra: Any) -> float:
        started = time.monotonic()
        assert chat(client, **extra).status_code == 200
        return time.monotonic() - started

    assert timed(service_tier="flex") >= 0.6
    assert timed(service_tier="default") < 0.45
    assert timed(service_tier="priority") < 0.45


def test_the_bill_prices_flex_at_its_factor(server: MockServer, client: httpx.Client) -> None:
    chat(client)
    chat(client, service_tier="flex")
    log = _log(server)
    default, flex = (r for r in log.records)
    full = log.bill_usd(2.0, 8.0, 1.0)
    assert log.bill_usd(2.0, 8.0, 1.0, flex_factor=0.5) == pytest.approx(
        full - 0.5 * (flex.prompt_tokens * 2.0 + flex.completion_tokens * 8.0) / 1e6)
    assert default.service_tier == "default"


@pytest.mark.parametrize("field, value", [("flex_unavailable_rate", 1.5), ("flex_unavailable_rate", -0.1),
                                          ("flex_latency_factor", -1)])
def test_flex_settings_are_validated(server: MockServer, field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        server.configure(**{field: value})
