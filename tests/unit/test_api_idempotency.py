"""The Idempotency-Key rules of POST /exams/SLUG/runs, on the in-process app (the concurrent
requests on live servers are in tests/e2e/test_api_replicas.py)."""

from __future__ import annotations

import json

import pytest
from api_support import SYLLABUS, api, wait_run
from helpers import wait_for
from sqlalchemy import text

from examforge.errors import PauseCode
from producer.api.runs import parse_key


def _events(c, run_id):
    """The stream's events (heartbeats left out) as raw text blocks."""
    text = c.get(f"/runs/{run_id}/events").text
    blocks = [b.strip() for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    return ["\n".join(sorted(line for line in b.splitlines() if not line.startswith(":")))
            for b in blocks if not b.startswith(":")]


@pytest.mark.parametrize("value,key", [
    (None, None), ("", None), ('""', None), ("abc", "abc"), ('"abc"', "abc"),
    (" abc ", "abc"), ("x" * 255, "x" * 255), ("x" * 256, None), ("caf\u00e9", None),
    ("a\x01b", None), ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324")])
def test_parse_key(value, key):
    assert parse_key(value) == key


def test_same_key_same_body_is_the_same_run_and_the_work_is_paid_once(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        first = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k1"},
                       json={"budget_usd": 2})
        assert first.status_code == 202
        run = first.json()
        assert first.headers["location"] == f"/runs/{run['id']}"
        assert run["budget_usd"] == 2
        ended = wait_run(c, run["id"])
        assert ended["state"] == "done" and ended["questions"] == {"done": 10, "target": 10}
        calls = mock_llm.stats()["calls_total"]
        assert calls == 2 + 1  # a: 1-5, 6; b: 1-4
        again = c.post("/exams/demo/runs", headers={"Idempotency-Key": '"k1"'},
                       json={"budget_usd": 2})
        assert again.status_code == 202 and again.json()["id"] == run["id"]
        assert again.headers["location"] == f"/runs/{run['id']}"
        assert again.json()["state"] == "done"
        assert mock_llm.stats()["calls_total"] == calls
        # Another body or another exam with the key: 422, nothing started.
        for path, body in (("/exams/demo/runs", {"budget_usd": 3}),
                           ("/exams/demo/runs", {}), ("/exams/other/runs", {"budget_usd": 2})):
            if path.startswith("/exams/other"):
                c.put("/exams/other", json=SYLLABUS)
            r = c.post(path, headers={"Idempotency-Key": "k1"}, json=body)
            assert r.status_code == 422, r.text
            assert "Idempotency-Key" in r.json()["detail"]
        assert len(c.get("/exams/demo/runs").json()["items"]) == 1


@pytest.mark.slow
def test_no_body_and_an_empty_object_are_the_same_request(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        a = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        b = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}, json={})
        assert b.status_code == 202 and b.json()["id"] == a["id"]


def test_a_missing_key_is_400(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        for headers in ({}, {"Idempotency-Key": ""}, {"Idempotency-Key": "x" * 300}):
            r = c.post("/exams/demo/runs", headers=headers, json={})
            assert r.status_code == 400
            assert r.headers["content-type"] == "application/problem+json"
            assert "Idempotency-Key" in r.json()["detail"]
        assert c.get("/exams/demo").json()["state"] == "new"


def _age_runs(c, seconds):
    store = c.app.state.ctx.store
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE run SET created_at = created_at - :s"), {"s": seconds})


def test_keys_are_kept_24_hours_then_forgotten(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        first = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        wait_run(c, first["id"])
        _age_runs(c, 86400 - 60)  # a minute short of a day: still the same run
        assert c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()["id"] == \
            first["id"]
        _age_runs(c, 120)  # now over a day old: the key is forgotten, the run stays
        second = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert second["id"] != first["id"]
        assert c.get(f"/runs/{first['id']}").json()["state"] == "done"
        wait_run(c, second["id"])


def test_prune_forgets_old_keys(make_settings, mock_llm, tmp_path):
    from storage import open_store

    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        wait_run(c, run["id"])
        _age_runs(c, 2 * 86400)
        url = c.app.state.ctx.settings.database_url
    store = open_store(url)
    assert store.forget_idempotency_keys(86400) == 1
    assert store.forget_idempotency_keys(86400) == 0
    assert store.run(run["id"]).idempotency_key is None


def test_cancel_is_explicit_and_a_new_run_resumes(make_settings, mock_llm):
    mock_llm.configure(latency_s=0.3)
    with api(make_settings, mock_llm, api_local_concurrency=1) as c:
        c.put("/exams/demo", json={"title": "Demo", "chapters": [
            {"id": "a", "title": "A", "questions": 30}]})
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        wait_for(lambda: c.get(f"/runs/{run['id']}").json()["state"] == "running", 10,
                 "the run to start")
        r = c.post(f"/runs/{run['id']}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        # Its stream ends with `cancelled` once the call in flight has settled (its reply
        # is not kept: the lease went with the cancel), and reads the same at any later time.
        stream = _events(c, run["id"])
        assert "event: cancelled" in stream[-1]
        assert _events(c, run["id"]) == stream
        store = c.app.state.ctx.store
        assert store.calls_in_flight(store.run(run["id"])) == 0
        assert c.get("/exams/demo").json()["questions"]["done"] < 30
        assert c.post(f"/runs/{run['id']}/cancel").json()["state"] == "cancelled"
        # Its key still names the cancelled run: a client's retry restarts nothing.
        again = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert again["id"] == run["id"] and again["state"] == "cancelled"
        resumed = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k2"}).json()
        assert wait_run(c, resumed["id"], 60)["state"] == "done"
        assert c.get(f"/runs/{run['id']}").json()["state"] == "cancelled"
        assert c.post(f"/runs/{resumed['id']}/cancel").status_code == 409
        assert c.get("/exams/demo").json()["questions"] == {"done": 30, "target": 30}


def test_prune_takes_an_exam_s_runs_with_it(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        wait_run(c, run["id"])
        result = c.app.state.ctx.store.prune(0)
        assert [fp.exam for fp in result.pruned] == ["demo"]
        assert c.get(f"/runs/{run['id']}").status_code == 404
        assert c.get("/exams/demo").json()["state"] == "new"  # its syllabus stays


def test_a_budget_pause_is_a_paused_run_and_a_raised_budget_resumes(make_settings, mock_llm):
    priced = {"llm_price_prompt_per_mtok": 1000.0, "llm_price_completion_per_mtok": 1000.0}
    with api(make_settings, mock_llm, **priced) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "small"},
                     json={"budget_usd": 0.01}).json()
        paused = wait_for(lambda: (lambda v: v if v["state"] == "paused" else None)(
            c.get(f"/runs/{run['id']}").json()), 20, "the run to pause")
        assert paused["pause_code"] == PauseCode.budget and paused["pause_reason"]
        assert paused["budget_usd"] == 0.01 and mock_llm.stats()["calls_total"] == 0
        # The open stream says so once (and stays open: a pause is lifted by a new run).
        with c.stream("GET", f"/runs/{run['id']}/events") as stream:
            lines = []
            for line in stream.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    break
        announced = json.loads(lines[-1][len("data:"):])
        assert "event: progress" in lines and any(
            line.startswith("id:") and line.endswith("-paused") for line in lines), lines
        assert announced["state"] == "paused" and announced["budget_usd"] == 0.01
        assert announced["pause_reason"] == paused["pause_reason"]
        more = c.post("/exams/demo/runs", headers={"Idempotency-Key": "more"},
                      json={"budget_usd": 1000}).json()
        done = wait_run(c, more["id"])
        assert done["state"] == "done" and done["cost_usd"] > 0
        assert done["cost_usd"] == done["spent_usd"]  # the paused run paid nothing
        first = c.get(f"/runs/{run['id']}").json()
        assert first["state"] == "done"  # the exam is done
        # ... and the paused run is billed its own calls (none), not its successor's.
        assert first["cost_usd"] == 0.0
        assert not [e for e in _events(c, run["id"]) if "event: progress" in e]


def test_an_earlier_run_keeps_its_own_cost_and_events_after_a_later_run(make_settings,
                                                                         mock_llm):
    priced = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 1.0}
    with api(make_settings, mock_llm, **priced) as c:
        c.put("/exams/demo", json=SYLLABUS)
        one = c.post("/exams/demo/runs", headers={"Idempotency-Key": "one"}).json()
        before = wait_run(c, one["id"])
        events_before = _events(c, one["id"])
        assert before["state"] == "done" and before["cost_usd"] > 0
        raised = {**SYLLABUS, "chapters": [{**SYLLABUS["chapters"][0], "questions": 16},
                                           SYLLABUS["chapters"][1]]}
        c.put("/exams/demo", json=raised)
        two = c.post("/exams/demo/runs", headers={"Idempotency-Key": "two"}).json()
        after = wait_run(c, two["id"])
        assert after["state"] == "done" and after["questions"]["done"] == 20
        again = c.get(f"/runs/{one['id']}").json()
        # The first run's bill and stream are what they were: the later run's calls are its own.
        assert again["cost_usd"] == before["cost_usd"]
        assert _events(c, one["id"]) == events_before
        assert after["cost_usd"] > 0
        assert round(before["cost_usd"] + after["cost_usd"], 6) == after["spent_usd"]
        # A Last-Event-ID naming a call the run never made changes nothing of its final id.
        final_id = [line for line in events_before[-1].splitlines() if line.startswith("id:")]
        bogus = c.get(f"/runs/{one['id']}/events", headers={"Last-Event-ID": "999"}).text
        assert final_id and final_id[0] in bogus.replace("\r\n", "\n").splitlines()


def test_keys_are_each_clients_own(make_settings, mock_llm):
    """Two clients (two tokens) that pick the same key get a run each, and neither sees the
    other's; each repeat of a client's own key still gets that client's run."""
    with api(make_settings, mock_llm, api_tokens="unit-token,other-token") as c:
        c.put("/exams/demo", json=SYLLABUS)
        mine = c.post("/exams/demo/runs", headers={"Idempotency-Key": "run-1"})
        theirs = c.post("/exams/demo/runs", headers={
            "Idempotency-Key": "run-1", "Authorization": "Bearer other-token"},
            json={"budget_usd": 5})  # another body: not a 422, another client's key
        assert mine.status_code == theirs.status_code == 202, theirs.text
        assert mine.json()["id"] != theirs.json()["id"]
        again = c.post("/exams/demo/runs", headers={
            "Idempotency-Key": "run-1", "Authorization": "Bearer other-token"},
            json={"budget_usd": 5})
        assert again.json()["id"] == theirs.json()["id"]
        assert c.post("/exams/demo/runs", headers={"Idempotency-Key": "run-1"}).json()["id"] \
            == mine.json()["id"]
        wait_run(c, theirs.json()["id"])
        with c.app.state.ctx.store.engine.connect() as conn:
            clients = conn.execute(text("SELECT client FROM run ORDER BY id")).scalars().all()
        assert len(set(clients)) == 2 and all(len(k) == 32 for k in clients)
        assert not any("token" in k for k in clients)  # a hash, never the token


def test_a_run_whose_chapters_fail_is_failed_and_its_stream_says_so(make_settings, mock_llm):
    # A provider that refuses every request as invalid (a permanent error): nothing retried.
    mock_llm.configure(fault_rate=1.0, faults=["400"])
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        view = wait_run(c, run["id"])
        assert view["state"] == "failed" and view["chapters"]["failed"] == 2, view
        assert view["questions"]["done"] == 0
        final = _events(c, run["id"])[-1]
        assert "event: failed" in final and "id: " in final
    assert mock_llm.stats()["calls_total"] == 2  # one refusal a chapter, none retried
