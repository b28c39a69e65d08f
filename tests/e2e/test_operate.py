"""Operating a run: the live view (`status --watch`, `producer run`), `exams`, `retry`, and
what `status` says of a finished exam. Real CLI and worker processes against the mock."""

from __future__ import annotations

import json
import re
import time

import pytest

from examforge.errors import PauseCode
from harness import dump
from helpers import wait_for

pytestmark = pytest.mark.e2e

PLAIN = re.compile(r"^\d\d:\d\d:\d\d demo \w+: (\d+)/60 questions \(\d+%\); chapters (\d)/3 done")


def test_watch_follows_a_run_in_plain_lines_and_exits_by_itself_when_it_finishes(deploy, mock):
    mock.configure(latency_s=0.3)
    dep = deploy("sqlite")
    dep.syllabus("demo", [("a", 20), ("b", 20), ("c", 20)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    # Off a terminal (a pipe): one plain line per refresh, no redraw.
    watcher = dep.spawn_cli("status", "demo", "--watch", "--interval", "0.3")
    dep.worker(2)
    out, _ = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, out
    lines = out.decode().splitlines()
    progress = [PLAIN.match(line) for line in lines]
    assert all(progress), lines  # every line is a progress line
    done = [int(m.group(1)) for m in progress if m]
    assert done == sorted(done) and done[0] < 60 and done[-1] == 60, done
    assert "\x1b[" not in out.decode()  # no terminal escapes in a pipe
    assert re.search(r"calls 12 used, 0 wasted, 0 failed", lines[-1]), lines[-1]
    assert " done: 60/60" in lines[-1] and "elapsed" in lines[-1]
    report = dep.status("demo")
    assert report["state"] == "done" and report["finished_at"] is not None
    assert report["elapsed_s"] > 0 and report["started_at"] <= report["finished_at"]


def test_producer_run_shows_the_same_view_and_no_second_progress_bar(deploy, mock):
    dep = deploy("sqlite")
    dep.syllabus("demo", [("a", 20), ("b", 20), ("c", 20)])
    run = dep.cli_in_process("run", "demo", "-c", "4", timeout=120)
    assert run.returncode == 0, run.stderr
    views = [line for line in run.stderr.splitlines() if PLAIN.match(line)]
    assert views and " done: 60/60 questions" in views[-1], run.stderr
    assert "━" not in run.stderr  # rich's progress bar is only drawn on a terminal
    assert run.stdout.strip().endswith("60/60 questions; 3/3 chapters done")


def test_exams_lists_every_exam_with_its_state(deploy, mock):
    dep = deploy("sqlite")
    dep.syllabus("first", [("a", 5)])
    dep.syllabus("second", [("a", 5), ("b", 5)])
    assert dep.cli_in_process("run", "first", timeout=60).returncode == 0
    assert dep.cli_in_process("enqueue", "second").returncode == 0  # no worker: it waits
    listed = dep.cli_in_process("exams", "--json")
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert page["next"] is None  # one page: two exams
    rows = {r["exam"]: r for r in page["items"]}
    assert set(rows) == {"first", "second"}
    first, second = rows["first"], rows["second"]
    assert (first["state"], first["chapters"], first["questions"]) == (
        "done", {"done": 1, "total": 1}, {"done": 5, "target": 5})
    assert first["cost_usd"] >= 0 and first["updated_at"]
    assert (second["state"], second["chapters"], second["questions"]) == (
        "active", {"done": 0, "total": 2}, {"done": 0, "target": 10})
    table = dep.cli_in_process("exams")
    assert "2 exams" in table.stdout and "second" in table.stdout


def test_watch_exits_1_on_a_failed_chapter_and_retry_re_enqueues_it_but_leaves_a_pause_alone(
        deploy, mock):
    # One run for both (formerly two tests with the same exam, worker and failure): the watch
    # follows it to the failed chapter, then retry takes that chapter up again.
    dep = deploy("sqlite", max_reasks=0)
    dep.syllabus("demo", [("a", 5), ("b", 5)])
    mock.configure(script={"demo/b": ["refusal"]})
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    worker = dep.worker(2)
    watched = dep.cli_in_process("status", "demo", "--watch", "--interval", "0.2", timeout=90)
    assert watched.returncode == 1, watched.stdout + watched.stderr
    assert " failed: 5/10 questions" in watched.stdout.splitlines()[-1], watched.stdout
    report = dep.status("demo")
    assert report["chapters"]["failed"] == 1, dump(report)
    assert report["state"] == "failed" and report["recent_errors"][0]["reason"] == \
        "invalid_output"
    text = dep.cli_in_process("status", "demo")
    assert "time: started" in text.stdout and "elapsed" in text.stdout
    unknown = dep.cli_in_process("retry", "demo", "--chapter", "nope")
    assert unknown.returncode != 0 and "'nope'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    retried = dep.cli_in_process("retry", "demo", "--chapter", "b")
    assert retried.returncode == 0 and "retrying 1 failed chapter of demo" in retried.stdout
    report = dep.wait_done("demo", 60)
    assert report["state"] == "done", dump(report)
    dep.kill(worker)
    # A paused exam stays paused: the retried chapter waits for `resume`.
    dep.syllabus("demo", [("a", 5), ("b", 10)])
    mock.configure(script={"demo/b": ["refusal"]})
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    dep.worker(2)
    wait_for(lambda: dep.status("demo")["chapters"]["failed"] == 1, 60, "b to fail again")
    dep.store.pause_exam("demo", "a person paused it", PauseCode.manual)
    retried = dep.cli_in_process("retry", "demo")
    assert "is paused (a person paused it)" in retried.stdout, retried.stdout
    assert dep.status("demo")["state"] == "paused"
    calls = mock.stats()["calls_total"]
    time.sleep(1)  # a check that nothing happens needs some time for it not to
    assert mock.stats()["calls_total"] == calls  # nothing runs while paused
    assert dep.cli_in_process("resume", "demo").returncode == 0
    assert dep.wait_done("demo", 60)["state"] == "done"
