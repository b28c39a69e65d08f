"""Batch mode through the HTTP API (issue 18): POST /exams/SLUG/runs {"batch": true} sets the
exam's mode and starts the batch runner (in --local, in process; with Celery, one batch pass
published), the run and the exam report their provider batches and what the run waits on,
cancel reaches the provider, and `batch` is part of the request's Idempotency-Key
fingerprint. Against the in-process mock's Batch API."""

from __future__ import annotations

import httpx
import pytest
from api_support import SYLLABUS, api, wait_run
from helpers import wait_for
from sqlalchemy import select

from storage.base import K, Q

FAST = {"batch_poll_s": 0.1, "batch_submit_lease_s": 10.0, "batch_http_timeout_s": 5.0,
        "llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 4.0}


def _chat_calls(mock) -> list[dict]:
    return [u for u in mock.usage() if not u.get("batch")]


def test_a_batch_run_goes_through_the_batch_api_and_reports_its_batches(make_settings,
                                                                          mock_llm):
    with api(make_settings, mock_llm, **FAST) as c:
        c.put("/exams/demo", json=SYLLABUS)
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "b1"}, json={"batch": True})
        assert r.status_code == 202, r.text
        assert r.json()["batch"] is True
        assert wait_run(c, r.json()["id"], 60)["state"] == "done"
        # Its questions may all be stored while the batch's last lines are being booked: the
        # view is kept final only once no batch of the run is live.
        run = wait_for(lambda: (v := c.get(f"/runs/{r.json()['id']}").json())["batches"] and
                       not any(b["live"] for b in v["batches"]) and v, 30, "batches booked")
        assert c.app.state.ctx.store.run(run["id"]).final_view is not None
        assert run["state"] == "done" and run["questions"] == {"done": 10, "target": 10}
        assert run["state_detail"] is None
        assert run["batches"] and all(b["state"] == "done" and not b["live"]
                                      for b in run["batches"])
        assert sum(b["requests"]["completed"] for b in run["batches"]) == 3  # a: 5+1, b: 4
        exam = c.get("/exams/demo").json()
        assert exam["mode"] == "batch"
        assert [b["submission"] for b in exam["batches"]] == [
            b["submission"] for b in run["batches"]]
        store = c.app.state.ctx.store
        with store.engine.connect() as conn:
            calls = conn.execute(select(K).where(K.c.exam == "demo")).all()
        assert calls and all(k.worker.startswith("batch/") for k in calls)
    assert _chat_calls(mock_llm) == []  # not one synchronous call
    paid = [u for u in mock_llm.usage() if u.get("batch") and u["billed"]]
    assert len(paid) == 3


def test_a_run_waiting_on_a_batch_says_so_and_its_cancel_reaches_the_provider(
        make_settings, mock_llm):
    mock_llm.configure(batch_request_s=0.5)
    with api(make_settings, mock_llm, **FAST) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run_id = c.post("/exams/demo/runs", headers={"Idempotency-Key": "b2"},
                        json={"batch": True}).json()["id"]

        def waiting() -> dict | None:
            view = c.get(f"/runs/{run_id}").json()
            detail = view["state_detail"] or ""
            return view if "(in_progress, 1/" in detail else None

        view = wait_for(waiting, 30, "the run to wait on an in-progress batch", interval_s=0.1)
        mock_llm.configure(batch_request_s=2.0)  # the batch surely still runs at the cancel
        assert view["state"] == "running"
        [batch] = [b for b in view["batches"] if b["live"]]
        assert view["state_detail"].startswith(
            f"waiting on the provider's batch {batch['id']} (in_progress, 1/3 done")
        assert batch["status"] == "in_progress" and batch["requests"]["total"] == 3
        exam = c.get("/exams/demo").json()
        assert any(ch["waiting_on"] for ch in exam["chapter_list"])
        cancelled = c.post(f"/runs/{run_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        provider = httpx.get(f"{mock_llm.base_url}/batches/{batch['id']}").json()
        assert provider["status"] in ("cancelling", "cancelled")
        store = c.app.state.ctx.store
        wait_for(lambda: not store.live_batches("demo"), 30, "the cancelled batch booked")
        with store.engine.connect() as conn:
            calls = conn.execute(select(K).where(K.c.exam == "demo")).all()
            stored = conn.execute(select(Q).where(Q.c.exam == "demo")).all()
        used = [k for k in calls if k.outcome == "used"]
        # Every line booked once: finished ones committed (a slice of two lines in the batch
        # keeps its lease for the second after the first is committed to the cancelled
        # slice), the others failed at $0; none wasted.
        assert len(calls) == 3 and len(used) >= 1
        assert all(k.outcome in ("used", "failed") for k in calls), [
            (k.outcome, k.reason, k.detail) for k in calls]
        assert all(k.reason == "batch_cancelled" and k.cost_usd == 0
                   for k in calls if k.outcome != "used")
        assert len(stored) == sum(k.questions_stored for k in used) > 0
        paid = [u for u in mock_llm.usage() if u.get("batch") and u["billed"]]
        assert sorted(int(u["custom_id"].split("-")[1]) for u in paid) == sorted(
            k.id for k in used)
        final = wait_run(c, run_id, 30)
        assert final["state"] == "cancelled" and final["cost_usd"] == pytest.approx(
            sum(k.cost_usd for k in used), abs=5e-7)  # the run's cost is shown to 6 places


def test_batch_is_part_of_the_idempotency_fingerprint(make_settings, mock_llm):
    mock_llm.configure(batch_request_s=0.2)
    with api(make_settings, mock_llm, **FAST) as c:
        c.put("/exams/demo", json=SYLLABUS)
        first = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"},
                       json={"batch": True}).json()
        again = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"},
                       json={"batch": True})
        assert again.status_code == 202 and again.json()["id"] == first["id"]
        for body in ({}, {"batch": False}, {"batch": True, "budget_usd": 3}):
            r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}, json=body)
            assert r.status_code == 422 and "Idempotency-Key" in r.json()["detail"], body
        # Not a bool: refused by validation, naming the field.
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k3"}, json={"batch": "yes"})
        assert r.status_code == 422 and "batch" in r.text
        # A synchronous key: {} and {"batch": false} are the same request (LLM_BATCH off).
        wait_run(c, first["id"], 60)
        sync = c.post("/exams/demo/runs", headers={"Idempotency-Key": "s"}, json={}).json()
        same = c.post("/exams/demo/runs", headers={"Idempotency-Key": "s"},
                      json={"batch": False})
        assert same.status_code == 202 and same.json()["id"] == sync["id"]
        assert sync["batch"] is False
        assert c.get("/exams/demo").json()["mode"] == "sync"
        assert len(c.get("/exams/demo/runs").json()["items"]) == 2


def test_the_schema_shows_the_batch_field(make_settings):
    with api(make_settings) as c:
        spec = c.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert schemas["RunRequest"]["properties"]["batch"]["anyOf"][0]["type"] == "boolean"
    assert "Batch API" in schemas["RunRequest"]["properties"]["batch"]["description"]
    for name in ("batch", "state_detail", "batches"):
        assert name in schemas["RunOut"]["properties"]
    assert {"id", "submission", "status", "requests", "created_at", "expires_at"} <= set(
        schemas["BatchOut"]["properties"])


def test_with_celery_a_batch_run_sets_the_mode_and_publishes_one_batch_pass(
        make_settings, monkeypatch):
    import tasks.broker as broker
    from producer.api import create_app
    from fastapi.testclient import TestClient

    published: list[tuple[str, object]] = []
    monkeypatch.setattr(broker, "check_broker", lambda app, settings: None)
    monkeypatch.setattr(broker, "broker_epoch", lambda app, settings: "e")
    monkeypatch.setattr(broker, "publish_batch_pass",
                        lambda app, origin=None: published.append(("batches", None)))
    monkeypatch.setattr(broker, "publish_slices",
                        lambda app, exam, slices, origin=None: published.append(
                            ("chapters", list(slices))))
    settings = make_settings(api_tokens="", **FAST)
    # No token anywhere is a closed API (issue 30): --no-auth is what serves without one.
    with TestClient(create_app(settings, local=False, no_auth=True)) as c:
        c.put("/exams/demo", json=SYLLABUS)
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "c1"}, json={"batch": True})
        assert r.status_code == 202, r.text
        assert published == [("batches", None)]
        assert c.get("/exams/demo").json()["mode"] == "batch"
        published.clear()
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "c2"}, json={})
        assert r.status_code == 202
        assert [kind for kind, _ in published] == ["chapters"]
        assert c.get("/exams/demo").json()["mode"] == "sync"


def test_the_page_has_the_batch_box_and_shows_a_runs_batches(make_settings):
    """The page's batch parts as served (the browser test, tests/e2e/test_api_browser.py,
    drives them): a box that sends {"batch": true}, the run's `state_detail`, and a table
    of its batches refreshed while the run is live."""
    from html.parser import HTMLParser

    with api(make_settings) as c:
        page, script = c.get("/").text, c.get("/app.js").text

    classes: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            classes.update((dict(attrs).get("class") or "").split())

    Collect().feed(page)
    assert {"batch-input", "detail", "batches"} <= classes
    assert "body.batch = true" in script
    assert "run?.state_detail" in script and "renderBatches(node, run ? run.batches" in script
    assert "setInterval(refreshBatchRuns" in script
