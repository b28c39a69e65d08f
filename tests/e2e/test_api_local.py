"""`serve --local` end to end against the mock, with no Redis at all (BROKER_URL is a closed
port): the API does the work in its own process, and a client that goes away (mid-request,
mid-stream) stops nothing and doubles nothing."""

from __future__ import annotations

import math
import socket

import pytest
from apiserver import ApiServer, events, put_syllabus, read_to_end
from harness import assert_stored_exactly_once
from helpers import wait_for
from services import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def local_dep(deploy):
    closed = free_port()  # nothing listens there: any use of the broker would fail
    return deploy(broker_url=f"redis://127.0.0.1:{closed}/0")


def _calls_needed(targets: dict[str, int], per_call: int = 5) -> int:
    return sum(math.ceil(n / per_call) for n in targets.values())


def test_serve_local_runs_an_exam_with_no_broker(local_dep, mock):
    server = ApiServer.start(local_dep, "--local")
    targets = {"a": 12, "b": 7}
    # It says where it listens (uvicorn's own line is below the log level it runs at).
    assert f"examforge API on {server.url} (work done in this process)" in server.log()
    with server.client() as c:
        assert c.get("/healthz").json() == {"status": "ok", "database": "ok",
                                            "broker": "not used"}
        put_syllabus(c, "demo", list(targets.items()))
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "one"})
        assert r.status_code == 202, r.text
        run = r.json()
        assert r.headers["location"] == f"/runs/{run['id']}"
        stream = read_to_end(c, run["id"])
        final = stream[-1]
        assert final["event"] == "done", stream
        assert final["data"]["questions"] == {"done": 19, "target": 19}
        progress = [e for e in stream if e["event"] == "progress"]
        # One event per stored batch, in order, ending at the target.
        assert len(progress) == _calls_needed(targets)
        dones = [e["data"]["done"] for e in progress]
        assert dones == sorted(dones) and dones[-1] == 19
        assert c.get(f"/runs/{run['id']}").json()["state"] == "done"
        exported = c.get("/exams/demo/export", params={"format": "jsonl"})
        assert exported.status_code == 200 and len(exported.text.splitlines()) == 19
    assert_stored_exactly_once(local_dep, "demo", targets)
    assert mock.stats()["calls_total"] == _calls_needed(targets)


def _drop_mid_request(url: str, path: str, headers: dict[str, str]) -> None:
    """Send a POST and close the socket without reading a byte of the answer."""
    host, port = url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Length: 0",
             *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    with socket.create_connection((host, int(port))) as s:
        s.sendall("\r\n".join(lines).encode())
        s.shutdown(socket.SHUT_RDWR)


def test_a_client_that_goes_away_cancels_nothing(local_dep, mock):
    mock.configure(latency_s=0.3)  # long enough that the drops land mid-run
    server = ApiServer.start(local_dep, "--local", API_LOCAL_CONCURRENCY="2")
    targets = {"a": 20, "b": 10}
    with server.client() as c:
        put_syllabus(c, "demo", list(targets.items()))
        from apiserver import TOKEN

        # The POST's client vanishes before reading the answer; its retry (same key) finds
        # the run the first one made.
        _drop_mid_request(server.url, "/exams/demo/runs",
                          {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "click-1"})
        run = wait_for(lambda: c.get("/exams/demo/runs").json()["items"], 10,
                       "the dropped POST's run")[0]
        again = c.post("/exams/demo/runs", headers={"Idempotency-Key": "click-1"})
        assert again.status_code == 202 and again.json()["id"] == run["id"]
        # A stream read for one event, then closed, mid-run.
        with c.stream("GET", f"/runs/{run['id']}/events") as r:
            first = next(e for e in events(r) if "comment" not in e)
        assert first["event"] == "progress"
        assert c.get(f"/runs/{run['id']}").json()["state"] in ("running", "queued")
        final = wait_for(lambda: (lambda v: v if v["state"] not in ("queued", "running")
                                  else None)(c.get(f"/runs/{run['id']}").json()), 90,
                         "the run to end")
        assert final["state"] == "done", final
        assert final["chapters"]["cancelled"] == 0
    assert_stored_exactly_once(local_dep, "demo", targets)
    # Paid calls = calls needed: nothing was cut off, nothing asked twice.
    assert mock.stats()["calls_total"] == _calls_needed(targets)


def test_a_raised_chapter_then_a_new_run_generates_only_what_is_missing(local_dep, mock):
    server = ApiServer.start(local_dep, "--local")
    with server.client() as c:
        put_syllabus(c, "demo", [("a", 10), ("b", 5)])
        first = c.post("/exams/demo/runs", headers={"Idempotency-Key": "r1"}).json()
        assert read_to_end(c, first["id"])[-1]["event"] == "done"
        assert mock.stats()["calls_total"] == 3
        put_syllabus(c, "demo", [("a", 17), ("b", 5)])  # 200: replaced
        second = c.post("/exams/demo/runs", headers={"Idempotency-Key": "r2"}).json()
        assert second["id"] != first["id"]
        stream = read_to_end(c, second["id"])
        assert stream[-1]["event"] == "done"
        assert stream[-1]["data"]["questions"] == {"done": 22, "target": 22}
        # The first run stays done; the second one's events are its own batches only.
        assert c.get(f"/runs/{first['id']}").json()["state"] == "done"
        assert [e["data"]["done"] for e in stream if e["event"] == "progress"] == [20, 22]
    assert_stored_exactly_once(local_dep, "demo", {"a": 17, "b": 5})
    assert mock.stats()["calls_total"] == 3 + 2  # 11-15, 16-17


def test_a_chunked_body_over_1_mb_gets_413_from_the_live_server(local_dep, mock):
    server = ApiServer.start(local_dep, "--local")
    with server.client() as c:
        def body():
            for _ in range(40):
                yield b"x" * 50_000  # 2 MB in all, no Content-Length: chunked

        r = c.put("/exams/big", content=body(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.headers["content-type"] == "application/problem+json"
        assert c.get("/exams").json() == {"items": [], "next": None}
        assert c.get("/healthz").status_code == 200


def test_a_killed_local_server_started_again_finishes_its_runs(local_dep, mock):
    import signal

    mock.configure(latency_s=0.3)
    first = ApiServer.start(local_dep, "--local", API_LOCAL_CONCURRENCY="2")
    targets = {"a": 20, "b": 10}
    with first.client() as c:
        put_syllabus(c, "demo", list(targets.items()))
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        with c.stream("GET", f"/runs/{run['id']}/events") as r:
            next(e for e in events(r) if e.get("event") == "progress")
    local_dep.kill(first.proc, signal.SIGKILL)  # mid-run, calls in flight
    second = ApiServer.start(local_dep, "--local", API_LOCAL_CONCURRENCY="2",
                             LEASE_S="2")
    with second.client() as c:
        stream = read_to_end(c, run["id"])
        assert stream[-1]["event"] == "done", stream
    assert_stored_exactly_once(local_dep, "demo", targets)
    _assert_paid_once_but_the_killed_calls(local_dep, mock, targets, in_flight=2)


def _wait_ended(c, run_id, timeout_s):
    def ended():
        view = c.get(f"/runs/{run_id}").json()
        return view if view["state"] not in ("queued", "running") else None

    return wait_for(ended, timeout_s, f"run {run_id} to end")


def _assert_paid_once_but_the_killed_calls(dep, mock, targets, in_flight):
    """Paid calls: those needed, each booked used, plus at most the `in_flight` calls the
    killed server had sent, each booked wasted."""
    calls = dep.calls("demo")
    used = [k for k in calls if k["outcome"] == "used"]
    wasted = [k for k in calls if k["outcome"] != "used"]
    # A call is recorded before it is sent: the killed server may have recorded one it never
    # sent (booked wasted by the taker, since nobody can know), never sent one unrecorded.
    assert len(used) <= mock.stats()["calls_total"] <= len(calls) == len(used) + len(wasted)
    assert len(used) == _calls_needed(targets)
    assert len(wasted) <= in_flight
    assert {k["outcome"] for k in wasted} <= {"wasted"}


def test_a_local_server_takes_over_the_runs_of_another_that_was_killed(local_dep, mock):
    """Two `serve --local` on one database; the one that started the run is SIGKILLed
    mid-run. The other, started before the run existed, finishes it at its next sweep with
    no request (the slices' leases keep every slice to one server at a time)."""
    import signal

    mock.configure(latency_s=0.3)
    env = {"API_LOCAL_CONCURRENCY": "2", "API_SWEEP_INTERVAL_S": "0.5", "LEASE_S": "2"}
    first = ApiServer.start(local_dep, "--local", **env)
    other = ApiServer.start(local_dep, "--local", **env)
    targets = {"a": 20, "b": 10}
    with first.client() as c:
        put_syllabus(c, "demo", list(targets.items()))
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        with c.stream("GET", f"/runs/{run['id']}/events") as r:
            next(e for e in events(r) if e.get("event") == "progress")
    local_dep.kill(first.proc, signal.SIGKILL)
    with other.client() as c:
        _wait_ended(c, run["id"], 90)  # a deadline: a stalled run's stream would never end
        stream = read_to_end(c, run["id"])
        assert stream[-1]["event"] == "done", stream
        assert len(c.get("/exams/demo/runs").json()["items"]) == 1
    assert_stored_exactly_once(local_dep, "demo", targets)
    # The other server may have worked on the run before the kill too (its sweeps resume
    # every open run): still every slice at one server at a time, so at most the killed
    # server's two calls in flight are lost.
    _assert_paid_once_but_the_killed_calls(local_dep, mock, targets, in_flight=2)



def test_healthz_says_503_while_the_database_is_gone_and_ok_once_it_is_back(deploy, pg_url):
    """A real PostgreSQL database taken from under a running server (its connections
    terminated, new ones refused), then given back: /healthz is a 503 problem naming the
    database meanwhile, and ok again after, with no restart."""
    import psycopg

    admin_url = pg_url.rsplit("/", 1)[0] + "/postgres"  # the fixture's server, its admin db
    closed = free_port()
    dep = deploy("postgres", broker_url=f"redis://127.0.0.1:{closed}/0")
    server = ApiServer.start(dep, "--local")
    name = pg_url.rsplit("/", 1)[1]
    with server.client() as c, psycopg.connect(admin_url, autocommit=True) as admin:
        assert c.get("/healthz").status_code == 200
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s", (name,))
        try:
            r = c.get("/healthz")
            assert r.status_code == 503, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["detail"].startswith("database: ")
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        wait_for(lambda: c.get("/healthz").status_code == 200, 20, "the database to be back")
