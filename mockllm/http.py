"""A small HTTP/1.1 server layer: request parsing, replies and socket-level faults.

Hand-written on asyncio streams because the faults act on the socket itself: a TCP RST
(``SO_LINGER`` 0 + ``transport.abort()``), a stall that notices the client hang up, a body
trickled out piece by piece after its headers.
"""

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
from urllib.parse import parse_qs

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024
JSON = "application/json"


class HttpError(Exception):
    """Raised when a request cannot be parsed; answered with ``status`` and the connection closed."""

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
    query: dict[str, str] = field(default_factory=dict)

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
    content_type: str = JSON


def error_payload(message: str, error_type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI-style error body."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload, ensure_ascii=False).encode(), dict(headers or {}))


def error_response(
    status: int, message: str, error_type: str, code: str | None = None, param: str | None = None
) -> Response:
    return json_response(status, error_payload(message, error_type, code, param))


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str], str, dict[str, str]]:
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
    path, _, query_string = target.partition("?")
    if len(path) > 1:
        path = path.rstrip("/")
    query = {name: values[-1] for name, values in parse_qs(query_string, keep_blank_values=True).items()}
    return method.upper(), path, query, version, headers


def _content_length(headers: dict[str, str]) -> int:
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HttpError(400, "invalid Content-Length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise HttpError(413 if length > 0 else 400, "unacceptable Content-Length")
    return length


def parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """``multipart/form-data`` fields: name -> (filename or None, content). Raises ValueError."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise ValueError("expected a multipart/form-data body")
    boundary = ""
    for param in params.split(";"):
        param_name, _, value = param.strip().partition("=")
        if param_name.lower() == "boundary":
            boundary = value.strip().strip('"')
    if not boundary:
        raise ValueError("multipart body without a boundary")
    delimiter = b"--" + boundary.encode("latin-1")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        part = part.removeprefix(b"\r\n").removesuffix(b"\r\n")
        head, sep, content = part.partition(b"\r\n\r\n")
        if not sep:
            raise ValueError("malformed multipart part")
        disposition = ""
        for line in head.decode("utf-8", "replace").split("\r\n"):
            header, _, value = line.partition(":")
            if header.strip().lower() == "content-disposition":
                disposition = value
        params_of = {}
        for item in disposition.split(";"):
            key, _, value = item.strip().partition("=")
            params_of[key.strip().lower()] = value.strip().strip('"')
        if "name" in params_of:
            fields[params_of["name"]] = (params_of.get("filename"), content)
    return fields


class Connection:
    """One client connection: buffered request parsing, replies and socket-level faults."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._buffer = bytearray()
        self._eof = False

    @property
    def closed(self) -> bool:
        """Whether the client has gone away (as far as the reads so far have seen)."""
        return self._eof or self._writer.is_closing()

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

    async def _read_line(self) -> bytes | None:
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > MAX_HEADER_BYTES:
                raise HttpError(400, "chunk size line too long")
            if not await self._fill():
                return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    async def _read_exactly(self, length: int) -> bytes | None:
        while len(self._buffer) < length:
            if not await self._fill():
                return None
        data = bytes(self._buffer[:length])
        del self._buffer[:length]
        return data

    async def _read_chunked(self) -> bytes | None:
        """A ``Transfer-Encoding: chunked`` body (some clients stream multipart uploads)."""
        body = bytearray()
        while True:
            line = await self._read_line()
            if line is None:
                return None
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpError(400, "malformed chunk size") from None
            if size == 0:
                while (trailer := await self._read_line()) not in (b"", None):
                    del trailer
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise HttpError(413, "request body too large")
            chunk = await self._read_exactly(size + 2)
            if chunk is None:
                return None
            body += chunk[:size]

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
        method, path, query, version, headers = _parse_head(bytes(self._buffer[:end]))
        del self._buffer[: end + 4]
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = 0 if chunked else _content_length(headers)
        if headers.get("expect", "").lower() == "100-continue" and (chunked or len(self._buffer) < length):
            await self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await (self._read_chunked() if chunked else self._read_exactly(length))
        if body is None:
            return None
        return Request(method, path, version, headers, body, query)

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

    @staticmethod
    def _head(response: Response, keep_alive: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
            "Server: mockllm",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
            *(f"{name}: {value}" for name, value in response.headers.items()),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, response: Response, keep_alive: bool) -> bool:
        """Write a full response; False if the client is already gone."""
        if self._eof:
            return False
        return await self._write(self._head(response, keep_alive) + response.body)

    async def trickle(self, response: Response, keep_alive: bool, pieces: int, interval_s: float) -> bool:
        """Headers at once, then the body in ``pieces`` pieces ``interval_s`` apart.

        Each piece arrives well within a per-read timeout, so only a client with a deadline
        on the whole request notices; False if the client hangs up before the last piece.
        """
        if self._eof or not await self._write(self._head(response, keep_alive)):
            return False
        body = response.body
        size = -(-len(body) // pieces)  # ceiling division
        for start in range(0, len(body), size):
            if not await self.wait_unless_closed(interval_s):
                return False
            if not await self._write(body[start : start + size]):
                return False
        return True

    async def cut(self, response: Response) -> None:
        """Headers (with the full Content-Length) and the first half of the body, then the
        connection closes: a reply cut off mid-stream, as a proxy or a crashed server leaves it."""
        if self._eof or not await self._write(self._head(response, False)):
            return
        await self._write(response.body[: len(response.body) // 2])
        self.close()

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
