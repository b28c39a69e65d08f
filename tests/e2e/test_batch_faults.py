"""Batch mode's provider faults with real processes (issue 18): one `producer run SLUG
--batch` whose first create's reply is lost after the batch exists, whose batch is then pushed
past the first page of the provider's list by 150 newer batches of another client, and which
expires with part of its lines done. The run adopts its batch (never creating it twice), keeps
what the expired batch finished, retries the rest in later batches, and books exactly what the
mock bills at the discount, batch by batch as the batch objects' `usage` says."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from harness import assert_stored_exactly_once, dump
from helpers import mock_batches, mock_custom_ids, wait_for

CHAPTERS = [(c, 5) for c in "abcd"]  # QUESTIONS_PER_CALL=5: one line a chapter
TARGETS = dict(CHAPTERS)
PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}


def _batches(mock) -> list[dict[str, Any]]:
    return mock_batches(mock.base_url)


def _ours(mock) -> list[dict[str, Any]]:
    return [b for b in _batches(mock) if "examforge_submission" in (b.get("metadata") or {})]


def _custom_ids(mock, batch: dict[str, Any]) -> list[str]:
    return mock_custom_ids(mock.base_url, batch)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_run_batch_adopts_past_a_lost_reply_and_100_newer_batches_and_retries_an_expiry(
        deploy, mock, database):
    # Each line takes 0.4 s, the batch expires 1 s after its creation: one or two of the
    # four lines finish, the others come back batch_expired.
    mock.configure(batch_create_lost=1, batch_request_s=0.4, batch_expire_after_s=1.0)
    dep = deploy(database, batch_poll_s=0.3, batch_submit_lease_s=6, batch_http_timeout_s=3,
                 retry_base_s=0.05, retry_max_s=0.2, **PRICES)
    dep.syllabus("bx", CHAPTERS)
    proc = dep.spawn_cli("run", "bx", "--batch")
    [first] = wait_for(lambda: _ours(mock), 30, "the first batch to exist at the provider")
    mock.seed_batches(150)  # another client's, newer: ours is on the second page
    wait_for(lambda: httpx.get(f"{mock.base_url}/batches/{first['id']}").json()["status"]
             == "expired", 30, "the first batch to expire")
    mock.configure(batch_request_s=0.01, batch_expire_after_s=None)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out.decode(errors="replace")
    assert "20/20 questions" in out.decode(errors="replace")

    assert_stored_exactly_once(dep, "bx", TARGETS)
    rows = dep.store.exam_batches("bx")  # newest first
    adopted = rows[-1]
    # Adopted after the listing paged past the 150 newer batches: created once.
    assert adopted.provider_batch_id == first["id"] and adopted.create_attempts == 1
    assert adopted.provider_status == "expired"
    calls = dep.calls("bx")
    in_first = [c for c in calls if c["worker"] == adopted.owner]
    finished = [c for c in in_first if c["outcome"] == "used"]
    expired = [c for c in in_first if c["outcome"] == "failed"]
    assert finished and expired and len(in_first) == 4, dump(calls)
    assert {c["reason"] for c in expired} == {"batch_expired"}
    assert all(c["cost_usd"] == 0 for c in expired)
    # The finished lines were kept, never asked again; the rest went to later batches.
    used = [c for c in calls if c["outcome"] == "used"]
    assert len(used) == 4 and {c["chapter_id"] for c in used} == set(TARGETS), dump(calls)
    assert len(rows) >= 2 and all(r.provider_status == "completed" for r in rows[:-1])
    # No custom_id in two batches; every one names a call of the ledger.
    ours = _ours(mock)
    assert len(ours) == len(rows)
    ids = [cid for b in ours for cid in _custom_ids(mock, b)]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(f"call-{c['id']}" for c in calls)
    # Paid lines are the used calls, each booked at the discount of what the mock logged.
    paid = {int(u["custom_id"].split("-")[1]): u
            for u in mock.usage() if u.get("batch") and u.get("paid")}
    assert sorted(paid) == sorted(c["id"] for c in used)
    for c in used:
        u = paid[c["id"]]
        assert (c["prompt_tokens"], c["completion_tokens"]) == (u["prompt_tokens"],
                                                                u["completion_tokens"])
        assert c["cost_usd"] == pytest.approx(
            (u["prompt_tokens"] * 1.0 + u["completion_tokens"] * 4.0) / 1e6 * 0.5)
    # And each batch's own usage object agrees with the ledger.
    for row in rows:
        mine = [c for c in used if c["worker"] == row.owner]
        assert row.usage is not None, row
        assert (row.usage["input_tokens"], row.usage["output_tokens"]) == (
            sum(c["prompt_tokens"] for c in mine), sum(c["completion_tokens"] for c in mine))
