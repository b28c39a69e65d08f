"""The third story's fallback, end to end: the local model server is down (nothing listens on
its port), so real workers send every call to the cloud endpoint instead, with its own key,
model and prices, and the exam completes with each question stored once and paid once."""

from __future__ import annotations

import pytest

from harness import assert_stored_exactly_once, dump
from services import free_port

pytestmark = pytest.mark.e2e


def test_workers_fall_back_to_the_second_endpoint_while_the_first_is_unreachable(deploy, mock):
    mock.configure(api_key="sk-cloud-key")  # the mock plays the cloud API
    dep = deploy(
        "sqlite",
        llm_base_url=f"http://127.0.0.1:{free_port()}/v1",  # the local server, down
        llm_api_key="sk-local-key", llm_model="llama3",
        llm_fallback_base_url=mock.base_url, llm_fallback_api_key="sk-cloud-key",
        llm_fallback_model="cloud-model", llm_connect_timeout_s=1,
        llm_fallback_price_prompt_per_mtok=1_000_000, llm_fallback_price_completion_per_mtok=0)
    chapters = {"a": 10, "b": 10, "c": 5}
    dep.syllabus("demo", list(chapters.items()))
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    dep.worker(3)
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 3, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "demo", chapters)
    # 25 questions at 5 per call: 5 calls, each paid once, all at the fallback.
    assert mock.stats()["calls_total"] == 5 == report["usage"]["calls"]
    assert report["usage"]["calls_failed"] == 0 and report["usage"]["calls_wasted"] == 0
    assert {q["model"] for q in dep.store.questions("demo")} == {"cloud-model"}
    # Priced at the fallback's rate: $1 per prompt token here, so cost equals prompt tokens.
    assert report["cost_usd"] == pytest.approx(report["usage"]["prompt_tokens"])
    assert "using the fallback" in dep.worker_logs(tail_chars=None)
    # The ledger says which endpoint served each call, so each bill can be matched.
    assert {c["endpoint"] for c in dep.calls("demo")} == {"fallback"}
    assert report["usage_by_endpoint"] == {"fallback": {
        "calls": 5, "prompt_tokens": report["usage"]["prompt_tokens"],
        "completion_tokens": report["usage"]["completion_tokens"],
        "cost_usd": report["cost_usd"], "cached_tokens": report["usage"]["cached_tokens"]}}
    table = dep.cli_in_process("status", "demo").stdout
    assert "by endpoint: fallback 5 calls" in table


def test_local_mode_falls_back_too(deploy, mock):
    dep = deploy("sqlite", llm_base_url=f"http://127.0.0.1:{free_port()}/v1",
                 llm_fallback_base_url=mock.base_url, llm_fallback_api_key="sk-e2e")
    dep.syllabus("demo", [("a", 10)])
    run = dep.cli_in_process("run", "demo", "--concurrency", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert_stored_exactly_once(dep, "demo", {"a": 10})
    assert mock.stats()["calls_total"] == 2
