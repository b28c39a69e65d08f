from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from kombu.transport import redis as kombu_redis

import tasks  # noqa: F401  (importing the app applies the patch)
from tasks.patches import patch_kombu_redis_close_race


def test_a_closed_transport_raises_a_connection_error_kombu_can_ignore():
    patch_kombu_redis_close_race()  # idempotent
    channel = SimpleNamespace(connection=SimpleNamespace(client=None))
    with pytest.raises(redis.exceptions.ConnectionError):
        kombu_redis.Channel._connparams(channel)
    assert redis.exceptions.ConnectionError in kombu_redis.Transport.connection_errors


def test_an_open_transport_still_builds_its_parameters():
    from kombu import Connection

    with Connection("redis://127.0.0.1:6379/9") as conn:
        params = conn.default_channel._connparams()
    assert params["host"] == "127.0.0.1" and params["port"] == 6379
