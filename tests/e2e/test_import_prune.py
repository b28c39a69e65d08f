"""End to end: `producer import` and `producer prune` with real workers and the mock."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from harness import Deployment, assert_stored_exactly_once, dump
from helpers import wait_for
from storage.base import E, K, Q, S

pytestmark = pytest.mark.e2e


def _naive_file(path: Path, counts: dict[str, int]) -> Path:
    """The naive script's checkpoint file: one question a line, with its chapter."""
    with path.open("w", encoding="utf-8") as f:
        for chapter_id, n in counts.items():
            for i in range(n):
                f.write(json.dumps({
                    "chapter_id": chapter_id,
                    "question": f"Naive script question {i} of {chapter_id}: pick a choice.",
                    "choices": ["first", "second", "third", "fourth"],
                    "answer_index": i % 4, "explanation": "From the old run."}) + "\n")
    return path


def _rows(dep: Deployment) -> dict[str, list[Any]]:
    """Everything the database holds, table by table."""
    with dep.store.engine.connect() as conn:
        return {name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key))]
                for name, t in (("exam", E), ("slice", S), ("question", Q), ("call", K))}


def _owned(dep: Deployment, slug: str) -> dict[str, int]:
    with dep.store.engine.connect() as conn:
        return {name: conn.execute(select(func.count()).select_from(t).where(
            (t.c.slug if t is E else t.c.exam) == slug)).scalar_one()
            for name, t in (("exam", E), ("slice", S), ("question", Q), ("call", K))}


# SQLite only here (the laptop a naive script ran on): the import itself (free numbers filled,
# a second import storing nothing, zero-cost ledger rows, claims numbering on) runs on both
# databases in tests/integration/test_imports.py.
@pytest.mark.parametrize("database", ["sqlite"])
def test_the_naive_scripts_file_imported_twice_then_enqueue_pays_only_for_the_rest(
        deploy, mock, database):
    dep = deploy(database)
    dep.syllabus("demo", [("a", 12), ("b", 10), ("c", 8)])
    # a was finished by the old script, b half done (and repeats one line), c never started.
    path = _naive_file(dep.workdir / "checkpoint.jsonl", {"a": 12, "b": 6})
    with path.open("a", encoding="utf-8") as f:
        f.write(path.read_text().splitlines()[12] + "\n")
    first = dep.cli_in_process("import", "demo", str(path))
    assert first.returncode == 0, first.stderr
    assert "imported 18, skipped 0 already stored, 1 repeated in the file, 0 near-duplicates, " \
           "0 past the target" in first.stdout, first.stdout
    assert "demo/b: 6 questions, slice 0 numbers 1-6" in first.stdout
    second = dep.cli_in_process("import", "demo", str(path))
    assert second.returncode == 0, second.stderr
    assert "imported 0, skipped 19 already stored" in second.stdout, second.stdout
    assert mock.stats()["calls_total"] == 0
    status = dep.status("demo")
    assert status["questions"] == {"target": 30, "done": 18}
    assert status["usage"]["calls"] == 0 and status["usage"]["calls_imported"] == 2

    enq = dep.cli_in_process("enqueue", "demo")
    assert enq.returncode == 0, enq.stderr
    assert "skipped   demo/a: done" in enq.stdout and "2 enqueued, 1 skipped" in enq.stdout
    dep.worker(4)
    report = dep.wait_done("demo", 90)
    assert report["chapters"]["done"] == 3, dump(report)
    assert_stored_exactly_once(dep, "demo", {"a": 12, "b": 10, "c": 8})
    # Only the missing questions were asked for: b's 4 (one call), c's 8 (two).
    stats = mock.stats()
    assert stats["calls_by_chapter"] == {"demo/b": 1, "demo/c": 2}, dump(stats)
    used = [(c["chapter_id"], c["first_number"], c["requested"]) for c in dep.calls("demo")
            if c["outcome"] == "used"]
    assert sorted(used) == [("b", 7, 4), ("c", 1, 5), ("c", 6, 3)]
    assert report["usage"]["calls"] == stats["calls_total"] == 3
    rows = dep.store.questions("demo")
    assert [r["model"] for r in rows if r["chapter_id"] == "b"][:6] == ["import"] * 6
    shown = dep.cli_in_process("status", "demo")
    assert "imported: 18 questions in 2 batches" in shown.stdout, shown.stdout


def test_importing_a_file_with_a_bad_line_leaves_the_database_unchanged(deploy, mock):
    dep = deploy("sqlite")
    dep.syllabus("demo", [("a", 10), ("b", 10)])
    good = _naive_file(dep.workdir / "good.jsonl", {"a": 4})
    assert dep.cli_in_process("import", "demo", str(good)).returncode == 0
    before = _rows(dep)
    lines = _naive_file(dep.workdir / "bad.jsonl", {"a": 6, "b": 3}).read_text().splitlines()
    bad_line = json.loads(lines[4])
    bad_line["choices"] = bad_line["choices"][:3]
    lines[4] = json.dumps(bad_line)
    bad = dep.workdir / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    result = dep.cli_in_process("import", "demo", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {bad}:5: choices: must be a list of 4 strings; "
                                     "nothing was imported"), result.stderr
    assert _rows(dep) == before

    # A chapter the syllabus does not have refuses the file the same way, and an exam that
    # was never enqueued is not even recorded.
    dep.syllabus("fresh", [("x", 5)])
    stray = _naive_file(dep.workdir / "stray.jsonl", {"x": 2, "nope": 1})
    result = dep.cli_in_process("import", "fresh", str(stray))
    assert result.returncode == 2
    assert f"{stray}:3: chapter_id: 'nope' is not a chapter of fresh" in result.stderr
    assert _rows(dep) == before and not dep.store.exam_exists("fresh")


def test_prune_dry_run_then_prune_with_a_finished_and_a_running_exam(deploy, mock):
    dep = deploy("postgres", lease_s=60)  # the lease outlives the worker's pause below
    dep.syllabus("old", [("a", 10), ("b", 5)])
    dep.syllabus("live", [(f"ch-{i}", 30) for i in range(3)])
    assert dep.cli_in_process("run", "old", "--concurrency", "2").returncode == 0
    mock.configure(latency_s=0.4)
    assert dep.cli_in_process("enqueue", "live").returncode == 0
    worker = dep.worker(2)
    wait_for(lambda: dep.status("live")["chapters"]["running"] >= 1, 30, "live to run")
    # Frozen mid-chapter while we prune, so that live cannot finish before the last prune
    # however slow this machine is: its slices stay running, its calls in flight.
    worker.send_signal(signal.SIGSTOP)
    try:
        _prune_beside_a_running_exam(dep)
    finally:
        worker.send_signal(signal.SIGCONT)
    # The running exam was not touched and completes.
    report = dep.wait_done("live", 120)
    assert report["chapters"]["done"] == 3, dump(report) + dep.worker_logs()
    assert_stored_exactly_once(dep, "live", {f"ch-{i}": 30 for i in range(3)})
    assert report["usage"]["calls_wasted"] == 0
    bad = dep.cli_in_process("prune", "--older-than", "7x")
    assert bad.returncode == 2 and "--older-than" in bad.stderr


def _prune_beside_a_running_exam(dep: Deployment) -> None:
    old_rows = _owned(dep, "old")
    assert old_rows["question"] == 15

    dry = dep.cli_in_process("prune", "--older-than", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would prune old: 2 chapters (2 slices), 15 questions" in dry.stdout, dry.stdout
    assert "kept        live:" in dry.stdout and "nothing was deleted" in dry.stdout
    assert _owned(dep, "old") == old_rows

    refused = dep.cli_in_process("prune", "--older-than", "0s", "--exam", "live")
    assert refused.returncode == 2 and "cancel it first" in refused.stderr, refused.stderr
    kept = dep.cli_in_process("prune", "--older-than", "1h")
    assert kept.returncode == 0 and "pruned 0 exams" in kept.stdout, kept.stdout

    pruned = dep.cli_in_process("prune", "--older-than", "0s")
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned      old: 2 chapters (2 slices), 15 questions" in pruned.stdout
    assert _owned(dep, "old") == {"exam": 0, "slice": 0, "question": 0, "call": 0}
    assert dep.cli_in_process("status", "old").returncode == 2
    assert dep.store.exam_exists("live")


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_prune_racing_a_worker_that_is_still_committing(deploy, mock, database):
    """Prune in a loop while a worker commits: the exam stays whole until it is done, then
    goes whole. Then a worker frozen mid-call on an exam that is cancelled and pruned comes
    back: its reply is fenced off and nothing of the exam reappears."""
    mock.configure(latency_s=0.2)
    dep = deploy(database, llm_timeout_s=20)
    dep.syllabus("race", [("a", 20), ("b", 20)])
    assert dep.cli_in_process("enqueue", "race").returncode == 0
    dep.worker(2)
    seen_running = False
    while True:
        report = dep.status("race")
        finished = report["chapters"]["done"] == 2
        result = dep.cli_in_process("prune", "--older-than", "0s")
        assert result.returncode == 0, result.stderr
        if "pruned      race:" in result.stdout:
            assert finished or dep.store.exam_exists("race") is False
            assert "40 questions" in result.stdout, result.stdout  # whole, never half
            break
        assert dep.store.exam_exists("race"), result.stdout
        seen_running = seen_running or "kept        race:" in result.stdout
    assert seen_running
    assert _owned(dep, "race") == {"exam": 0, "slice": 0, "question": 0, "call": 0}
    assert mock.stats()["calls_total"] == 8  # every batch once: nothing was cut short

    mock.configure(latency_s=3.0)
    dep.syllabus("frozen", [("a", 10)])
    assert dep.cli_in_process("enqueue", "frozen").returncode == 0
    wait_for(lambda: dep.status("frozen")["usage"]["calls_in_flight"] == 1, 30, "a call out")
    victim = dep.procs[-1]
    victim.send_signal(signal.SIGSTOP)
    try:
        assert dep.cli_in_process("cancel", "frozen").returncode == 0
        result = dep.cli_in_process("prune", "--older-than", "0s", "--exam", "frozen")
        assert result.returncode == 0 and "pruned      frozen:" in result.stdout, result.stdout
    finally:
        victim.send_signal(signal.SIGCONT)
    # Its reply comes back (LLM_TIMEOUT_S outlasts the latency), the commit is fenced off.
    wait_for(lambda: "lease lost; result discarded" in dep.worker_logs(None)
             or "examforge:frozen:a:0] succeeded" in dep.worker_logs(None), 60,
             "the frozen worker's task to end")
    assert _owned(dep, "frozen") == {"exam": 0, "slice": 0, "question": 0, "call": 0}
