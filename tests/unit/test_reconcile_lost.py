"""The reconciler finds chapters whose message the queue lost while the broker's epoch
survived, on fakeredis with Lua (no server needed). The end-to-end versions, with real Redis,
workers and beat, are in tests/e2e/test_lost_messages.py."""

from __future__ import annotations

import time

import fakeredis
import kombu.pools
import pytest
from celery import Celery
from kombu.transport import redis as kombu_redis

from examforge.syllabus import load_syllabus
from helpers import fake_redis_connection_class, write_syllabus
from storage import open_store
from storage.store import RequeueReason
from tasks.broker import broker_epoch, publish_slices, queue_holdings
from tasks.config import celery_config
from tasks.reconcile import reconcile_once

QUEUE = "q-lost"


@pytest.fixture
def fake_server(monkeypatch):
    server = fakeredis.FakeServer()
    monkeypatch.setattr(kombu_redis.Channel, "connection_class", fake_redis_connection_class(server))
    return server


@pytest.fixture
def env(make_settings, fake_server):
    # reconcile_interval_s 0.01: chapters count as waiting 0.02 s after their enqueue.
    settings = make_settings(broker_url="redis://fake:6379/0", task_queue=QUEUE,
                             reconcile_interval_s=0.01, heartbeat_s=0.01)
    celery = Celery("test")
    celery.conf.update(celery_config(settings))
    store = open_store(settings.database_url)
    yield celery, settings, store
    kombu.pools.reset()
    store.engine.dispose()


def _enqueue(celery, settings, store, chapters: list[str], slug: str = "exam") -> None:
    path = write_syllabus(settings.exams_dir, slug, [(c, 5) for c in chapters])
    store.sync_exam(slug, load_syllabus(path, max_questions=100))
    store.mark_enqueued(slug, [(c, 0) for c in chapters], broker_epoch(celery, settings))
    publish_slices(celery, slug, [(c, 0) for c in chapters])
    time.sleep(0.05)  # older than the reconciler's minimum age


def _redis(fake_server):
    return fakeredis.FakeRedis(server=fake_server)


def _ids(fake_server) -> list[str]:
    import json

    return sorted(json.loads(m)["headers"]["id"].split(":")[2]
                  for m in _redis(fake_server).lrange(QUEUE, 0, -1))


@pytest.fixture
def worker_channel(env):
    """A worker's channel: what it takes stays in kombu's unacked hash until it acks (or
    until the channel closes, when kombu hands it back)."""
    celery, _, _ = env
    conn = celery.connection_for_write()
    yield conn.default_channel
    conn.release()


def test_a_complete_queue_is_never_re_published(env, fake_server):
    celery, settings, store = env
    _enqueue(celery, settings, store, [f"c{i}" for i in range(10)])
    for _ in range(3):
        assert reconcile_once(settings, store, celery)["requeued"] == 0
    assert len(_ids(fake_server)) == 10


def test_half_the_queue_trimmed_re_publishes_exactly_the_missing_half(env, fake_server):
    celery, settings, store = env
    chapters = [f"c{i}" for i in range(10)]
    _enqueue(celery, settings, store, chapters)
    # A replica that lagged behind: the newest five pushes (the head of the list) are gone.
    _redis(fake_server).ltrim(QUEUE, 5, -1)
    assert _ids(fake_server) == ["c0", "c1", "c2", "c3", "c4"]
    result = reconcile_once(settings, store, celery)
    assert result["requeued_lost"] == 5 and result["requeued"] == 5
    assert _ids(fake_server) == chapters  # each chapter has exactly one message again
    report = store.status("exam").as_dict()
    requeued = {c["id"]: c for c in report["chapter_list"] if c["requeues"]}
    assert set(requeued) == {"c5", "c6", "c7", "c8", "c9"}
    assert all(c["requeue_code"] == RequeueReason.message_lost for c in requeued.values())
    # People read the code and its detail, as before codes.
    assert all(c["requeue_reason"].startswith("message_lost: the queue held")
               for c in requeued.values())
    # The next passes find nothing missing: no storm.
    time.sleep(0.05)
    assert reconcile_once(settings, store, celery)["requeued"] == 0


def test_the_whole_queue_deleted_or_purged_is_re_published(env, fake_server):
    celery, settings, store = env
    _enqueue(celery, settings, store, ["a", "b", "c"])
    _redis(fake_server).delete(QUEUE)
    assert reconcile_once(settings, store, celery)["requeued_lost"] == 3
    assert _ids(fake_server) == ["a", "b", "c"]
    time.sleep(0.05)
    with celery.connection_for_write() as conn:
        conn.default_channel.queue_purge(QUEUE)  # what `celery -A tasks purge` does
    assert reconcile_once(settings, store, celery)["requeued_lost"] == 3
    assert store.status("exam").as_dict()["chapter_list"][0]["requeues"] == 2


def test_a_message_a_worker_holds_unacked_counts_as_present(env, fake_server, worker_channel):
    celery, settings, store = env
    _enqueue(celery, settings, store, ["a", "b", "c"])
    # "a": delivered to a worker, not started (so not picked) yet.
    assert worker_channel.basic_get(QUEUE, no_ack=False) is not None
    holdings = queue_holdings(celery, settings)
    assert holdings is not None
    assert holdings.queued == 2 and holdings.unacked == [("exam", "a", 0)]
    assert reconcile_once(settings, store, celery)["requeued"] == 0
    _redis(fake_server).delete(QUEUE)  # b and c lost; a is still held by the worker
    assert reconcile_once(settings, store, celery)["requeued_lost"] == 2
    assert _ids(fake_server) == ["b", "c"]


def test_a_message_held_past_a_lease_and_never_started_is_re_published(
        env, fake_server, worker_channel):
    """A worker SIGKILLed between receiving a message and claiming its slice leaves the message
    in kombu's unacked hash until the visibility timeout (hours), and the slice with no lease
    to expire: held that long without being picked, the message counts as gone with its
    worker, and the slice gets a new one (a second delivery of the old is a no-op)."""
    celery, settings, store = env
    _enqueue(celery, settings, store, ["a", "b"])
    assert worker_channel.basic_get(QUEUE, no_ack=False) is not None  # "a", never started
    redis = _redis(fake_server)
    (tag, delivered_at), = redis.zrange("unacked_index", 0, -1, withscores=True)
    assert reconcile_once(settings, store, celery)["requeued"] == 0  # a moment ago: held
    redis.zadd("unacked_index", {tag: delivered_at - settings.lease_s - 1})
    holdings = queue_holdings(celery, settings)
    assert holdings is not None and holdings.unacked == []
    assert reconcile_once(settings, store, celery)["requeued_lost"] == 1
    assert _ids(fake_server) == ["a", "b"]
    time.sleep(0.05)  # no storm: the new message is in the list
    assert reconcile_once(settings, store, celery)["requeued"] == 0


def test_duplicates_and_stale_messages_never_cause_a_re_publish(env, fake_server):
    celery, settings, store = env
    _enqueue(celery, settings, store, ["a", "b"])
    publish_slices(celery, "exam", [("a", 0), ("b", 0)])  # enqueue run twice
    _redis(fake_server).ltrim(QUEUE, 0, 2)  # one message lost, but a duplicate hides it
    assert reconcile_once(settings, store, celery)["requeued"] == 0


def test_other_queues_unacked_messages_do_not_hide_a_loss(env, fake_server, make_settings):
    celery, settings, store = env
    _enqueue(celery, settings, store, ["a"])
    # Another deployment on the same Redis database holds an unacked message on its queue.
    other = _redis(fake_server)
    other.hset("unacked", "tag-1", '["{\\"headers\\": {\\"id\\": \\"examforge:exam:a\\"}}", '
                                   '"other-q", "other-q"]')
    other.delete(QUEUE)
    assert reconcile_once(settings, store, celery)["requeued_lost"] == 1


def test_chapters_enqueued_a_moment_ago_are_left_alone(env, fake_server, make_settings):
    celery, settings, store = env
    object.__setattr__(settings, "reconcile_interval_s", 30.0)  # minimum age 60 s
    _enqueue(celery, settings, store, ["a", "b"])
    _redis(fake_server).delete(QUEUE)
    # An enqueue marks its chapters before publishing: a young chapter's message may be
    # on its way; the pass must not count it as lost.
    assert reconcile_once(settings, store, celery)["requeued"] == 0


def test_a_broker_that_lost_its_epoch_is_handled_once_not_twice(env, fake_server):
    celery, settings, store = env
    _enqueue(celery, settings, store, ["a", "b"])
    _redis(fake_server).flushall()
    result = reconcile_once(settings, store, celery)
    assert result == {"requeued": 2, "requeued_lost": 0, "requeued_reopened": 0,
                      "failed_at_cap": 0,
                      "settled_cancelled": 0, "settled_orphans": 0, "paused_budget": 0}
    assert _ids(fake_server) == ["a", "b"]
    reasons = {c["requeue_code"] for c in store.status("exam").as_dict()["chapter_list"]}
    assert reasons == {RequeueReason.broker_epoch_changed.value}
