"""The call's total deadline and the reply size cap, against a real socket server that
trickles its reply or sends too much (httpx's own timeouts are per read and would not stop it)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from typing import Callable, Iterator

import pytest

from examforge.errors import DeadlineExceeded, ReplyTooLarge
from examforge.llm import LLMClient

REPLY = json.dumps({"model": "m", "choices": [{"message": {"content": "{}"},
                                                "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


class Server:
    """One thread per connection; `respond(conn)` writes whatever the test wants."""

    def __init__(self, respond: Callable[[socket.socket], None]) -> None:
        self.respond = respond
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closed_by_client = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int([h for h in head.split(b"\r\n") if h.lower().startswith(
                b"content-length")][0].split(b":")[1])
            while len(body) < length:
                body += conn.recv(65536)
            try:
                self.respond(conn)
            except OSError:  # the client hung up on us
                self.closed_by_client.set()


def _head(length: int, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            f"{extra}\r\n").encode()


@pytest.fixture
def serve(make_settings) -> Iterator[Callable[..., tuple[LLMClient, Server]]]:
    made: list[tuple[LLMClient, Server]] = []

    def make(respond: Callable[[socket.socket], None], **settings) -> tuple[LLMClient, Server]:
        server = Server(respond)
        client = LLMClient(make_settings(llm_base_url=f"http://127.0.0.1:{server.port}/v1",
                                         **settings))
        made.append((client, server))
        return client, server

    yield make
    for client, server in made:
        client.close()
        server.sock.close()


MESSAGES = [{"role": "user", "content": "Exam: e\nChapter id: c"}]


def test_a_reply_that_trickles_is_abandoned_at_the_deadline(serve):
    def trickle(conn: socket.socket) -> None:
        conn.sendall(_head(len(REPLY)))
        for byte in REPLY:  # one byte every 0.2 s: each read succeeds well within its timeout
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    client, server = serve(trickle, llm_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        client.complete(MESSAGES)
    elapsed = time.monotonic() - started
    assert 1.4 <= elapsed < 3.0, elapsed  # the whole reply would take 30 s
    assert "deadline" in str(info.value) and info.value.billed.prompt_tokens > 0
    # The connection was closed, not left to finish in the background.
    assert server.closed_by_client.wait(5)


def test_headers_that_trickle_are_abandoned_at_the_deadline(serve):
    def trickle_headers(conn: socket.socket) -> None:
        for byte in _head(len(REPLY)):
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    client, _ = serve(trickle_headers, llm_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        client.complete(MESSAGES)
    assert time.monotonic() - started < 2.5


def test_a_reply_within_the_deadline_is_read_whole(serve):
    def slow_but_in_time(conn: socket.socket) -> None:
        conn.sendall(_head(len(REPLY)))
        for i in range(0, len(REPLY), 40):
            conn.sendall(REPLY[i:i + 40])
            time.sleep(0.02)

    client, _ = serve(slow_but_in_time, llm_timeout_s=5)
    assert client.complete(MESSAGES).content == "{}"
    # The deadline belongs to one call: a keep-alive connection reused later is not affected.
    time.sleep(0.1)
    assert client.complete(MESSAGES).content == "{}"


def test_a_reply_over_the_cap_is_refused_before_it_is_read(serve):
    big = b'{"x": "' + b"a" * 200_000 + b'"}'

    def oversized(conn: socket.socket) -> None:
        conn.sendall(_head(len(big)) + big)

    client, _ = serve(oversized, llm_max_reply_bytes=100_000)
    with pytest.raises(ReplyTooLarge) as info:
        client.complete(MESSAGES)
    assert "Content-Length 200009" in str(info.value)


def test_a_reply_over_the_cap_without_a_length_is_cut_off(serve):
    sent = threading.Event()

    def chunked_forever(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * 65536
        for _ in range(10_000):  # 640 MB if nobody stopped reading
            conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        sent.set()

    client, server = serve(chunked_forever, llm_max_reply_bytes=1_000_000)
    with pytest.raises(ReplyTooLarge):
        client.complete(MESSAGES)
    assert server.closed_by_client.wait(5) and not sent.is_set()


def test_a_small_compressed_reply_that_inflates_past_the_cap_is_refused(serve):
    bomb = gzip.compress(b'{"x": "' + b"a" * 5_000_000 + b'"}')
    assert len(bomb) < 100_000

    def gzip_bomb(conn: socket.socket) -> None:
        conn.sendall(_head(len(bomb), "Content-Encoding: gzip\r\n") + bomb)

    client, _ = serve(gzip_bomb, llm_max_reply_bytes=1_000_000)
    with pytest.raises(ReplyTooLarge):
        client.complete(MESSAGES)
