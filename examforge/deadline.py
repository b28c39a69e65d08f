"""A total deadline for one HTTP call, from the first byte sent to the last byte received.

httpx's timeouts apply to each socket operation, not to the whole response: a server, gateway or
proxy that sends a few bytes a second keeps a call alive for as long as it likes. httpx has no
total timeout, so this wraps httpcore's network layer: every connect, read and write is given
the smaller of its own timeout and what is left of the call's deadline, and fails at once when
nothing is left. The failed read closes the connection (httpcore drops a connection whose
response was not read to the end), so an abandoned call never holds a socket.

Written by hand because no maintained library does it for httpx's sync client; it is small, and
`tests/unit/test_deadline.py` checks it against a server that trickles its reply. The deadline
is per thread: one httpx call runs in its caller's thread from start to finish.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
import typing
import weakref
from typing import Iterator

import httpcore
import httpx

_local = threading.local()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound every socket operation of this thread's HTTP calls by `seconds` from now."""
    _local.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.at = None


def expired() -> bool:
    at = getattr(_local, "at", None)
    return at is not None and time.monotonic() >= at


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    at = getattr(_local, "at", None)
    if at is None:
        return timeout
    remaining = at - time.monotonic()
    if remaining <= 0:
        raise error("the call's deadline passed")
    return remaining if timeout is None else min(timeout, remaining)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname,
                                             _bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: typing.Iterable[typing.Any] | None = None,
                    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port,
                                               _bounded(timeout, httpcore.ConnectTimeout),
                                               local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[typing.Any] | None = None,
                            ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(
            path, _bounded(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport, with its network layer bounded by `deadline()`."""

    def __init__(self, **kwargs: typing.Any) -> None:
        super().__init__(**kwargs)
        pool = self._pool
        # httpx builds its httpcore pool without a way to pass a network backend; the pool
        # keeps it in one attribute, read at each new connection. A test fails if that moves.
        pool._network_backend = _Backend(pool._network_backend)  # type: ignore[union-attr]


class PerThreadTransport(httpx.BaseTransport):
    """`DeadlineTransport`, one for each thread that sends through it.

    httpcore's connection pool takes one lock for every request and for every response's
    close, and while it holds it checks each of its connections for expiry with a system
    call. At 64 threads a worker process's task threads spent two thirds of their time
    waiting for that lock (py-spy --idle, 2 processes × 64 threads, PostgreSQL, group commit
    off), more than waiting for the model. A thread sends one call at a time, so its own
    pool holds one connection, kept alive between its calls. Why by hand: httpx has no
    per-thread pool, and a client per thread would copy its settings. The TLS context is
    made once and shared by the pools (loading the CA bundle costs about 20 ms of CPU).
    A thread's pool is closed when the thread is gone (a run's chapter threads in `serve`
    end with the run), or at `close`."""

    def __init__(self, **kwargs: typing.Any) -> None:
        # The first pool is made here, with its TLS context (httpx's own default one) that
        # the others take: a call's first send then pays no more than it did with one pool
        # (a thread's first send makes only its pool, a few µs).
        first = DeadlineTransport(**kwargs)
        if "verify" not in kwargs:
            kwargs = {**kwargs, "verify": first._pool._ssl_context}
        self._kwargs = kwargs
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pools: weakref.WeakSet[DeadlineTransport] = weakref.WeakSet([first])
        self._spare: DeadlineTransport | None = first  # for the first thread that sends

    def _mine(self) -> DeadlineTransport:
        pool: DeadlineTransport | None = getattr(self._local, "pool", None)
        if pool is None:
            with self._lock:
                pool, self._spare = self._spare, None
                if pool is None:
                    pool = DeadlineTransport(**self._kwargs)
                    self._pools.add(pool)
            self._local.pool = pool
            # Held by this thread's local storage only: closed (its kept-alive connection
            # with it) once the thread is gone.
            weakref.finalize(threading.current_thread(), pool.close)
        return pool

    @property
    def pools(self) -> int:
        """How many pools it has made (one per thread that sent)."""
        return len(self._pools)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._mine().handle_request(request)

    def close(self) -> None:
        with self._lock:
            pools, self._pools, self._spare = list(self._pools), weakref.WeakSet(), None
            self._local = threading.local()
        for pool in pools:
            pool.close()
