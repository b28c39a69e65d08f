"""A run's hand-off (producer/api/runs.py launch and sweep), on the in-process app in --local
mode: a run stored but never handed on (its server died in between, or the broker refused)
is launched by a repeat of its key or by the periodic sweep, never deleted; and a --local
server works each exam in one thread, resuming open runs whose work nobody does."""

from __future__ import annotations

import threading

from api_support import AUTH, SYLLABUS, api, wait_run
from helpers import wait_for

from examforge.errors import BrokerUnavailable
from producer.api.runs import client_of, fingerprint

FAST_SWEEP = {"api_sweep_interval_s": 0.1, "api_launch_grace_s": 0.5}
CALLS = 2 + 1  # SYLLABUS: a 1-5, 6; b 1-4


def _stored_only(c, key, budget_usd=None):
    """What a server that died right after storing the run left: the run, nothing handed on."""
    store = c.app.state.ctx.store
    run, created = store.create_run("demo", key, fingerprint("demo", budget_usd), budget_usd,
                                    client_of(AUTH["Authorization"], True))
    assert created and run.launched_at is None
    return run


def test_a_repeat_of_the_key_launches_a_run_never_handed_on(make_settings, mock_llm):
    # The sweep is kept out of the way (an hour): only the repeated POST can launch it.
    with api(make_settings, mock_llm, api_sweep_interval_s=3600) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = _stored_only(c, "k")
        assert c.get(f"/runs/{run.id}").json()["state"] == "queued"
        again = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"})
        assert again.status_code == 202 and again.json()["id"] == run.id
        assert wait_run(c, run.id, 20)["state"] == "done"
        assert len(c.get("/exams/demo/runs").json()["items"]) == 1
    assert mock_llm.stats()["calls_total"] == CALLS


def test_the_sweep_launches_a_run_never_handed_on_with_no_request(make_settings, mock_llm):
    with api(make_settings, mock_llm, **FAST_SWEEP) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = _stored_only(c, "k")
        assert wait_run(c, run.id, 20)["state"] == "done"
        store = c.app.state.ctx.store
        assert store.run(run.id).launched_at is not None
        assert store.run(run.id).launching_until is None
    assert mock_llm.stats()["calls_total"] == CALLS


def test_a_claim_whose_holder_died_lapses_and_the_sweep_takes_the_run(make_settings, mock_llm):
    with api(make_settings, mock_llm, **FAST_SWEEP) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = _stored_only(c, "k")
        store = c.app.state.ctx.store
        assert store.claim_launch(run.id, 2.0)  # a replica claims it, then dies
        assert not store.claim_launch(run.id, 2.0)  # held: nobody else hands it on
        assert wait_run(c, run.id, 20)["state"] == "done"
    assert mock_llm.stats()["calls_total"] == CALLS


class FlakyBroker:
    """The app's work, behind a broker that refuses while `down` is set."""

    def __init__(self, real):
        self.real, self.mode, self.down = real, real.mode, threading.Event()
        self.down.set()

    def check(self):
        if self.down.is_set():
            raise BrokerUnavailable("broker unreachable at redis://127.0.0.1:1/0")

    def start(self, *args, **kwargs):
        self.check()
        return self.real.start(*args, **kwargs)

    def resume(self, *args):
        return self.real.resume(*args)

    def close(self):
        self.real.close()


def test_a_refused_hand_off_keeps_the_run_queued_and_it_is_launched_later(make_settings,
                                                                        mock_llm):
    with api(make_settings, mock_llm, **FAST_SWEEP) as c:
        ctx = c.app.state.ctx
        broker = ctx.work = FlakyBroker(ctx.work)
        c.put("/exams/demo", json=SYLLABUS)
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"})
        assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["detail"].startswith("broker unreachable")
        run_id = r.json()["run_id"]
        # The run is kept (a duplicate request may already have its id), queued, unclaimed.
        view = c.get(f"/runs/{run_id}")
        assert view.status_code == 200 and view.json()["state"] == "queued"
        assert ctx.store.run(run_id).launching_until is None
        again = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"})
        assert again.status_code == 503 and again.json()["run_id"] == run_id
        other = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k2"})
        assert other.status_code == 503
        assert len(c.get("/exams/demo/runs").json()["items"]) == 2
        assert mock_llm.stats()["calls_total"] == 0
        broker.down.clear()
        # The key sent again launches its run; the other one is launched by the sweep.
        retried = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"})
        assert retried.status_code == 202 and retried.json()["id"] == run_id
        assert wait_run(c, run_id, 20)["state"] == "done"
        swept = other.json()["run_id"]
        wait_for(lambda: ctx.store.run(swept).launched_at is not None, 10,
                 "the sweep to launch the second run")
        assert wait_run(c, swept, 20)["state"] == "done"
    assert mock_llm.stats()["calls_total"] == CALLS


def test_a_local_server_works_an_exam_in_one_thread(make_settings, mock_llm, monkeypatch):
    import runner.local

    # What must hold: never two `run_local` loops on one exam at once in this process. (A
    # count of threads named run-demo is not it: a thread that has handed the exam back is
    # still listed for an instant after, beside the one the next sweep starts.)
    real, inside, most = runner.local.run_local, [0], [0]
    guard = threading.Lock()

    def counted(*args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            return real(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(runner.local, "run_local", counted)
    mock_llm.configure(latency_s=0.3)
    with api(make_settings, mock_llm, api_local_concurrency=2, api_sweep_interval_s=0.1) as c:
        c.put("/exams/demo", json={"title": "Demo", "chapters": [
            {"id": "a", "title": "A", "questions": 20}, {"id": "b", "title": "B",
                                                         "questions": 10}]})
        first = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k1"}).json()
        wait_for(lambda: c.get(f"/runs/{first['id']}").json()["state"] == "running", 10,
                 "the run to start")
        second = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k2"}).json()
        # A second run of the exam, and sweeps every 0.1 s resuming its open runs: still the
        # one loop for the exam.

        def ended():
            view = c.get(f"/runs/{second['id']}").json()
            return view if view["state"] not in ("queued", "running") else None

        assert wait_for(ended, 60, "the second run to end", interval_s=0.05)["state"] == "done"
        assert most[0] == 1, most
        assert c.get(f"/runs/{first['id']}").json()["state"] == "done"
        assert c.app.state.ctx.work.working_on() == []
    assert mock_llm.stats()["calls_total"] == 4 + 2


def test_the_sweep_resumes_a_launched_run_whose_work_nobody_does(make_settings, mock_llm):
    """A run launched, its slices recorded, and no thread on them (the thread that had them
    is gone): the sweep of a --local server resumes them, with no new POST."""
    from examforge.syllabus import Syllabus

    with api(make_settings, mock_llm, api_sweep_interval_s=0.1) as c:
        c.put("/exams/demo", json=SYLLABUS)
        store = c.app.state.ctx.store
        run = _stored_only(c, "k")
        store.sync_exam("demo", Syllabus.model_validate(SYLLABUS))
        store.mark_launched(run.id)
        assert wait_run(c, run.id, 20)["state"] == "done"
    assert mock_llm.stats()["calls_total"] == CALLS


def test_a_cancel_that_lands_during_the_hand_off_stays_a_cancel(make_settings, mock_llm):
    """The run is cancelled after its hand-off was claimed and before its slices were
    recorded: the hand-off must not leave its work going (it cancels again once launched)."""
    mock_llm.configure(latency_s=0.3)

    class CancelledMidway(FlakyBroker):
        def check(self):  # the cancel arrives here, between the claim and the enqueue
            store.cancel_run(store.exam_runs("demo")[0])

    with api(make_settings, mock_llm, api_local_concurrency=1,
             api_sweep_interval_s=3600) as c:
        ctx = c.app.state.ctx
        store = ctx.store
        ctx.work = CancelledMidway(ctx.work)
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert run["state"] == "cancelled"
        wait_for(lambda: store.calls_in_flight(store.run(run["id"])) == 0 and
                 ctx.work.real.working_on() == [], 20, "the hand-off's work to stop")
        status = c.get("/exams/demo").json()
        assert status["chapters"]["pending"] == status["chapters"]["running"] == 0
        assert status["chapters"]["cancelled"] == 2
        assert status["questions"]["done"] < 10
    assert mock_llm.stats()["calls_total"] <= 1  # at most the call in flight at the cancel
