"""Publishing, the broker epoch and one reconcile pass, on fakeredis (no server needed)."""

from __future__ import annotations

import base64
import json

import fakeredis
import kombu.pools
import pytest
from celery import Celery
from kombu.transport import redis as kombu_redis

from examforge.errors import BrokerUnavailable
from examforge.syllabus import load_syllabus
from helpers import fake_redis_connection_class, write_syllabus
from storage import open_store
from tasks.broker import broker_epoch, check_broker, publish_slices
from tasks.config import celery_config
from tasks.reconcile import reconcile_once


@pytest.fixture
def fake_server(monkeypatch):
    server = fakeredis.FakeServer()
    monkeypatch.setattr(kombu_redis.Channel, "connection_class", fake_redis_connection_class(server))
    return server


@pytest.fixture
def app(make_settings, fake_server, monkeypatch):
    settings = make_settings(broker_url="redis://fake:6379/0", task_queue="q-test")
    celery = Celery("test")
    celery.conf.update(celery_config(settings))
    yield celery, settings
    # kombu keeps producer pools process-wide, keyed by broker URL: drop this test's.
    kombu.pools.reset()


def _queue(fake_server, name="q-test"):
    client = fakeredis.FakeRedis(server=fake_server)
    return [json.loads(raw) for raw in client.lrange(name, 0, -1)]


def test_one_message_per_chapter_with_its_deterministic_id_and_ids_only(app, fake_server):
    celery, settings = app
    publish_slices(celery, "exam", [("a", 0), ("b", 0), ("c", 0)])
    messages = _queue(fake_server)
    assert [m["headers"]["id"] for m in messages][::-1] == [
        "examforge:exam:a:0", "examforge:exam:b:0", "examforge:exam:c:0"]
    for message in messages:
        assert message["content-type"] == "application/json"
        args = json.loads(base64.b64decode(message["body"]))[0]
        assert args == ["exam", args[1], 0]


def test_publishing_twice_gives_two_messages_with_the_same_id(app, fake_server):
    # Celery does not deduplicate by task id (celery/celery#4070): the database must.
    celery, _ = app
    publish_slices(celery, "exam", [("a", 0)])
    publish_slices(celery, "exam", [("a", 0)])
    assert [m["headers"]["id"] for m in _queue(fake_server)] == ["examforge:exam:a:0"] * 2


def test_the_broker_epoch_is_stable_until_the_broker_loses_its_data(app, fake_server):
    celery, settings = app
    first = broker_epoch(celery, settings)
    assert first and broker_epoch(celery, settings) == first
    fakeredis.FakeRedis(server=fake_server).flushall()
    assert broker_epoch(celery, settings) not in (None, first)


def test_the_epoch_is_none_for_other_brokers(make_settings):
    settings = make_settings(broker_url="amqp://guest@localhost//")
    assert broker_epoch(Celery("x"), settings) is None


def test_check_broker_fails_fast_with_one_line(make_settings):
    settings = make_settings(broker_url="redis://127.0.0.1:1/0", broker_connect_timeout_s=1)
    celery = Celery("x")
    celery.conf.update(celery_config(settings))
    with pytest.raises(BrokerUnavailable) as info:
        check_broker(celery, settings)
    assert "\n" not in str(info.value) and "127.0.0.1:1" in str(info.value)


def test_reconcile_re_enqueues_only_the_orphans(app, fake_server, make_settings):
    celery, settings = app
    path = write_syllabus(settings.exams_dir, "exam", [("a", 5), ("b", 5), ("c", 5)])
    store = open_store(settings.database_url)
    store.sync_exam("exam", load_syllabus(path, max_questions=100))
    epoch = broker_epoch(celery, settings)
    store.mark_enqueued("exam", [("a", 0), ("b", 0), ("c", 0)], epoch)
    assert reconcile_once(settings, store, celery) == {
        "requeued": 0, "requeued_lost": 0, "requeued_reopened": 0, "failed_at_cap": 0,
        "settled_cancelled": 0, "settled_orphans": 0, "paused_budget": 0}
    store.mark_picked("exam", "a")  # picked up by a worker that then died before claiming
    object.__setattr__(settings, "heartbeat_s", 0.01)
    import time

    time.sleep(0.05)
    assert reconcile_once(settings, store, celery) == {
        "requeued": 1, "requeued_lost": 0, "requeued_reopened": 0, "failed_at_cap": 0,
        "settled_cancelled": 0, "settled_orphans": 0, "paused_budget": 0}
    assert [m["headers"]["id"] for m in _queue(fake_server)] == ["examforge:exam:a:0"]
    fakeredis.FakeRedis(server=fake_server).flushall()  # the broker lost everything
    assert reconcile_once(settings, store, celery)["requeued"] == 3


def test_a_re_enqueued_chapter_whose_fast_worker_dies_is_an_orphan_again(
        app, fake_server, monkeypatch):
    celery, settings = app
    object.__setattr__(settings, "heartbeat_s", 0.01)
    path = write_syllabus(settings.exams_dir, "exam", [("a", 5)])
    store = open_store(settings.database_url)
    store.sync_exam("exam", load_syllabus(path, max_questions=100))
    store.mark_enqueued("exam", [("a", 0)], "an-epoch-the-broker-lost")
    import tasks.reconcile as reconcile_module

    real_publish = reconcile_module.publish_slices

    def publish_and_get_picked_at_once(app, exam, slices, origin=None):  # type: ignore[no-untyped-def]
        real_publish(app, exam, slices, origin)
        for chapter_id, slice_no in slices:  # a worker takes the message before we return...
            store.mark_picked(exam, chapter_id, slice_no)  # ...and then dies without claiming

    monkeypatch.setattr(reconcile_module, "publish_slices", publish_and_get_picked_at_once)
    assert reconcile_once(settings, store, celery)["requeued"] == 1  # the broker lost it
    import time

    time.sleep(0.05)
    assert reconcile_once(settings, store, celery)["requeued"] == 1  # and its taker died
