"""The benchmark commands docs/explanations/benchmarks.md quotes still run, on a tiny workload:
a broken benchmark would leave its figures without a command that reproduces them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_throughput_benchmark_runs_and_every_system_pays_exactly_what_is_needed(
        redis_url, pg_url, tmp_path):
    # redis_url and pg_url: the same services the benchmark uses, failing (not skipping) in CI.
    results = tmp_path / "results.md"
    run = subprocess.run(
        [sys.executable, "bench/throughput.py", "--questions", "40", "--chapters", "4",
         "--latency-s", "0.05", "--concurrency", "4",
         "--only", "baseline,embedded,dist-sqlite,dist-pg", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(results.with_suffix(".json").read_text())
    assert [r["system"] for r in rows] == ["baseline", "embedded", "dist-sqlite", "dist-pg"]
    for r in rows:
        assert r["error"] is None, r
        assert r["calls_paid"] == r["calls_needed"] == 8, r
        assert r["questions_stored"] == r["questions_target"] == 40, r
    assert "| dist-pg |" in results.read_text()


# `python -m bench --small` in five groups of parts, so that pytest-xdist runs them side by
# side (the whole suite in one process was the longest test, four minutes of process starts).
# Each group takes about 20-30 s alone on the 2-core machine (measured part by part), so that
# none is the suite's tail.
BENCH_GROUPS = ("slots32", "overhead,scaling", "prefetch,threads", "modes,dbcost,verify",
                "chapters,export,enqueue,status", "shape,latency")


def test_the_groups_cover_every_part_of_the_suite_once():
    from bench.suite import PARTS

    named = [part for group in BENCH_GROUPS for part in group.split(",")]
    assert sorted(named) == sorted(PARTS) and len(named) == len(set(named))


@pytest.mark.timeout(660)
@pytest.mark.parametrize("only", BENCH_GROUPS)
def test_the_benchmark_suite_runs_every_part_and_every_system_pays_exactly_what_is_needed(
        redis_url, pg_url, tmp_path, only):
    # `python -m bench --small` on the test's own Redis db (the fixture emptied it); the plots
    # and the JSON go beside the results file.
    results = tmp_path / "sub" / "results.md"  # a folder that does not exist yet: it is made
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--small", "--only", only, "--redis-url", redis_url,
         "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    data = json.loads(results.with_suffix(".json").read_text())
    assert list(data["parts"]) == only.split(",")
    for name, part in data["parts"].items():
        assert part["error"] is None, (name, part["error"])
        assert part["figures"], name
        for figure in part["figures"]:
            if figure["baseline"] is not None:  # a ratio to nothing (none stranded) is n/a
                assert figure["ratio"] is not None and figure["ratio"] > 0, (name, figure)
        for r in part["runs"]:
            if "calls_needed" in r:  # a system doing a workload
                assert r["error"] is None, (name, r)
                assert r["calls_paid"] == r["calls_needed"], (name, r)
                assert r["questions_stored"] == r["questions_target"], (name, r)
    parts = data["parts"]
    if "slots32" in parts:
        systems = {r["system"] for r in parts["slots32"]["runs"]}
        assert {"baseline", "minimal", "dist-sqlite", "dist-pg"} <= systems
        spread = [r for r in parts["slots32"]["runs"] if r.get("workload") == "1call-spread"]
        assert [r["system"] for r in spread] == ["dist-sqlite"], spread
    if "threads" in parts:
        assert (results.parent / "plot-slots.png").stat().st_size > 0
    if "scaling" in parts:
        assert (results.parent / "plot-workers.png").stat().st_size > 0
    if "prefetch" in parts:
        kills = {r["prefetch"]: r for r in parts["prefetch"]["runs"] if r.get("kind")}
        assert kills[1]["stranded"] == 0 and kills[4]["stranded"] > 0, kills
    if "latency" in parts:  # every worker was traced, examforge's steps each measured
        for r in parts["latency"]["runs"]:
            trace = r["trace"]
            assert trace["tasks"] > 0 and trace["gap_ms"] is not None, r["system"]
            if r["system"].startswith("examforge"):
                for step in ("claim", "model call", "commit", "group transaction"):
                    found = trace["steps"][step]
                    assert found["n"] > 0 and found["wall_ms"] >= found["cpu_ms"] > 0, step
    if "shape" in parts:  # the shapes ran, and the result-backend variant really had one
        runs = parts["shape"]["runs"]
        assert {(r["workers"], r["threads"]) for r in runs if r["kind"] == "shape"} == {
            (1, 8), (2, 4)}, runs
        stored = {r["config"]: r["results_stored"] for r in runs if r["kind"] == "celery"}
        assert stored == {"defaults (prefetch 1, no result backend, JSON), sqlite": 0,
                          "result backend on (Redis), sqlite": 16}, stored  # one a chapter
    if "overhead" in parts:
        assert {"over-minimal", "over-examforge"} <= {r["system"] for r in
                                                      parts["overhead"]["runs"]}
    if "modes" in parts:
        modes = parts["modes"]["runs"]
        assert sorted((r["db"], r["mode"]) for r in modes) == sorted(
            (db, m) for db in ("sqlite", "postgresql") for m in ("sync", "flex", "batch"))
        for r in modes:  # every mode books what the mock bills, and stores the whole exam
            assert abs(r["booked_usd"] - r["bill_usd"]) < 1e-6 and r["bill_usd"] > 0, r
            assert r["questions_stored"] == r["questions_target"], r
    if "dbcost" in parts:
        # Group commit off, each statement is one round trip: a further paid call runs its
        # claim and its commit, and every REFRESH_CALLS calls a sizing read (none more in
        # these short runs). On, a group's statements and COMMIT are one round trip, so a run
        # takes at most the round trips of the same run with it off (a difference of two
        # runs, each grouped its own way, need not).
        from examforge.sizing import REFRESH_CALLS

        figures = parts["dbcost"]["figures"]
        (off,) = [f["value"] for f in figures
                  if "one-call chapters: each further call" in f["what"] and "off" in f["what"]]
        assert 2.0 <= off <= 2.0 + 1 / REFRESH_CALLS, off
        (on_vs_off,) = [f for f in figures if f["what"].startswith(
            "PostgreSQL round trips per paid call, one-call chapters, group commit on vs off")]
        assert on_vs_off["ratio"] <= 1.0, on_vs_off
    text = results.read_text()
    first = only.split(",")[0]
    assert "## Summary" in text and f"| {first} |" in text


def test_the_store_cost_benchmark_runs_on_both_databases(pg_url):
    run = subprocess.run(
        [sys.executable, "bench/store_cost.py", "--chapters", "2", "--per-chapter", "10",
         "--per-call", "5"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [
        ["sqlite", "True"], ["postgresql", "True"], ["sqlite", "False"], ["postgresql", "False"]]
    assert all(float(line.split()[2]) > 0 for line in lines)


def test_the_rate_limit_benchmark_runs_and_nothing_is_refused(redis_url, tmp_path):
    results = tmp_path / "ratelimit.md"
    run = subprocess.run(
        [sys.executable, "bench/ratelimit.py", "--chapters", "12", "--rpm", "1200",
         "--tpm", "240000", "--workers", "2", "--threads", "4", "--latency-s", "0.05",
         "--only", "examforge", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(results.with_suffix(".json").read_text())
    assert row["questions_stored"] == 60 and row["admitted"] == 12, row
    assert row["refused"] == 0 and row["billed_calls"] == 12, row
    assert "| examforge" in results.read_text()


def test_the_slices_benchmark_runs_and_never_stores_a_duplicate(tmp_path):
    results = tmp_path / "slices.md"
    run = subprocess.run([sys.executable, "bench/slices.py", "--small", "--results", str(results)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(results.with_suffix(".json").read_text())
    assert [(r["chapters"], r["mode"]) for r in data["sweep"]] == [
        (1, "one lease"), (1, "slices"), (3, "one lease"), (3, "slices")]
    one_chapter = {r["mode"]: r for r in data["sweep"] if r["chapters"] == 1}
    assert (one_chapter["one lease"]["slices"], one_chapter["slices"]["slices"]) == (1, 3)
    for r in data["sweep"] + data["duplicates"]:
        assert r["stored"] == r["questions"] and r["numbers_contiguous"], r
        assert r["exact_duplicates_stored"] == 0, r
        assert r["paid_calls"] == r["calls_used"] + r["calls_wasted"], r
    # The mock did repeat questions, and none of its repeats was stored.
    assert all(r["duplicate_replies"] > 0 for r in data["duplicates"])
    assert "| slices |" in results.read_text()
