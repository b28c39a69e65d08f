"""End to end: the real CLI, real Celery workers (threads pool), the mock provider, SIGKILL."""

from __future__ import annotations

import json
import math
import signal
import threading
import time

import pytest

from storage.models import CallReason
from harness import assert_stored_exactly_once, dump, used_batches
from helpers import wait_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_whole_exam_with_two_workers_stores_each_question_once(deploy, mock, database):
    dep = deploy(database)
    chapters = [(f"ch-{i}", 12) for i in range(6)]
    dep.syllabus("demo", chapters)
    enq = dep.cli_in_process("enqueue", "demo")
    assert enq.returncode == 0, enq.stderr
    assert "6 enqueued, 0 skipped" in enq.stdout
    dep.worker(4)
    dep.worker(4)
    report = dep.wait_done("demo", 90)
    assert report["chapters"]["done"] == 6, dump(report)
    assert_stored_exactly_once(dep, "demo", dict(chapters))
    needed = 6 * math.ceil(12 / 5)
    stats = mock.stats()
    assert stats["calls_total"] == needed, dump(stats)
    assert report["usage"]["calls"] == needed and report["usage"]["calls_used"] == needed
    assert report["usage"]["completion_tokens"] > 0
    # At README's level (-l info, what the harness runs) a worker logs each committed batch.
    assert dep.worker_logs(None).count("batch committed exam=demo ") == needed
    # A second enqueue of a finished exam publishes nothing and calls nothing.
    again = dep.cli_in_process("enqueue", "demo")
    assert "0 enqueued, 6 skipped" in again.stdout
    exported = dep.cli_in_process("export", "demo", "-o", "-")
    assert exported.returncode == 0
    assert len(exported.stdout.splitlines()) == 72
    dep.wait_drained()  # anything it had published would have run by now
    assert mock.stats()["calls_total"] == needed


def test_sigkill_mid_chapters_then_a_new_worker_completes_without_repeating_batches(deploy, mock):
    mock.configure(latency_s=0.4)
    dep = deploy("sqlite")
    chapters = [(f"ch-{i}", 40) for i in range(4)]
    dep.syllabus("demo", chapters)
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    victim = dep.worker(4)
    wait_for(lambda: dep.status("demo")["questions"]["done"] >= 30, 60, "some batches committed")
    dep.kill(victim, signal.SIGKILL)
    before = used_batches(dep.calls("demo"))
    in_flight_at_kill = dep.status("demo")["usage"]["calls_in_flight"]
    assert 1 <= in_flight_at_kill <= 4
    dep.worker(4)
    report = dep.wait_done("demo", 90)
    assert report["chapters"]["done"] == 4, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "demo", dict(chapters))
    calls = dep.calls("demo")
    after = used_batches(calls)
    assert len(after) == len(set(after))  # no batch committed twice
    assert set(before) <= set(after)
    # Batches committed before the kill were never requested again.
    for call in calls[len(before) + in_flight_at_kill:]:
        assert (call["chapter_id"], call["first_number"]) not in before
    # Paid calls thrown away: only those in flight at the kill, each explained.
    wasted = [c for c in calls if c["outcome"] == "wasted"]
    assert len(wasted) == in_flight_at_kill
    assert all(c["reason"] == CallReason.crash_before_commit for c in wasted)
    # A call is booked before it is sent, so a kill between the two leaves one the provider
    # never saw: of those in flight at the kill, any may be missing at the provider, no other.
    assert len(calls) - in_flight_at_kill <= mock.stats()["calls_total"] <= len(calls)


def test_a_task_delivered_twice_while_it_runs_makes_one_set_of_calls(deploy, mock):
    mock.configure(latency_s=0.5)
    dep = deploy("sqlite")
    dep.syllabus("demo", [("only", 20)])
    dep.worker(4)
    for _ in range(3):  # the same chapter published three times, runs concurrently
        assert dep.cli_in_process("enqueue", "demo").returncode == 0
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 1
    stats = mock.stats()
    assert stats["calls_total"] == 4, dump(stats)
    assert max(stats["max_inflight_by_chapter"].values()) == 1
    assert_stored_exactly_once(dep, "demo", {"only": 20})


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_two_concurrent_enqueues_before_any_worker_generate_each_chapter_once(
        deploy, mock, database):
    dep = deploy(database)
    chapters = [(f"ch-{i}", 10) for i in range(8)]
    dep.syllabus("demo", chapters)
    first, second = dep.spawn_cli("enqueue", "demo"), dep.spawn_cli("enqueue", "demo")
    assert first.wait(60) == 0 and second.wait(60) == 0, (
        first.stdout.read(), second.stdout.read())  # type: ignore[union-attr]
    dep.worker(8)
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 8
    dep.wait_drained()  # the duplicate messages, each run to its end: they must be no-ops
    stats = mock.stats()
    assert stats["calls_by_chapter"] == {f"demo/ch-{i}": 2 for i in range(8)}, dump(stats)
    assert_stored_exactly_once(dep, "demo", dict(chapters))


def test_a_rejected_api_key_pauses_the_exam_and_resume_finishes_it(deploy, mock):
    mock.configure(api_key="sk-right")
    dep = deploy("sqlite")
    dep.syllabus("demo", [(f"ch-{i}", 5) for i in range(6)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    bad = dep.worker(1)
    wait_for(lambda: dep.status("demo")["state"] == "paused", 30, "the exam to pause")
    time.sleep(2)
    assert mock.stats()["calls_total"] == 1  # one 401, then no more attempts burnt
    report = dep.status("demo")
    assert report["chapters"]["failed"] == 1 and "401" in report["pause_reason"]
    shown = dep.cli_in_process("status", "demo")
    assert "paused" in shown.stdout and "resume" in shown.stdout
    dep.kill(bad)
    dep.env["LLM_API_KEY"] = "sk-right"
    dep.worker(4)
    resumed = dep.cli_in_process("resume", "demo")
    assert resumed.returncode == 0, resumed.stderr
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 6, dump(report)


def test_local_run_killed_and_run_again_resumes_without_repeating_committed_work(deploy, mock):
    mock.configure(latency_s=0.4)
    dep = deploy("sqlite", lease_s=3)
    chapters = [(f"ch-{i}", 40) for i in range(4)]
    dep.syllabus("demo", chapters)
    run = dep.spawn_cli("run", "demo", "--concurrency", "4")
    wait_for(lambda: dep.store.exam_exists("demo")
             and dep.status("demo")["questions"]["done"] >= 30, 60, "progress")
    run.kill()
    run.wait(10)
    before = used_batches(dep.calls("demo"))
    in_flight = dep.status("demo")["usage"]["calls_in_flight"]
    again = dep.cli_in_process("run", "demo", "--concurrency", "4", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "160/160 questions" in again.stdout
    assert_stored_exactly_once(dep, "demo", dict(chapters))
    calls = dep.calls("demo")
    for call in calls[len(before) + in_flight:]:
        assert (call["chapter_id"], call["first_number"]) not in before
    assert len([c for c in calls if c["outcome"] == "wasted"]) == in_flight


def test_reconcile_command_recovers_a_killed_workers_chapters(deploy, mock):
    mock.configure(latency_s=0.3)
    dep = deploy("sqlite", lease_s=3)
    chapters = [("a", 30), ("b", 30)]
    dep.syllabus("demo", chapters)
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    victim = dep.worker(2)
    wait_for(lambda: dep.status("demo")["questions"]["done"] >= 10, 30, "progress")
    dep.kill(victim)
    time.sleep(4)  # the leases expire
    result = dep.cli_in_process("reconcile")
    assert result.returncode == 0 and "re-enqueued 2" in result.stdout, result.stdout
    dep.worker(2)
    assert dep.wait_done("demo", 60)["chapters"]["done"] == 2
    assert_stored_exactly_once(dep, "demo", dict(chapters))


def test_status_json_contract_and_export_formats(deploy, mock):
    dep = deploy("sqlite")
    dep.syllabus("demo", [("a", 7), ("b", 3)])
    assert dep.cli_in_process("run", "demo", "--concurrency", "2").returncode == 0
    status = json.loads(dep.cli_in_process("status", "demo", "--json").stdout)
    assert status["exam"] == "demo"
    assert status["chapters"] == {"total": 2, "pending": 0, "running": 0, "done": 2,
                                  "failed": 0, "cancelled": 0}
    assert status["questions"] == {"target": 10, "done": 10}
    assert all(isinstance(status["usage"][k], int)
               for k in ("calls", "prompt_tokens", "completion_tokens"))
    assert [c["state"] for c in status["chapter_list"]] == ["done", "done"]
    assert {"attempts", "last_error", "last_error_at"} <= set(status["chapter_list"][0])
    for fmt in ("jsonl", "json", "csv"):
        assert dep.cli_in_process("export", "demo", "--format", fmt).returncode == 0
    folder = dep.workdir / "exams" / "demo"
    assert len((folder / "generated.jsonl").read_text().splitlines()) == 10
    assert len(json.loads((folder / "generated.json").read_text())) == 10
    assert len((folder / "generated.csv").read_text().splitlines()) == 11
    table = dep.cli_in_process("status", "demo")
    assert "10/10" in table.stdout and "chapters: 2/2 done" in table.stdout


def test_ctrl_c_in_local_run_stops_paying_after_the_running_calls(deploy, mock):
    mock.configure(latency_s=4.0)
    dep = deploy("sqlite", llm_timeout_s=20)  # the running calls finish and commit
    dep.syllabus("demo", [(f"ch-{i}", 60) for i in range(4)])  # 6 calls, 24 s per chapter
    run = dep.spawn_cli("run", "demo", "--concurrency", "2")
    # Both calls at the mock, in one snapshot (not only recorded in the database, where a
    # call is written before it is sent): with 2 threads, no other call can start until one
    # of these ends, 4 s on.
    def both_at_the_mock() -> dict | None:
        assert run.poll() is None, run.stdout.read().decode()  # type: ignore[union-attr]
        stats = mock.stats()
        return stats if stats["inflight"] == 2 else None

    try:
        stats = wait_for(both_at_the_mock, 60, "two calls at the mock")
    except BaseException:
        run.kill()
        print("run's output:", run.stdout.read().decode(),  # type: ignore[union-attr]
              "\nmock:", mock.stats(), "\ncalls:", dump(dep.calls("demo")))
        raise
    run.send_signal(signal.SIGINT)
    # No deadline on the machine's speed (this test once timed out on a busy machine): what
    # shows the stop waited for the running calls and no more is that no call reached the
    # mock after the signal, and that the process exits; a chapter that went on would make
    # 5 more calls each. The signal only sets a flag the run's loop reads (runner.local), so
    # where the main thread was when it came does not matter.
    assert run.wait(120) == 130
    output = run.stdout.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in output and "run the same command to resume" in output
    assert "finishing 2 calls in flight; Ctrl-C again to abandon them" in output
    table = dep.cli_in_process("status", "demo").stdout
    assert "handed back" not in table, table  # a stop is not an error
    assert mock.stats()["calls_total"] == stats["calls_total"]  # none started after Ctrl-C
    usage = dep.status("demo")["usage"]
    calls = dep.calls("demo")
    assert usage["calls_in_flight"] == 0 and usage["calls_wasted"] == 0, dump(calls)
    assert usage["calls_used"] == stats["calls_total"], dump(calls)  # they were kept
    # A call recorded before the signal and not sent yet is never sent: failed, $0.
    unsent = [c for c in calls if c["outcome"] == "failed"]
    assert all((c["detail"] or "").startswith("not sent:") and not c["cost_usd"]
               for c in unsent), dump(calls)
    assert usage["calls"] == usage["calls_used"] + len(unsent)


def test_a_second_ctrl_c_abandons_the_calls_in_flight_and_the_next_run_books_them(deploy, mock):
    mock.configure(latency_s=60.0)  # the calls in flight could not end by themselves in time
    dep = deploy("sqlite", llm_timeout_s=120, lease_s=2)
    dep.syllabus("demo", [("ch-0", 5), ("ch-1", 5)])  # one call each
    run = dep.spawn_cli("run", "demo", "--concurrency", "2")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(
        raw.decode() for raw in run.stdout), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def both_at_the_mock() -> bool:
        assert run.poll() is None, (run.returncode, lines)
        return mock.stats()["inflight"] == 2

    try:
        wait_for(both_at_the_mock, 60, "two calls at the mock")
    except BaseException:
        run.kill()
        reader.join(10)
        print("run's output:", "".join(lines), "\nmock:", mock.stats(), "\ncalls:",
              dump(dep.calls("demo")))
        raise
    run.send_signal(signal.SIGINT)
    wait_for(lambda: any("Ctrl-C again" in line for line in lines), 60, "the first stop's line")
    run.send_signal(signal.SIGINT)
    assert run.wait(30) == 130  # the calls it abandoned had 60 s to go
    reader.join(10)
    assert any("abandoned the calls in flight" in line for line in lines), lines
    assert not any("Traceback" in line for line in lines), lines
    mock.configure(latency_s=0.01)
    again = dep.cli_in_process("run", "demo", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    usage = dep.status("demo")["usage"]
    assert usage["calls_in_flight"] == 0, dump(dep.calls("demo"))
    # The two abandoned calls are booked (wasted, at their worst case), and nothing else was.
    assert usage["calls_wasted"] == 2 and usage["calls_used"] == 2, dump(dep.calls("demo"))
    assert_stored_exactly_once(dep, "demo", {"ch-0": 5, "ch-1": 5})
