"""Two API replicas (`python -m producer serve`, the default Celery mode) on one database and
one Redis, with a real worker: an event stream read part-way from one replica resumes on the
other with Last-Event-ID and misses nothing; concurrent identical POSTs (threads hitting both
replicas at once) make one run, on SQLite and on PostgreSQL."""

from __future__ import annotations

import math
import threading

import pytest
from apiserver import ApiServer, events, put_syllabus, read_to_end
from harness import assert_stored_exactly_once
from helpers import wait_for
from sqlalchemy import func, select

from storage.models import Run
from storage.store import K

pytestmark = pytest.mark.e2e

R = Run.__table__  # type: ignore[attr-defined]


def _stored_batches(dep, slug: str) -> list[int]:
    """The ids of the calls that stored questions, in id order: the progress events."""
    with dep.store.engine.connect() as conn:
        return list(conn.execute(select(K.c.id).where(
            K.c.exam == slug, K.c.questions_stored > 0).order_by(K.c.id)).scalars())


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_stream_resumes_on_another_replica_with_nothing_lost(deploy, mock, database):
    mock.configure(latency_s=0.15)
    dep = deploy(database)
    dep.worker(concurrency=2)
    a, b = ApiServer.start(dep), ApiServer.start(dep)
    targets = {"a": 25, "b": 15}
    with a.client() as ca, b.client() as cb:
        put_syllabus(ca, "demo", list(targets.items()))
        assert cb.get("/exams/demo").json()["state"] == "new"  # B sees what A stored
        run = ca.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        # Part of the stream from A: two progress events, then the connection drops.
        part = []
        with ca.stream("GET", f"/runs/{run['id']}/events") as r:
            for e in events(r):
                if "comment" in e:
                    continue
                part.append(e)
                if len(part) == 2:
                    break
        assert [e["event"] for e in part] == ["progress", "progress"]
        rest = read_to_end(cb, run["id"], last_event_id=part[-1]["id"])
        assert rest[-1]["event"] == "done", rest
        # The whole stream, read afresh from B once the run is over: the parts add up to it.
        whole = read_to_end(cb, run["id"])
        # After the final event, a reconnect is told to stop (204), on either replica.
        assert ca.get(f"/runs/{run['id']}/events",
                      headers={"Last-Event-ID": rest[-1]["id"]}).status_code == 204
    assert [(e["id"], e["data"]) for e in part + rest] == [(e["id"], e["data"]) for e in whole]
    progress = [e for e in whole if e["event"] == "progress"]
    assert [int(e["id"]) for e in progress] == _stored_batches(dep, "demo")
    assert len(progress) == sum(math.ceil(n / 5) for n in targets.values())
    assert progress[-1]["data"]["done"] == 40 == whole[-1]["data"]["questions"]["done"]
    assert_stored_exactly_once(dep, "demo", targets)
    assert mock.stats()["calls_total"] == len(progress)


# PostgreSQL only here (replicas on several hosts share it): threads racing one idempotency
# key make one run on both databases in
# tests/integration/test_api_store.py::test_threads_racing_one_key_make_one_run.
@pytest.mark.parametrize("database", ["postgres"])
def test_concurrent_identical_posts_on_two_replicas_make_one_run(deploy, mock, database):
    dep = deploy(database)
    dep.worker(concurrency=4)
    servers = [ApiServer.start(dep), ApiServer.start(dep)]
    clients = [s.client() for s in servers]
    put_syllabus(clients[0], "demo", [("a", 10), ("b", 10)])
    n = 12
    barrier = threading.Barrier(n)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def post(i: int) -> None:
        client = servers[i % 2].client()  # one connection each: truly concurrent
        barrier.wait()
        r = client.post("/exams/demo/runs", headers={"Idempotency-Key": "double-click"},
                        json={"budget_usd": 5})
        with lock:
            answers.append((r.status_code, r.json()))
        client.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == n
    assert {status for status, _ in answers} == {202}, answers
    assert len({body["id"] for _, body in answers}) == 1
    with dep.store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(R)).scalar_one() == 1
    # Same key, another body: 422, on either replica; no key: 400.
    for c in clients:
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "double-click"},
                   json={"budget_usd": 6})
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
        assert c.post("/exams/demo/runs", json={}).status_code == 400
    run_id = answers[0][1]["id"]
    assert read_to_end(clients[1], run_id)[-1]["event"] == "done"
    for c in clients:
        c.close()
    assert_stored_exactly_once(dep, "demo", {"a": 10, "b": 10})
    assert mock.stats()["calls_total"] == 4  # the calls needed, once


def test_an_idle_stream_gets_heartbeats_and_the_run_waits_queued(deploy, mock):
    dep = deploy()  # no worker: the run stays queued, its stream idle
    server = ApiServer.start(dep)
    with server.client() as c:
        put_syllabus(c, "demo", [("a", 5)])
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert run["state"] == "queued"
        seen = []
        with c.stream("GET", f"/runs/{run['id']}/events") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for e in events(r):
                seen.append(e)
                if len(seen) == 2:
                    break
        assert all("comment" in e for e in seen), seen  # heartbeats (API_SSE_HEARTBEAT_S 0.5)
        assert c.get(f"/runs/{run['id']}").json()["state"] == "queued"
        dep.worker(concurrency=2)  # a worker comes: the queued run proceeds
        assert read_to_end(c, run["id"])[-1]["event"] == "done"
    assert mock.stats()["calls_total"] == 1


def test_a_broker_that_is_down_is_503_and_the_run_is_launched_once_it_is_back(
        deploy, mock, tmp_path):
    from services import PrivateRedis

    broker = PrivateRedis(tmp_path)  # not started yet: its port refuses connections
    dep = deploy(broker_url=broker.url, broker_connect_timeout_s=1)
    server = ApiServer.start(dep, ready_path="/openapi.json", API_SWEEP_INTERVAL_S="0.5",
                             API_LAUNCH_GRACE_S="1")
    try:
        with server.client() as c:
            health = c.get("/healthz")
            assert health.status_code == 503 and health.json()["detail"].startswith("broker")
            put_syllabus(c, "demo", [("a", 5)])
            r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"})
            assert r.status_code == 503, r.text
            assert r.headers["content-type"] == "application/problem+json"
            run_id = r.json()["run_id"]
            # Kept, queued: a duplicate request that was given its id can read it.
            assert c.get(f"/runs/{run_id}").json()["state"] == "queued"
            again = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"})
            assert again.status_code == 503 and again.json()["run_id"] == run_id
            assert c.get("/exams/demo").json()["state"] == "new"  # no slice recorded
            broker.start()
            dep.worker(concurrency=2)
            # No request: the server's sweep launches the run once the broker answers.
            wait_for(lambda: c.get(f"/runs/{run_id}").json()["state"] == "done", 60,
                     "the run to be launched and done")
            assert read_to_end(c, run_id)[-1]["event"] == "done"
            assert len(c.get("/exams/demo/runs").json()["items"]) == 1
    finally:
        broker.stop()
    assert_stored_exactly_once(dep, "demo", {"a": 5})
    assert mock.stats()["calls_total"] == 1


def test_the_cli_enqueues_a_syllabus_the_api_stored(deploy, mock):
    dep = deploy()
    server = ApiServer.start(dep)
    with server.client() as c:
        put_syllabus(c, "demo", [("a", 7)])
    assert not (dep.workdir / "exams" / "demo").exists()  # in the database only
    result = dep.cli_in_process("enqueue", "demo")
    assert result.returncode == 0, result.stderr
    assert "enqueued  demo/a" in result.stdout
    dep.worker(concurrency=2)
    assert dep.wait_done("demo")["state"] == "done"
    assert_stored_exactly_once(dep, "demo", {"a": 7})
    assert mock.stats()["calls_total"] == 2
    with server.client() as c:  # the API reads the exam the CLI ran
        assert c.get("/exams/demo").json()["questions"] == {"done": 7, "target": 7}
