"""Batch mode with real processes (issue 18): `producer run SLUG --batch` SIGKILLed at each
step of a submission, then started again. Whatever the step, no custom_id is ever in two
provider batches, every question is stored once, and the mock's paid batch lines are exactly
the calls the exam needed. Also `enqueue --batch` with a Celery worker and beat.

The kills after the upload and after the create use the test hook EXAMFORGE_TEST_BATCH_CRASH
(runner.batching._test_hook: the process SIGKILLs itself at that step); the kill while the
create is in flight uses the mock's batch_create_delay_s and a SIGKILL from here."""

from __future__ import annotations

from typing import Any

import pytest

from harness import assert_stored_exactly_once, dump
from helpers import mock_batches, mock_custom_ids, wait_for

CHAPTERS = [("a", 12), ("b", 5)]  # QUESTIONS_PER_CALL=5: a takes 3 calls, b 1
TARGETS = dict(CHAPTERS)
BATCH_ENV = {"batch_poll_s": 0.3, "batch_submit_lease_s": 6, "batch_http_timeout_s": 3}


def _batches(mock) -> list[dict[str, Any]]:
    return mock_batches(mock.base_url)


def _custom_ids(mock, batch: dict[str, Any]) -> list[str]:
    return mock_custom_ids(mock.base_url, batch)


def _check(dep, mock) -> None:
    assert_stored_exactly_once(dep, "bx", TARGETS)
    ids = [cid for b in _batches(mock) for cid in _custom_ids(mock, b)]
    assert len(ids) == len(set(ids)), f"a custom_id in two batches: {ids}"
    calls = dep.calls("bx")
    used = [c for c in calls if c["outcome"] == "used"]
    paid = [u for u in mock.usage() if u.get("batch") and u.get("paid")]
    # Every paid line is a used call (none paid twice, none thrown away), and the exam
    # needed exactly these: ceil(12/5) + ceil(5/5).
    assert sorted(int(u["custom_id"].split("-")[1]) for u in paid) == sorted(
        c["id"] for c in used), dump(calls)
    assert len(used) == 4, dump(calls)


def _run_to_end(dep, timeout_s: float = 90) -> None:
    done = dep.cli_in_process("run", "bx", "--batch", timeout=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "17/17 questions" in done.stdout


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
@pytest.mark.parametrize("step", ["after_upload", "before_create", "after_create"])
def test_run_batch_killed_at_a_step_of_the_submission_resumes_exactly_once(deploy, mock, step,
                                                                           database):
    dep = deploy(database, **BATCH_ENV)
    dep.syllabus("bx", CHAPTERS)
    proc = dep.spawn_cli("run", "bx", "--batch", EXAMFORGE_TEST_BATCH_CRASH=step)
    assert proc.wait(timeout=60) == -9, proc.stdout.read().decode() if proc.stdout else ""
    (row,) = dep.store.exam_batches("bx")
    assert row.state == {"after_upload": "uploaded", "before_create": "creating",
                         "after_create": "creating"}[step]
    created = _batches(mock)
    assert len(created) == (1 if step == "after_create" else 0)
    _run_to_end(dep)
    (row,) = dep.store.exam_batches("bx")
    assert row.state == "done" and row.provider_status == "completed"
    # Created once: adopted after the lost reply, created by the recovery otherwise.
    assert len(_batches(mock)) == 1 and row.create_attempts == (
        1 if step in ("after_upload", "after_create") else 2)
    _check(dep, mock)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_run_batch_killed_while_the_create_is_in_flight_adopts_the_batch(deploy, mock, database):
    dep = deploy(database, **BATCH_ENV)
    dep.syllabus("bx", CHAPTERS)
    mock.configure(batch_create_delay_s=30)
    proc = dep.spawn_cli("run", "bx", "--batch")
    wait_for(lambda: _batches(mock), 30, "the batch to exist at the provider")
    dep.kill(proc)  # its create's reply is still held by the mock
    mock.configure(batch_create_delay_s=0)
    (row,) = dep.store.exam_batches("bx")
    assert row.state == "creating" and row.provider_batch_id is None
    _run_to_end(dep)
    (row,) = dep.store.exam_batches("bx")
    assert row.create_attempts == 1 and len(_batches(mock)) == 1
    _check(dep, mock)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_enqueue_batch_with_a_worker_and_beat(deploy, mock, database):
    dep = deploy(database, **BATCH_ENV)
    dep.syllabus("bx", CHAPTERS)
    dep.worker(4)
    dep.beat()
    enq = dep.cli_in_process("enqueue", "bx", "--batch")
    assert enq.returncode == 0, enq.stdout + enq.stderr
    assert "batch mode" in enq.stdout
    report = dep.wait_done("bx", timeout_s=90)
    assert report["chapters"]["done"] == 2, dump(report)
    # No chapter task ever ran: every call is a batch line.
    assert all(c["worker"].startswith("batch/") for c in dep.calls("bx"))
    _check(dep, mock)


def test_a_worker_killed_before_the_create_is_recovered_by_another(deploy, mock):
    dep = deploy("postgres", **BATCH_ENV)
    dep.syllabus("bx", CHAPTERS)
    doomed = dep.worker(2, EXAMFORGE_TEST_BATCH_CRASH="before_create")
    enq = dep.cli_in_process("enqueue", "bx", "--batch")
    assert enq.returncode == 0, enq.stdout + enq.stderr
    assert doomed.wait(timeout=60) == -9, dep.worker_logs()
    (row,) = dep.store.exam_batches("bx")
    assert row.state == "creating" and not _batches(mock)
    dep.worker(2)
    dep.beat()
    report = dep.wait_done("bx", timeout_s=90)
    assert report["chapters"]["done"] == 2, dump(report)
    (row,) = dep.store.exam_batches("bx")
    assert row.create_attempts == 2 and len(_batches(mock)) == 1
    _check(dep, mock)
