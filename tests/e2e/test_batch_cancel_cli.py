"""Batch mode watched and cancelled with real processes (issue 18): `producer run SLUG
--batch` in one process, `status --json` and `cancel` in others. The batch in flight shows in
status with its counts and expiry, cancel reaches the provider (the mock), the run process
then books what the batch finished and exits, and every paid line is a stored call."""

from __future__ import annotations

import json
from typing import Any

import httpx

from harness import dump
from helpers import wait_for

CHAPTERS = [(c, 5) for c in "abcdef"]  # QUESTIONS_PER_CALL=5: one batch of 6 lines


def test_cancel_from_another_process_stops_run_batch_and_keeps_what_the_batch_finished(
        deploy, mock):
    mock.configure(batch_request_s=2.0)
    dep = deploy("sqlite", batch_poll_s=0.3, batch_submit_lease_s=10, batch_http_timeout_s=3)
    dep.syllabus("bx", CHAPTERS)
    runner = dep.spawn_cli("run", "bx", "--batch")

    def in_flight() -> dict[str, Any] | None:
        status = dep.cli_in_process("status", "bx", "--json")
        if status.returncode != 0:
            return None
        data = json.loads(status.stdout)
        live = [b for b in data.get("batches", []) if b["live"] and b["id"]]
        return data if live and live[0]["requests"]["completed"] >= 1 and \
            live[0]["status"] == "in_progress" else None

    data = wait_for(in_flight, 60, "a batch in progress in status --json", interval_s=0.3)
    # The lines left now take 5 s each: the batch is surely still running when the cancel,
    # a process that may take seconds to start on a busy machine, reaches the mock.
    mock.configure(batch_request_s=5.0)
    [batch] = data["batches"]
    assert batch["requests"]["total"] == 6 and batch["expires_at"] > batch["created_at"]
    assert all(ch["waiting_on"] for ch in data["chapter_list"] if ch["state"] == "running")
    cancel = dep.cli_in_process("cancel", "bx")
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert f"cancelling 1 provider batch of bx: {batch['id']}" in cancel.stdout
    # The runner books the cancelled batch and ends: nothing is left to do.
    out, _ = runner.communicate(timeout=60)
    # Cancelled chapters: exit 7 (producer.exits), only a finished exam exits 0.
    assert runner.returncode == 7, out.decode(errors="replace")
    assert httpx.get(f"{mock.base_url}/batches/{batch['id']}").json()["status"] == "cancelled"
    calls = dep.calls("bx")
    used = [c for c in calls if c["outcome"] == "used"]
    assert len(calls) == 6 and used, dump(calls)
    assert all(c["outcome"] == "failed" and c["reason"] == "batch_cancelled"
               and c["cost_usd"] == 0 for c in calls if c["outcome"] != "used"), dump(calls)
    paid = [u for u in mock.usage() if u.get("batch") and u.get("paid")]
    assert sorted(int(u["custom_id"].split("-")[1]) for u in paid) == [c["id"] for c in used]
    assert len(dep.store.questions("bx")) == 5 * len(used)
    assert len(httpx.get(f"{mock.base_url}/batches").json()["data"]) == 1  # none submitted again
    status = dep.cli_in_process("status", "bx")
    assert "waiting on" not in status.stdout and "cancelled" in status.stdout
