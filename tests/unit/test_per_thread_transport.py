"""The model client's connection pools, one per thread (examforge.deadline.PerThreadTransport):
a thread's calls reuse its own kept-alive connection, no two threads share a pool (and so
never wait for each other's pool lock), every pool has the call's deadline, and they share
one TLS context."""

from __future__ import annotations

import gc
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest

from examforge.deadline import DeadlineTransport, PerThreadTransport, _Backend


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    seen: list[tuple[str, int]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append((self.path, self.client_address[1]))
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    seen: list[tuple[str, int]] = []
    handler = type("Handler", (_Handler,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def test_each_thread_keeps_its_own_connection_and_pool(server, monkeypatch) -> None:
    url, seen = server
    closed: list[int] = []  # ids: holding the pools would keep them alive
    original_close = DeadlineTransport.close

    def close(self: DeadlineTransport) -> None:
        closed.append(id(self))
        original_close(self)

    monkeypatch.setattr(DeadlineTransport, "close", close)
    transport = PerThreadTransport()
    with httpx.Client(base_url=url, transport=transport) as client:
        for i in range(3):
            assert client.get(f"/main-{i}").text == "ok"
        barrier = threading.Barrier(4)

        def send(name: str) -> None:
            barrier.wait()  # all four at once: a shared pool would open or share connections
            for i in range(2):
                assert client.get(f"/{name}-{i}").text == "ok"

        threads = [threading.Thread(target=send, args=(f"t{n}",)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert transport.pools == 5
        ports = {path.rsplit("-", 1)[0]: set() for path, _ in seen}
        for path, port in seen:
            ports[path.rsplit("-", 1)[0]].add(port)
        # One connection a thread, reused for each of its calls; no two threads share one.
        assert all(len(p) == 1 for p in ports.values()), ports
        assert len(set().union(*ports.values())) == 5
        pools = transport._pools
        # Every pool is bounded by the call's deadline, and the TLS context is made once.
        assert all(isinstance(p._pool._network_backend, _Backend) for p in pools)
        assert len({id(p._pool._ssl_context) for p in pools}) == 1
        # A thread gone takes its pool with it (a run's chapter threads end with the run).
        del pools, t
        threads.clear()
        gc.collect()
        assert transport.pools == 1 and len(closed) == 4  # the main thread's is left
        assert client.get("/main-again").text == "ok"
    assert transport.pools == 0  # closed with the client
