"""Work-arounds for known races in the libraries below us. Each one is small, names its issue,
and is checked by a test, so it can be dropped when the library fixes it."""

from __future__ import annotations

import functools

import redis
from kombu.transport import redis as kombu_redis

_PATCHED = "_examforge_patched"


def patch_kombu_redis_close_race() -> None:
    """Keep a worker alive when the broker connection drops while threads still ack.

    With the threads pool, a task thread can ack (or the consumer can restore unacked messages)
    just as kombu closes the broken connection; the channel then asks for a new connection pool
    from a transport whose `client` is already None and dies with AttributeError 'hostname'
    (celery/kombu#582, #970, seen here in a Redis restart test). kombu's `ignore_errors` only
    swallows connection errors, so the AttributeError escapes and the worker exits. Raising the
    connection error it really is lets kombu ignore it and reconnect; the messages that could
    not be restored stay in Redis' unacked set and come back after the visibility timeout (and
    the reconciler re-enqueues their chapters sooner)."""
    original = kombu_redis.Channel._connparams
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def _connparams(self, asynchronous=False):  # type: ignore[no-untyped-def]
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("broker connection already closed")
        return original(self, asynchronous=asynchronous)

    setattr(_connparams, _PATCHED, True)
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]
