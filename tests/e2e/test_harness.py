"""The harness's in-process CLI (Deployment.cli_in_process), which most end-to-end tests use for
the commands that are not what they test: it answers as the real process does, and each call
publishes with its own deployment's settings, never with those of an earlier call."""

from __future__ import annotations

import json

import pytest
import redis

pytestmark = pytest.mark.e2e


def test_in_process_and_real_process_answer_the_same(deploy):
    dep = deploy()
    dep.syllabus("demo", [("a", 5), ("b", 5)])
    for args in (["status", "ghost"], ["export", "ghost"], ["enqueue", "nope"],
                 ["prune", "--older-than", "7x"], ["enqueue", "demo", "--dry-run"],
                 ["exams", "--json"]):
        real, here = dep.cli(*args), dep.cli_here(*args)
        assert (here.returncode, here.stdout, here.stderr) == \
            (real.returncode, real.stdout, real.stderr), args
    assert dep.cli_here("enqueue", "demo").returncode == 0
    real, here = dep.cli("status", "demo", "--json"), dep.cli_here("status", "demo", "--json")
    assert real.returncode == here.returncode == 0
    assert json.loads(here.stdout) == json.loads(real.stdout)
    # A setting given to one call is that call's alone.
    refused = dep.cli_here("status", "demo", DATABASE_URL="mysql://x@localhost/db")
    assert refused.returncode == 2 and "DATABASE_URL" in refused.stderr
    assert dep.cli_here("status", "demo").returncode == 0


def test_each_in_process_enqueue_publishes_to_its_own_deployments_queue(deploy):
    first, second = deploy(), deploy()
    assert first.env["TASK_QUEUE"] != second.env["TASK_QUEUE"]
    first.syllabus("one", [("a", 5)])
    second.syllabus("two", [("a", 5), ("b", 5)])
    assert first.cli_here("enqueue", "one").returncode == 0
    assert second.cli_here("enqueue", "two").returncode == 0
    queue = redis.Redis.from_url(first.env["BROKER_URL"])
    assert (queue.llen(first.env["TASK_QUEUE"]), queue.llen(second.env["TASK_QUEUE"])) == (1, 2)
    # A broker that is down is found by the call that is given it, in one line, exit 3.
    down = second.cli_here("enqueue", "two", BROKER_URL="redis://127.0.0.1:1/0")
    assert down.returncode == 3 and len(down.stderr.strip().splitlines()) == 1, down.stderr
    assert "unreachable" in down.stderr
