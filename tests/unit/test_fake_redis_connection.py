"""The fakeredis connection the unit tier puts under kombu (helpers.fake_redis_connection_class)
against the installed redis-py's handshake.

kombu opens its connections with a client name, a database and a health-check interval, so
redis-py sends CLIENT SETNAME, CLIENT SETINFO twice and SELECT, each send preceded by a health
check. redis-py 8.2 pipelines those sends and reads the replies afterwards: a health check that
fires between them reads a handshake reply instead of its PONG. These tests fail on redis-py 8.2
with fakeredis's own connection class (2.41), and pass with the tests' one."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from helpers import fake_redis_connection_class


def _client(connection_class: type, server: fakeredis.FakeServer) -> redis.Redis:
    pool = redis.ConnectionPool(connection_class=connection_class, server=server, db=3,
                                client_name="kombu-like", health_check_interval=25)
    return redis.Redis(connection_pool=pool)


def test_a_kombu_like_handshake_with_health_checks_reads_every_reply_in_order():
    server = fakeredis.FakeServer()
    client = _client(fake_redis_connection_class(server), server)
    for i in range(5):
        assert client.set(f"k{i}", i) is True
        assert client.get(f"k{i}") == str(i).encode()
    assert client.client_getname() == "kombu-like"
    # The SELECT of the handshake took effect: the keys are in database 3, not 0.
    assert fakeredis.FakeRedis(server=server, db=3).dbsize() == 5
    assert fakeredis.FakeRedis(server=server, db=0).dbsize() == 0


def test_a_health_check_due_between_commands_still_gets_its_pong(monkeypatch):
    server = fakeredis.FakeServer()
    client = _client(fake_redis_connection_class(server), server)
    client.ping()
    connection = client.connection_pool.get_connection()
    try:
        connection.next_health_check = 0  # due now: the next send checks first
        connection.send_command("GET", "missing")
        assert connection.read_response() is None
    finally:
        client.connection_pool.release(connection)


def test_the_tests_need_their_own_class_while_fakeredis_lags_the_client():
    """Says which releases the helper exists for: when fakeredis's own class passes this
    handshake, the helper's read_response can go (and this test tells whoever upgrades)."""
    server = fakeredis.FakeServer()
    own = _client(fakeredis.FakeRedisConnection, server)
    try:
        for i in range(3):
            own.set(f"k{i}", i)
        works = True
    except redis.ConnectionError:
        works = False
    version = tuple(int(p) for p in redis.__version__.split(".")[:2])
    if version >= (8, 2) and works:
        pytest.fail(f"fakeredis {fakeredis.__version__} handles redis-py {redis.__version__}'s "
                    "handshake itself: drop helpers.fake_redis_connection_class's read_response")
