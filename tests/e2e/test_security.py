"""JSON only, secrets kept out of everything, authenticated and encrypted brokers, and Flower."""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import subprocess
import sys
import uuid

import httpx
import pytest
import redis
from sqlalchemy import MetaData, select

from harness import assert_stored_exactly_once, dump
from helpers import wait_for
from services import PrivateRedis, free_port

pytestmark = pytest.mark.e2e

SECRET = "sk-SECRET-" + "7" * 24


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_message_is_refused_and_never_executed(deploy, redis_url, tmp_path):
    dep = deploy("sqlite")
    marker = tmp_path / "pwned"
    body = pickle.dumps(((_Exploit(str(marker)),), {}, {}))
    message = {
        "body": base64.b64encode(body).decode(), "content-encoding": "binary",
        "content-type": "application/x-python-serialize",
        "headers": {"lang": "py", "task": "examforge.generate_chapter", "id": str(uuid.uuid4()),
                    "retries": 0, "root_id": None, "parent_id": None, "argsrepr": "()",
                    "kwargsrepr": "{}", "origin": "attacker"},
        "properties": {"correlation_id": "x", "delivery_mode": 2, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
                       "delivery_info": {"exchange": "", "routing_key": dep.env["TASK_QUEUE"]}},
    }
    client = redis.Redis.from_url(redis_url)
    client.lpush(dep.env["TASK_QUEUE"], json.dumps(message))
    dep.worker(2)
    wait_for(lambda: "Refusing to deserialize" in dep.worker_logs(tail_chars=None), 30,
             "the worker to refuse the message")
    dep.wait_drained()  # the message is gone: had it run, it would have written the marker
    assert not marker.exists()
    assert client.llen(dep.env["TASK_QUEUE"]) == 0


def test_the_api_key_is_never_in_task_arguments_logs_flower_or_the_database(
        deploy, mock, redis_url):
    mock.configure(api_key=SECRET)
    dep = deploy("sqlite", llm_api_key=SECRET)
    dep.syllabus("demo", [(f"ch-{i}", 10) for i in range(3)])
    assert dep.cli_in_process("enqueue", "demo").returncode == 0
    queued = redis.Redis.from_url(redis_url).lrange(dep.env["TASK_QUEUE"], 0, -1)
    assert len(queued) == 3
    for raw in queued:
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        assert args[0] == "demo" and args[1].startswith("ch-")  # ids only
        assert SECRET not in raw.decode()
    # Flower only knows tasks whose events it received, and on a loaded machine it can
    # take longer to connect its event receiver than the worker takes to finish three
    # chapters. So the messages are held back until Flower has seen the worker online,
    # then put back exactly as they were.
    client = redis.Redis.from_url(redis_url)
    client.delete(dep.env["TASK_QUEUE"])
    port = free_port()
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}",
         "--address=127.0.0.1", "--basic-auth=admin:pw"],
        cwd=dep.workdir, env=dep.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dep.procs.append(flower)
    dep.worker(2)  # no -E: task and worker events are on in the app configuration
    base = f"http://127.0.0.1:{port}"

    def flower_sees_worker() -> bool:
        try:
            r = httpx.get(f"{base}/metrics", auth=("admin", "pw"), timeout=5)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and re.search(
            r'^flower_worker_online\{worker="[^"]+"\} 1\.0$', r.text, re.M) is not None

    wait_for(flower_sees_worker, 60, "Flower to receive the worker's events")
    # Task events are off until someone watches: Flower's enable_events broadcast (every 5 s)
    # turns them on in the worker, which logs it. Only tasks run after that are listed.
    wait_for(lambda: "Events of group {task} enabled by remote" in dep.worker_logs(None), 60,
             "Flower to switch the worker's task events on")
    client.rpush(dep.env["TASK_QUEUE"], *queued)
    report = dep.wait_done("demo", 60)
    assert report["chapters"]["done"] == 3
    assert httpx.get(f"{base}/api/tasks", timeout=5).status_code == 401  # auth required

    def flower_tasks():  # type: ignore[no-untyped-def]
        try:
            r = httpx.get(f"{base}/api/tasks", auth=("admin", "pw"), timeout=5)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 and len(r.json()) >= 3 else None

    tasks = wait_for(flower_tasks, 30, "Flower to list the chapter tasks")
    assert {f"examforge:demo:ch-{i}:0" for i in range(3)} <= set(tasks)
    assert SECRET not in json.dumps(tasks)
    assert SECRET not in dep.worker_logs(tail_chars=None)
    with dep.store.engine.connect() as conn:
        meta = MetaData()
        meta.reflect(conn)
        for table in meta.sorted_tables:
            rows = conn.execute(select(table)).all()
            assert SECRET not in repr(rows), table.name


@pytest.mark.parametrize("tls", [False, True], ids=["password", "rediss"])
def test_a_redis_with_a_password_and_tls_works(deploy, mock, tmp_path, tls):
    broker = PrivateRedis(tmp_path, password="s3cret-pw", tls=tls).start()
    try:
        dep = deploy("sqlite", broker_url=broker.url)
        dep.syllabus("demo", [("a", 10), ("b", 10)])
        enq = dep.cli_in_process("enqueue", "demo")
        assert enq.returncode == 0, enq.stderr
        dep.worker(2)
        report = dep.wait_done("demo", 60)
        assert report["chapters"]["done"] == 2, dump(report) + dep.worker_logs()
        assert_stored_exactly_once(dep, "demo", {"a": 10, "b": 10})
        wrong = broker.url.replace("s3cret-pw", "wrong-pw")
        refused = dep.cli_in_process("enqueue", "demo", BROKER_URL=wrong)
        assert refused.returncode == 3 and len(refused.stderr.strip().splitlines()) == 1
        assert "wrong-pw" not in refused.stderr and "s3cret-pw" not in refused.stderr
    finally:
        broker.stop()
