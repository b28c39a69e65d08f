"""A small HTTP/1.1 server layer: request parsing, replies and socket-level faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from mockllm.replies import error_payload

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else {}


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode(), headers or {})


def error_response(status: int, message: str, error_type: str, code: str | None = None) -> Response:
    return json_response(status, error_payload(message, error_type, code))


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "malformed request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise HttpError(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    method, target, version = parts
    path = target.split("?", 1)[0]
    if len(path) > 1:
        path = path.rstrip("/")
    return method.upper(), path, version, headers


def _content_length(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise HttpError(501, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HttpError(400, "invalid Content-Length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise HttpError(413 if length > 0 else 400, "unacceptable Content-Length")
    return length


class Connection:
    """One client connection: buffered request parsing, replies and socket-level faults."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._buffer = bytearray()
        self._eof = False

    async def _fill(self) -> bool:
        """Read more bytes into the buffer; False once the peer has gone away."""
        if self._eof:
            return False
        try:
            chunk = await self._reader.read(READ_CHUNK_BYTES)
        except ConnectionError:
            chunk = b""
        if not chunk:
            self._eof = True
            return False
        self._buffer += chunk
        return True

    async def read_request(self) -> Request | None:
        """Next request on the connection, or None when the client closed it."""
        while True:
            # RFC 9112 lets clients send stray CRLFs between requests.
            while self._buffer[:2] == b"\r\n":
                del self._buffer[:2]
            end = self._buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._buffer) > MAX_HEADER_BYTES:
                raise HttpError(431, "request headers too large")
            if not await self._fill():
                return None
        method, path, version, headers = _parse_head(bytes(self._buffer[:end]))
        del self._buffer[: end + 4]
        length = _content_length(headers)
        if headers.get("expect", "").lower() == "100-continue" and len(self._buffer) < length:
            await self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(self._buffer) < length:
            if not await self._fill():
                return None
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        return Request(method, path, version, headers, body)

    async def wait_unless_closed(self, delay: float) -> bool:
        """Sleep ``delay`` seconds; return False early if the client hangs up.

        A plain asyncio.sleep would keep a timed-out request "in flight" for
        the whole stall and skew the concurrency stats, so we keep reading
        (into the buffer, nothing is lost) to notice the client's FIN/RST.
        """
        deadline = time.monotonic() + delay
        while not self._eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            try:
                async with asyncio.timeout(remaining):
                    await self._fill()
            except TimeoutError:
                return True
        return False

    async def _write(self, data: bytes) -> bool:
        if self._writer.is_closing():
            return False
        try:
            self._writer.write(data)
            await self._writer.drain()
        except ConnectionError:
            return False
        return True

    async def send(self, response: Response, keep_alive: bool) -> bool:
        """Write a full response; False if the client is already gone."""
        if self._eof:
            return False
        lines = [
            f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
            "Server: examforge-mockllm",
            "Content-Type: application/json",
            f"Content-Length: {len(response.body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
            *(f"{name}: {value}" for name, value in response.headers.items()),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return await self._write(head + response.body)

    def reset(self) -> None:
        """Drop the connection with a TCP RST instead of an orderly FIN."""
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._writer.transport.abort()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()

