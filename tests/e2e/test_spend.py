"""Spend and rate control end to end: real Redis, real worker processes, the mock enforcing
OpenAI-style limits, quota and usage. Spend is checked against the mock's own usage log."""

from __future__ import annotations

import json
import math
import time

import pytest

from examforge.errors import PauseCode

from harness import Deployment, assert_stored_exactly_once, dump
from helpers import wait_for
from services import PrivateRedis

pytestmark = pytest.mark.e2e

PROMPT_PRICE, COMPLETION_PRICE = 1.0, 2.0  # USD per million tokens, for these tests
PRICES = {"llm_price_prompt_per_mtok": PROMPT_PRICE,
          "llm_price_completion_per_mtok": COMPLETION_PRICE}


def _bill(usage_log: list[dict]) -> float:
    """What the mock billed: its own token counts of every billed request, at our prices."""
    billed = [u for u in usage_log if u["billed"]]
    return sum(u["prompt_tokens"] * PROMPT_PRICE + u["completion_tokens"] * COMPLETION_PRICE
               for u in billed) / 1_000_000


def _refused(mock) -> int:
    return mock.stats()["outcomes"].get("rate_limited", 0)


def test_three_workers_share_one_rate_limit(deploy, mock):
    """The issue's scenario, smaller: three workers of eight threads against a provider's RPM
    and TPM. Nearly nothing is refused, and the run takes about as long as the limits allow."""
    rpm, tpm = 1200, 240_000
    mock.configure(latency_s=0.2, rpm=rpm, tpm=tpm)
    dep = deploy("sqlite", llm_rpm=rpm, llm_tpm=tpm, llm_max_tokens_per_question=200)
    chapters = 60
    dep.syllabus("exam", [(f"ch-{i:02d}", 5) for i in range(chapters)])
    for _ in range(3):
        dep.worker(8)
    wait_for(lambda: all("ready" in t for t in _logs(dep)), 60, "three workers ready")
    assert dep.cli_in_process("enqueue", "exam").returncode == 0
    report = dep.wait_done("exam", 120)
    assert report["chapters"]["done"] == chapters, dump(report)
    stats = mock.stats()
    admitted = stats["admitted_at"]
    elapsed = admitted[-1] - admitted[0]
    # What the mock charged its TPM bucket: prompt + max_tokens of each request it admitted.
    charged = sum(u["prompt_tokens"] + (u["max_tokens"] or u["completion_tokens"])
                  for u in mock.usage() if u["outcome"] != "rate_limited")
    allowed = max(len(admitted) / (rpm / 60), charged / (tpm / 60))
    refused = _refused(mock)
    print("\nRATELIMIT " + json.dumps({"calls": len(admitted), "refused": refused,
                                        "elapsed_s": round(elapsed, 2),
                                        "allowed_s": round(allowed, 2)}))
    assert refused <= 0.02 * len(admitted), dump(stats["rate_limited_by_type"])
    assert elapsed <= 1.3 * allowed, (elapsed, allowed)
    assert stats["calls_total"] - refused == chapters  # each chapter paid for once


def _logs(dep: Deployment) -> list[str]:
    return [p.read_text(errors="replace") for p in sorted(dep.workdir.glob("worker-*.log"))]


def test_a_budget_stops_the_exam_mid_way_and_a_raised_one_finishes_it(deploy, mock):
    mock.configure(latency_s=0.05)
    # A 10 s deadline, not the harness's 3: the CLI runs in this process, beside the mock's
    # server, and a paid reply it delayed past the deadline would be wasted, not stored.
    dep = deploy("postgres", llm_max_tokens_per_question=200, llm_timeout_s=10, **PRICES)
    dep.syllabus("exam", [(f"ch-{i}", 10) for i in range(10)])
    budget = 0.012  # about half of what the 100 questions cost
    assert dep.cli_in_process("enqueue", "exam", "--budget-usd", str(budget)).returncode == 0
    dep.worker(4)
    dep.worker(4)
    wait_for(lambda: dep.status("exam")["state"] == "paused", 60, "the budget to pause the exam")
    wait_for(lambda: dep.status("exam")["usage"]["calls_in_flight"] == 0, 30, "calls to settle")
    report = dep.status("exam")
    assert report["pause_code"] == PauseCode.budget, report["pause_reason"]
    assert 0 < report["questions"]["done"] < 100
    bill = _bill(mock.usage())
    assert bill <= budget, (bill, budget)  # the provider's own count, not ours
    assert report["cost_usd"] == pytest.approx(bill, abs=1e-9)  # our ledger, to the cent
    status = dep.cli_in_process("status", "exam")
    assert "budget: $0.0120" in status.stdout and "paused" in status.stdout
    paid_before = mock.stats()["calls_total"]

    assert dep.cli_in_process("enqueue", "exam", "--budget-usd", "1").returncode == 0
    report = dep.wait_done("exam", 60)
    assert report["chapters"]["done"] == 10 and report["state"] == "done"  # no longer paused, and finished
    assert_stored_exactly_once(dep, "exam", {f"ch-{i}": 10 for i in range(10)})
    stats = mock.stats()
    assert stats["calls_total"] > paid_before
    # Nothing paid twice, nothing wasted: every paid call stored its questions.
    assert report["usage"]["calls_used"] == stats["calls_total"] == report["usage"]["calls"], \
        dump([c for c in dep.calls("exam") if c["outcome"] != "used"])
    assert report["cost_usd"] == pytest.approx(_bill(mock.usage()), abs=1e-9)


def test_an_exhausted_quota_pauses_the_exam_after_a_handful_of_refusals(deploy, mock):
    mock.configure(latency_s=0.2, quota_tokens=6000)  # runs out after a few calls
    dep = deploy("sqlite")
    dep.syllabus("exam", [(f"ch-{i}", 20) for i in range(40)])
    assert dep.cli_in_process("enqueue", "exam").returncode == 0
    dep.worker(4)
    dep.worker(4)
    wait_for(lambda: dep.status("exam")["state"] == "paused", 60, "the quota to pause the exam")
    time.sleep(3)  # nothing more is asked for once paused
    refused = mock.stats()["outcomes"].get("insufficient_quota", 0)
    report = dep.status("exam")
    assert report["pause_code"] == PauseCode.provider, report["pause_reason"]
    assert "quota" in report["pause_reason"]
    assert 1 <= refused <= 8, refused  # at most the calls already in flight
    assert report["chapters"]["failed"] == 0
    status = dep.cli_in_process("status", "exam")
    assert "resume with: python -m producer resume exam" in status.stdout

    mock.configure(quota_tokens=None)  # the user fixed billing
    resume = dep.cli_in_process("resume", "exam")
    assert resume.returncode == 0, resume.stderr
    report = dep.wait_done("exam", 120)
    assert report["chapters"]["done"] == 40, dump(report)
    assert_stored_exactly_once(dep, "exam", {f"ch-{i}": 20 for i in range(40)})


def test_the_dry_run_estimate_matches_the_real_run(deploy, mock):
    mock.configure(latency_s=0.01)
    dep = deploy("sqlite", migrated=False, llm_max_tokens_per_question=300, **PRICES)
    chapters = [(f"ch-{i}", 17) for i in range(4)]
    dep.syllabus("exam", chapters)
    dry = dep.cli_in_process("enqueue", "exam", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    estimate = json.loads(dry.stdout)
    assert not (dep.workdir / "examforge.db").exists()  # nothing was written
    text = dep.cli_in_process("run", "exam", "--dry-run")
    assert "calls: 16" in text.stdout and "worst case $" in text.stdout
    assert mock.stats()["calls_total"] == 0  # nothing was sent

    run = dep.cli_in_process("run", "exam", "--concurrency", "4", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    report = dep.status("exam")
    usage = report["usage"]
    assert estimate["calls"] == usage["calls"] == 4 * math.ceil(17 / 5)
    # Prompts are counted by the same tokenizer as the mock's; the "do not repeat" lists
    # hold placeholders of typical length in the estimate, real questions in the run.
    assert estimate["prompt_tokens"] == pytest.approx(usage["prompt_tokens"], rel=0.15)
    assert report["cost_usd"] <= estimate["worst_usd"]
    assert estimate["max_completion_tokens"] >= usage["completion_tokens"]
    # A second dry run has seen real calls: its expectation comes from them, and it is close.
    again = json.loads(dep.cli_in_process("enqueue", "exam", "--dry-run", "--json").stdout)
    assert again["calls"] == 0 and again["completion_source"] == "observed in this database"
    per_question = usage["completion_tokens"] / 68
    assert again["completion_per_question"] == pytest.approx(per_question, rel=0.01)


def test_the_limiter_survives_a_redis_restart_and_waits_while_redis_is_down(deploy, mock,
                                                                          tmp_path):
    broker = PrivateRedis(tmp_path).start()
    try:
        rpm = 600
        mock.configure(latency_s=0.2, rpm=rpm)
        dep = deploy("sqlite", broker_url=broker.url, llm_rpm=rpm, reconcile_interval_s=1)
        dep.syllabus("exam", [(f"ch-{i:02d}", 15) for i in range(30)])
        assert dep.cli_in_process("enqueue", "exam").returncode == 0
        dep.worker(8)
        dep.worker(8)
        dep.beat()
        wait_for(lambda: dep.status("exam")["questions"]["done"] >= 60, 60, "some progress")
        broker.stop()
        down_at = time.monotonic()
        time.sleep(3)
        sent_while_down = mock.stats()["calls_total"]
        time.sleep(2)
        # Nothing unaccounted for: with its limiter unreachable no worker sends anything new
        # (calls admitted just before the outage may still be on their way).
        assert mock.stats()["calls_total"] - sent_while_down <= 2
        broker.start()
        report = dep.wait_done("exam", 120)
        assert time.monotonic() - down_at < 120
        assert report["chapters"]["done"] == 30, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "exam", {f"ch-{i:02d}": 15 for i in range(30)})
        assert _refused(mock) <= 0.02 * mock.stats()["admitted_total"] + 2
        assert "rate limiter unreachable" in dep.worker_logs(None)
    finally:
        broker.stop()
