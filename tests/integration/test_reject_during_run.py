"""Issue 27, defect 7: a rejection during a run in Celery mode reopens a done slice; the
reopened number is handed on (published) and the run ends, on SQLite and PostgreSQL.

The API runs in Celery mode (`create_app(local=False)`, CeleryWork) with the broker's
publish recorded instead of sent; the test is the worker: it runs `process_chapter`, the
plain function the Celery task calls, for each message published. The reconciler's part (a
publish that failed) runs `reconcile_once` against fakeredis."""

from __future__ import annotations

from typing import Any, Iterator

import kombu.pools
import pytest
from api_support import TOKEN
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from kombu.transport import redis as kombu_redis

from examforge.errors import BrokerUnavailable
from helpers import fake_redis_connection_class

SYLLABUS = {"title": "Rejected", "chapters": [
    {"id": "a", "title": "Chapter A", "questions": 4},
    {"id": "b", "title": "Chapter B", "questions": 3}]}


class FakeBroker:
    """What the producer side published: (exam, chapter, slice) in order."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, int]] = []

    def publish(self, app: Any, exam: str, slices: Any, origin: Any = None) -> None:
        self.published.extend((exam, c, n) for c, n in slices)


@pytest.fixture
def celery_api(make_settings, mock_llm, db_url, monkeypatch) -> Iterator[Any]:
    import tasks.broker
    from producer.api import create_app
    from runner.pipeline import Runtime
    from storage import open_store

    broker = FakeBroker()
    monkeypatch.setattr(tasks.broker, "check_broker", lambda app, settings: None)
    monkeypatch.setattr(tasks.broker, "broker_epoch", lambda app, settings: "epoch-1")
    monkeypatch.setattr(tasks.broker, "publish_slices", broker.publish)
    settings = make_settings(database_url=db_url, llm_base_url=mock_llm.base_url,
                             api_tokens=TOKEN)
    store = open_store(db_url)
    rt = Runtime.build(settings, store)
    with TestClient(create_app(settings, local=False)) as client:
        client.headers.update({"Authorization": f"Bearer {TOKEN}"})
        yield client, broker, rt, settings
    rt.close()
    store.engine.dispose()


def _work(rt: Any, broker: FakeBroker, done: int) -> int:
    """Be the worker: process every message published after the first `done`."""
    from runner.pipeline import process_chapter

    while done < len(broker.published):
        exam, chapter_id, slice_no = broker.published[done]
        process_chapter(rt, exam, chapter_id, slice_no)
        done += 1
    return done


def _reject_one(client: TestClient, chapter: str = "a") -> dict[str, Any]:
    q = client.get(f"/exams/rej/chapters/{chapter}/questions").json()["items"][1]
    r = client.post(f"/exams/rej/questions/{q['id']}/reject", json={"version": q["version"]})
    assert r.status_code == 200, r.text
    return q


def test_a_rejection_during_a_celery_run_publishes_the_reopened_slice_and_the_run_ends(
        celery_api):
    client, broker, rt, _ = celery_api
    assert client.put("/exams/rej", json=SYLLABUS).status_code == 201
    run = client.post("/exams/rej/runs", headers={"Idempotency-Key": "k"}).json()
    assert broker.published == [("rej", "a", 0), ("rej", "b", 0)]
    # Chapter a is done while the run is still going (b's message not taken yet).
    from runner.pipeline import process_chapter
    process_chapter(rt, "rej", "a", 0)
    assert client.get(f"/runs/{run['id']}").json()["state"] == "running"

    rejected = _reject_one(client)
    # The reopened slice is published at once: the run does not wait for a new enqueue.
    assert broker.published[2:] == [("rej", "a", 0)]
    _work(rt, broker, 1)
    view = client.get(f"/runs/{run['id']}").json()
    assert view["state"] == "done", view
    assert view["questions"] == {"done": 7, "target": 7}
    numbers = [q["number"] for q in client.get("/exams/rej/chapters/a/questions").json()[
        "items"] if q["withdrawn"] is None]
    assert numbers == [1, 2, 3, 4] and rejected["number"] == 2


def test_no_enqueue_without_an_open_run(celery_api):
    """A rejection after the run ended reopens the slice for the next run, as before."""
    client, broker, rt, _ = celery_api
    assert client.put("/exams/rej", json=SYLLABUS).status_code == 201
    run = client.post("/exams/rej/runs", headers={"Idempotency-Key": "k"}).json()
    _work(rt, broker, 0)
    assert client.get(f"/runs/{run['id']}").json()["state"] == "done"
    published = len(broker.published)
    _reject_one(client)
    assert len(broker.published) == published
    assert client.get(f"/runs/{run['id']}").json()["state"] == "done"


@pytest.fixture
def fake_celery(make_settings, db_url, monkeypatch) -> Iterator[tuple[Celery, Any]]:
    import fakeredis

    from tasks.config import celery_config

    server = fakeredis.FakeServer()
    monkeypatch.setattr(kombu_redis.Channel, "connection_class",
                        fake_redis_connection_class(server))
    settings = make_settings(database_url=db_url, broker_url="redis://fake:6379/0",
                             task_queue="q-reopened")
    celery = Celery("test")
    celery.conf.update(celery_config(settings))
    yield celery, server
    kombu.pools.reset()


def test_the_reconciler_publishes_what_a_failed_publish_left(celery_api, fake_celery,
                                                            monkeypatch):
    """The rejection is committed but the broker is down when the API hands the slice on:
    the next reconcile pass publishes the reopened slice, and the run ends."""
    import tasks.reconcile
    from tasks.reconcile import reconcile_once

    client, broker, rt, settings = celery_api
    celery, _ = fake_celery
    assert client.put("/exams/rej", json=SYLLABUS).status_code == 201
    run = client.post("/exams/rej/runs", headers={"Idempotency-Key": "k"}).json()
    from runner.pipeline import process_chapter
    process_chapter(rt, "rej", "a", 0)
    import tasks.broker

    def down(app: Any, settings: Any) -> str:
        raise BrokerUnavailable("broker down (test)")

    with monkeypatch.context() as m:  # the broker is down: nothing is marked or published
        m.setattr(tasks.broker, "broker_epoch", down)
        _reject_one(client)  # 200: the rejection stands, its hand-on is the reconciler's
    assert rt.store.unqueued_slices() == [("rej", "a", 0)]

    reconcile_settings = settings.model_copy(update={"broker_url": "redis://fake:6379/0",
                                                     "task_queue": "q-reopened"})
    # The fake broker's publish stands in for the real one in the reconciler too.
    monkeypatch.setattr(tasks.reconcile, "publish_slices", broker.publish)
    counts = reconcile_once(reconcile_settings, rt.store, celery)
    assert counts["requeued_reopened"] == 1
    assert broker.published[-1] == ("rej", "a", 0)
    assert rt.store.unqueued_slices() == []
    assert rt.store.status("rej").chapter_list[0].requeue_code == "reopened"
    _work(rt, broker, 1)
    assert client.get(f"/runs/{run['id']}").json()["state"] == "done"


@pytest.fixture
def verified_celery_api(make_settings, mock_llm, db_url, monkeypatch) -> Iterator[Any]:
    """celery_api with the workers under VERIFY=flag."""
    import tasks.broker
    from producer.api import create_app
    from runner.pipeline import Runtime
    from storage import open_store

    broker = FakeBroker()
    monkeypatch.setattr(tasks.broker, "check_broker", lambda app, settings: None)
    monkeypatch.setattr(tasks.broker, "broker_epoch", lambda app, settings: "epoch-1")
    monkeypatch.setattr(tasks.broker, "publish_slices", broker.publish)
    settings = make_settings(database_url=db_url, llm_base_url=mock_llm.base_url,
                             api_tokens=TOKEN, verify="flag")
    store = open_store(db_url)
    rt = Runtime.build(settings, store)
    with TestClient(create_app(settings, local=False)) as client:
        client.headers.update({"Authorization": f"Bearer {TOKEN}"})
        yield client, broker, rt
    rt.close()
    store.engine.dispose()


def test_an_edited_key_during_a_run_is_solved_again_as_a_booked_call(verified_celery_api):
    """Defect 5 through the run: the verdict goes back to pending, the slice is handed on,
    and the worker's blind solve books a new verdict for the new key, paid as a call."""
    from runner.pipeline import process_chapter
    from storage.base import K

    client, broker, rt = verified_celery_api
    assert client.put("/exams/rej", json=SYLLABUS).status_code == 201
    run = client.post("/exams/rej/runs", headers={"Idempotency-Key": "k"}).json()
    process_chapter(rt, "rej", "a", 0)
    q = client.get("/exams/rej/chapters/a/questions").json()["items"][0]
    assert q["verdict"] in ("agreed", "disputed") and q["solved_index"] is not None
    moved = (q["answer_index"] + 1) % 4
    r = client.patch(f"/exams/rej/questions/{q['id']}",
                     json={"version": q["version"], "answer_index": moved})
    assert r.status_code == 200, r.text
    assert (r.json()["verdict"], r.json()["solved_index"]) == ("pending", None)
    assert broker.published[2:] == [("rej", "a", 0)]

    with rt.store.engine.connect() as conn:
        solves = conn.execute(select(func.count()).select_from(K).where(
            K.c.exam == "rej", K.c.kind == "solve")).scalar_one()
    _work(rt, broker, 1)
    now = client.get(f"/exams/rej/questions/{q['id']}").json()
    # Solved again, for the key it has now: the solver's pick stands beside it.
    assert now["verdict"] in ("agreed", "disputed") and now["solved_index"] is not None
    assert now["verdict"] == ("agreed" if now["solved_index"] == moved else "disputed")
    with rt.store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(K).where(
            K.c.exam == "rej", K.c.kind == "solve")).scalar_one() > solves
    assert client.get(f"/runs/{run['id']}").json()["state"] == "done"
