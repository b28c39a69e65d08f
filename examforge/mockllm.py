"""OpenAI-compatible mock chat-completions server with fault injection.

Used by tests, demos and benchmarks in place of a real LLM provider. It answers
``POST /v1/chat/completions`` with multiple-choice questions built from the
prompt lines ``Exam:``, ``Chapter id:``, ``Chapter title:`` and
``Number of questions:``, and can inject transport faults (429/5xx, TCP
resets, stalls) and output faults (malformed, truncated, wrong schema, ...)
either at random (seeded, hence reproducible) or from a per-chapter script.

Control endpoints: ``GET /v1/models`` (health check), ``GET /_stats``,
``POST /_reset``, ``POST /_config`` (``GET /_config`` shows the config).
Every path also works with or without the ``/v1`` prefix.

Outcome names recorded in the stats are ``"ok"`` for normal replies, the
fault name for injected faults, ``"auth_failed"`` when the API key does not
match and ``"invalid_request"`` when the request body is not a JSON object;
the last two are kept apart from the injected ``"401"``/``"400"`` so a
client bug never hides among planned faults.

Why the HTTP layer is hand-written on ``asyncio.start_server`` instead of an
ASGI framework: the faults must act on the socket itself (a TCP RST through
``SO_LINGER`` 0 + ``transport.abort()``, a stall that notices the client hang
up), which ASGI servers hide behind their own connection handling; it also
keeps the mock free of any extra dependency.

Run it standalone with ``python -m examforge.mockllm --port 8089``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import json
import math
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

OK = "ok"
TRANSIENT_FAULTS: tuple[str, ...] = ("429", "500", "503", "reset", "stall")
PERMANENT_FAULTS: tuple[str, ...] = ("400", "401")
OUTPUT_FAULTS: tuple[str, ...] = (
    "malformed",
    "truncated",
    "short",
    "fenced",
    "wrong_schema",
    "bad_choices",
    "bad_index",
    "refusal",
    "empty",
    "duplicate",
)
ALL_FAULTS: tuple[str, ...] = TRANSIENT_FAULTS + PERMANENT_FAULTS + OUTPUT_FAULTS
DEFAULT_FAULTS: tuple[str, ...] = TRANSIENT_FAULTS + OUTPUT_FAULTS
AUTH_FAILED = "auth_failed"
INVALID_REQUEST = "invalid_request"

MODEL_ID = "mock-model"
UNKNOWN_CHAPTER = "unknown"
DEFAULT_QUESTION_COUNT = 5
RETRY_AFTER_TOLERANCE_S = 0.05
LISTEN_BACKLOG = 1024
DEFAULT_PORT = 8089
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024
MALFORMED_CONTENT = 'Sure! Here are your questions: {"questions": ['
REFUSAL_CONTENT = "I'm sorry, but I can't help with that."

# (status, message, OpenAI error type, OpenAI error code) per error fault.
_ERROR_FAULTS: dict[str, tuple[int, str, str, str | None]] = {
    "429": (429, f"Rate limit reached for {MODEL_ID}. Please try again later.", "requests", "rate_limit_exceeded"),
    "500": (500, "The server had an error while processing your request.", "server_error", None),
    "503": (503, "The engine is currently overloaded, please try again later.", "server_error", None),
    "400": (400, "Invalid request (injected fault).", "invalid_request_error", None),
    "401": (401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
}


# --------------------------------------------------------------------------- config


def _as_name_list(value: Any, allowed: Iterable[str], what: str) -> list[str]:
    """Accept a list or a comma-separated string of names, all in ``allowed``."""
    if isinstance(value, str):
        names = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, (list, tuple)):
        names = [str(part).strip() for part in value]
    else:
        raise ValueError(f"{what} must be a list of names or a comma-separated string")
    allowed_set = set(allowed)
    unknown = [name for name in names if name not in allowed_set]
    if unknown:
        raise ValueError(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(sorted(allowed_set))})")
    return names


def _non_negative_float(value: Any, name: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return number


@dataclass
class MockConfig:
    """Runtime behaviour of the mock; every field can be changed via ``/_config``.

    ``script`` maps a chapter key (``"<slug>/<chapter_id>"``) to the outcomes
    (fault names or ``"ok"``) of that chapter's next calls, consumed in order;
    once a chapter's list is used up, normal behaviour (including random
    faults) resumes.
    """

    latency_s: float = 0.05
    questions_per_reply: int | None = None
    api_key: str | None = None
    fault_rate: float = 0.0
    faults: list[str] = field(default_factory=lambda: list(DEFAULT_FAULTS))
    seed: int = 0
    retry_after_s: float = 1.0
    stall_s: float = 30.0
    script: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalising here means both the constructor and dataclasses.replace
        # (used for runtime updates) reject bad values before they take effect.
        self.latency_s = _non_negative_float(self.latency_s, "latency_s")
        self.retry_after_s = _non_negative_float(self.retry_after_s, "retry_after_s")
        self.stall_s = _non_negative_float(self.stall_s, "stall_s")
        self.fault_rate = _non_negative_float(self.fault_rate, "fault_rate")
        if self.fault_rate > 1:
            raise ValueError("fault_rate must be between 0 and 1")
        if self.questions_per_reply is not None:
            self.questions_per_reply = int(self.questions_per_reply)
            if self.questions_per_reply < 0:
                raise ValueError("questions_per_reply must be >= 0 or null")
        self.api_key = str(self.api_key) if self.api_key else None
        self.seed = int(self.seed)
        self.faults = _as_name_list(self.faults, ALL_FAULTS, "fault")
        if not isinstance(self.script, dict):
            raise ValueError("script must map chapter keys to lists of outcomes")
        self.script = {
            str(key): _as_name_list(outcomes, (*ALL_FAULTS, OK), "script outcome")
            for key, outcomes in self.script.items()
        }

    def updated(self, updates: dict[str, Any]) -> MockConfig:
        """Return a validated copy with ``updates`` applied; raise ValueError on bad input."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(updates) - known)
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(unknown)}")
        try:
            return dataclasses.replace(copy.deepcopy(self), **updates)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from exc

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready copy of the config."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- prompt

def _field_re(label: str, value: str) -> re.Pattern[str]:
    """Regex for a ``Label: value`` prompt line, tolerating list/markdown decoration."""
    return re.compile(rf"^[ \t>*_\-]*{label}[ \t]*:[ \t*_]*{value}", re.MULTILINE | re.IGNORECASE)


_EXAM_RE = _field_re("Exam", r"(\S+)")
_CHAPTER_ID_RE = _field_re(r"Chapter[ \t]+id", r"(\S+)")
_TITLE_RE = _field_re(r"Chapter[ \t]+title", r"(.*?)[ \t]*$")
_COUNT_RE = _field_re(r"Number[ \t]+of[ \t]+questions", r"(\d+)")


@dataclass(frozen=True)
class ChatPrompt:
    """What the mock extracted from a chat request."""

    key: str
    chapter_id: str
    title: str
    count: int
    model: str = MODEL_ID


def _message_text(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _last_user_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _message_text(message.get("content"))
    return ""


def parse_prompt(body: dict[str, Any]) -> ChatPrompt:
    """Extract chapter key, title and question count from an OpenAI request body."""
    text = _last_user_text(body)
    exam = _EXAM_RE.search(text)
    chapter = _CHAPTER_ID_RE.search(text)
    title = _TITLE_RE.search(text)
    count = _COUNT_RE.search(text)
    chapter_id = chapter.group(1) if chapter else UNKNOWN_CHAPTER
    key = f"{exam.group(1)}/{chapter_id}" if exam and chapter else UNKNOWN_CHAPTER
    model = body.get("model")
    return ChatPrompt(
        key=key,
        chapter_id=chapter_id,
        title=(title.group(1) if title and title.group(1) else chapter_id),
        count=int(count.group(1)) if count else DEFAULT_QUESTION_COUNT,
        model=model if isinstance(model, str) and model else MODEL_ID,
    )


# --------------------------------------------------------------------------- replies


def make_question(chapter_id: str, title: str, serial: int) -> dict[str, Any]:
    """Build one well-formed question; ``serial`` makes its text unique within the chapter."""
    answer_index = serial % 4
    return {
        "question": f"[{chapter_id} #{serial}] Which statement about {title} is correct? (variant {serial})",
        "choices": [f"Statement {letter} about {title} (variant {serial})" for letter in "ABCD"],
        "answer_index": answer_index,
        "explanation": f"Statement {'ABCD'[answer_index]} is the correct one for variant {serial}.",
    }


def _dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False)


def _question_count(outcome: str, prompt: ChatPrompt, config: MockConfig) -> int:
    count = prompt.count
    if config.questions_per_reply is not None:
        count = min(count, config.questions_per_reply)
    if outcome == "short":
        # Halving the capped count keeps "short" strictly shorter than a normal reply.
        return max(0, count // 2)
    return count


@dataclass
class _Content:
    text: str
    finish_reason: str
    # Well-formed, never-served-before questions a correct client may keep.
    fresh: list[dict[str, Any]]


def _render_content(
    outcome: str, questions: list[dict[str, Any]], earlier: dict[str, Any] | None, variant: int
) -> _Content:
    """Turn freshly minted questions into the reply content for ``outcome``."""
    if outcome in (OK, "stall", "short"):
        return _Content(_dumps({"questions": questions}), "stop", questions)
    if outcome == "fenced":
        return _Content(f"```json\n{_dumps({'questions': questions})}\n```", "stop", questions)
    if outcome == "malformed":
        return _Content(MALFORMED_CONTENT, "stop", [])
    if outcome == "truncated":
        full = _dumps({"questions": questions})
        return _Content(full[: len(full) // 2], "length", [])
    if outcome == "wrong_schema":
        # Alternate between the two schema mistakes models actually make.
        if variant % 2 == 0:
            return _Content(_dumps({"items": questions}), "stop", [])
        stripped = [{k: v for k, v in q.items() if k != "answer_index"} for q in questions]
        return _Content(_dumps({"questions": stripped}), "stop", [])
    if outcome in ("bad_choices", "bad_index"):
        broken = copy.deepcopy(questions) or [make_question("broken", "nothing", 0)]
        if outcome == "bad_choices":
            broken[0]["choices"] = broken[0]["choices"][:3]
        else:
            broken[0]["answer_index"] = 7
        return _Content(_dumps({"questions": broken}), "stop", questions[1:])
    if outcome == "refusal":
        return _Content(REFUSAL_CONTENT, "stop", [])
    if outcome == "empty":
        return _Content("", "stop", [])
    if outcome == "duplicate":
        return _render_duplicate(questions, earlier)
    raise ValueError(f"not an output outcome: {outcome}")


def _render_duplicate(questions: list[dict[str, Any]], earlier: dict[str, Any] | None) -> _Content:
    if earlier is not None:
        reply = [copy.deepcopy(earlier), *questions[1:]]
        return _Content(_dumps({"questions": reply}), "stop", questions[1:])
    # Nothing served to this chapter yet: repeat a question within the reply.
    kept = questions[: max(len(questions) - 1, 1)]
    reply = [*kept, copy.deepcopy(kept[0])] if kept else []
    return _Content(_dumps({"questions": reply}), "stop", kept)


def _tokens(chars: int) -> int:
    # ~4 characters per token is the usual rule of thumb; never report 0.
    return max(1, chars // 4)


def completion_payload(completion_id: str, prompt: ChatPrompt, content: _Content, request_chars: int) -> dict[str, Any]:
    """Standard ``chat.completion`` object with rough usage figures."""
    prompt_tokens = _tokens(request_chars)
    completion_tokens = _tokens(len(content.text))
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": prompt.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content.text},
                "finish_reason": content.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error_payload(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI-style error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def retry_after_seconds(config: MockConfig) -> int:
    """Value of the Retry-After header: ``retry_after_s`` rounded up, at least 1."""
    return max(1, math.ceil(config.retry_after_s))


# --------------------------------------------------------------------------- state


class _MockState:
    """Config, counters and fault draws; only ever touched from the event loop thread."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        # Lifetime state, deliberately kept across /_reset so texts never repeat.
        self.serials: Counter[str] = Counter()
        self.first_served: dict[str, dict[str, Any]] = {}
        self.completion_seq = 0
        self.wrong_schema_seq = 0
        # Live state, also kept across /_reset (requests may be in flight).
        self.inflight = 0
        self.inflight_by_chapter: Counter[str] = Counter()
        self._zero_stats()

    def _zero_stats(self) -> None:
        self.calls_total = 0
        self.calls_by_chapter: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.outcomes_by_chapter: dict[str, Counter[str]] = {}
        self.max_inflight = self.inflight
        self.max_inflight_by_chapter: dict[str, int] = {k: v for k, v in self.inflight_by_chapter.items() if v}
        self.retry_after_violations: list[dict[str, Any]] = []
        self.questions_served_by_chapter: Counter[str] = Counter()
        self.not_before: dict[str, float] = {}

    def reset(self) -> None:
        """Zero the stats, drop scripts and re-seed so a new run draws the same faults."""
        self._zero_stats()
        self.config.script.clear()
        self.rng = random.Random(self.config.seed)

    def update_config(self, updates: dict[str, Any]) -> MockConfig:
        """Apply a partial config update (validated as a whole before it takes effect)."""
        self.config = self.config.updated(updates)
        if "seed" in updates:
            self.rng = random.Random(self.config.seed)
        return self.config

    def begin_call(self, key: str) -> None:
        """Count a chat call, track concurrency and check the Retry-After promise."""
        self.calls_total += 1
        self.calls_by_chapter[key] += 1
        self.inflight += 1
        self.inflight_by_chapter[key] += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self.max_inflight_by_chapter[key] = max(self.max_inflight_by_chapter.get(key, 0), self.inflight_by_chapter[key])
        self._check_retry_after(key)

    def _check_retry_after(self, key: str) -> None:
        not_before = self.not_before.get(key)
        if not_before is None:
            return
        now = time.monotonic()
        if now < not_before - RETRY_AFTER_TOLERANCE_S:
            self.retry_after_violations.append({"chapter": key, "early_by_s": round(not_before - now, 3)})
        else:
            del self.not_before[key]

    def end_call(self, key: str) -> None:
        self.inflight -= 1
        self.inflight_by_chapter[key] -= 1
        if not self.inflight_by_chapter[key]:
            del self.inflight_by_chapter[key]

    def next_outcome(self, key: str) -> str:
        """Scripted outcome for this chapter if any, else a seeded random draw."""
        scripted = self.config.script.get(key)
        if scripted:
            outcome = scripted.pop(0)
            if not scripted:
                del self.config.script[key]
            return outcome
        config = self.config
        if config.fault_rate > 0 and config.faults and self.rng.random() < config.fault_rate:
            return self.rng.choice(config.faults)
        return OK

    def record_outcome(self, key: str, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.outcomes_by_chapter.setdefault(key, Counter())[outcome] += 1

    def promise_retry_after(self, key: str, seconds: int) -> None:
        self.not_before[key] = time.monotonic() + seconds

    def mint_questions(self, prompt: ChatPrompt, count: int) -> list[dict[str, Any]]:
        questions = []
        for _ in range(count):
            self.serials[prompt.key] += 1
            questions.append(make_question(prompt.chapter_id, prompt.title, self.serials[prompt.key]))
        return questions

    def next_completion_id(self) -> str:
        self.completion_seq += 1
        return f"chatcmpl-mock-{self.completion_seq}"

    def next_wrong_schema_variant(self) -> int:
        self.wrong_schema_seq += 1
        return self.wrong_schema_seq - 1

    def record_delivery(self, key: str, fresh: list[dict[str, Any]]) -> None:
        self.questions_served_by_chapter[key] += len(fresh)
        if fresh and key not in self.first_served:
            self.first_served[key] = copy.deepcopy(fresh[0])

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready copy of the stats."""
        return {
            "calls_total": self.calls_total,
            "calls_by_chapter": dict(self.calls_by_chapter),
            "outcomes": dict(self.outcomes),
            "outcomes_by_chapter": {key: dict(counts) for key, counts in self.outcomes_by_chapter.items()},
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "max_inflight_by_chapter": dict(self.max_inflight_by_chapter),
            "retry_after_violations": [dict(v) for v in self.retry_after_violations],
            "questions_served_by_chapter": dict(self.questions_served_by_chapter),
        }


# --------------------------------------------------------------------------- HTTP


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Request:
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
class _Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> _Response:
    return _Response(status, json.dumps(payload).encode(), headers or {})


def _error_response(status: int, message: str, error_type: str, code: str | None = None) -> _Response:
    return _json_response(status, error_payload(message, error_type, code))


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _HttpError(400, "malformed request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise _HttpError(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    method, target, version = parts
    path = target.split("?", 1)[0]
    if len(path) > 1:
        path = path.rstrip("/")
    return method.upper(), path, version, headers


def _content_length(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise _HttpError(501, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise _HttpError(400, "invalid Content-Length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise _HttpError(413 if length > 0 else 400, "unacceptable Content-Length")
    return length


class _Connection:
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

    async def read_request(self) -> _Request | None:
        """Next request on the connection, or None when the client closed it."""
        while True:
            # RFC 9112 lets clients send stray CRLFs between requests.
            while self._buffer[:2] == b"\r\n":
                del self._buffer[:2]
            end = self._buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._buffer) > MAX_HEADER_BYTES:
                raise _HttpError(431, "request headers too large")
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
        return _Request(method, path, version, headers, body)

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

    async def send(self, response: _Response, keep_alive: bool) -> bool:
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


_Handler = Callable[[_Connection, _Request], Awaitable[bool]]


class _MockService:
    """The mock's HTTP application plus its listening socket."""

    def __init__(self, config: MockConfig) -> None:
        self.state = _MockState(config)
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        # Paths are matched without their optional "/v1" prefix, so clients can
        # reach everything, control endpoints included, from the base URL.
        self._routes: dict[tuple[str, str], _Handler] = {
            ("POST", "/chat/completions"): self._chat_completions,
            ("GET", "/models"): self._simple(self._models),
            ("GET", "/_stats"): self._simple(self._stats),
            ("POST", "/_reset"): self._simple(self._reset),
            ("POST", "/_config"): self._simple(self._set_config),
            ("GET", "/_config"): self._simple(self._get_config),
        }

    async def listen(self, host: str, port: int) -> int:
        """Start accepting connections; return the bound port."""
        self._server = await asyncio.start_server(self._serve_connection, host, port, backlog=LISTEN_BACKLOG)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        # Let handlers see their closed transport and return: a handler still
        # running when asyncio.run() cancels it makes Python 3.11 log a spurious
        # CancelledError traceback from StreamReaderProtocol.
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(reader, writer)
        handler = asyncio.current_task()
        self._connections.add(connection)
        if handler is not None:
            self._handlers.add(handler)
        try:
            while True:
                try:
                    request = await connection.read_request()
                except _HttpError as exc:
                    await connection.send(_error_response(exc.status, exc.message, "invalid_request_error"), False)
                    return
                if request is None or not await self._dispatch(connection, request):
                    return
        except ConnectionError:
            pass
        finally:
            self._connections.discard(connection)
            self._handlers.discard(handler)  # type: ignore[arg-type]
            connection.close()

    async def _dispatch(self, connection: _Connection, request: _Request) -> bool:
        path = request.path.removeprefix("/v1") if request.path.startswith("/v1/") else request.path
        handler = self._routes.get((request.method, path))
        if handler is not None:
            return await handler(connection, request)
        if any(route_path == path for _, route_path in self._routes):
            response = _error_response(405, f"method {request.method} not allowed", "invalid_request_error")
        else:
            response = _error_response(404, f"unknown path {request.path}", "invalid_request_error")
        return await connection.send(response, request.keep_alive) and request.keep_alive

    @staticmethod
    def _simple(handler: Callable[[_Request], _Response]) -> _Handler:
        """Adapt a request -> response function to the connection-level handler shape."""

        async def run(connection: _Connection, request: _Request) -> bool:
            return await connection.send(handler(request), request.keep_alive) and request.keep_alive

        return run

    # ---- control endpoints

    def _models(self, _request: _Request) -> _Response:
        return _json_response(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

    def _stats(self, _request: _Request) -> _Response:
        return _json_response(200, self.state.snapshot())

    def _reset(self, _request: _Request) -> _Response:
        self.state.reset()
        return _json_response(200, {"status": "reset"})

    def _get_config(self, _request: _Request) -> _Response:
        return _json_response(200, self.state.config.to_dict())

    def _set_config(self, request: _Request) -> _Response:
        try:
            updates = request.json()
            if not isinstance(updates, dict):
                raise ValueError("config body must be a JSON object")
            config = self.state.update_config(updates)
        except ValueError as exc:
            return _error_response(400, str(exc), "invalid_request_error")
        return _json_response(200, config.to_dict())

    # ---- chat completions

    def _authorized(self, request: _Request) -> bool:
        expected = self.state.config.api_key
        return expected is None or request.headers.get("authorization", "") == f"Bearer {expected}"

    async def _chat_completions(self, connection: _Connection, request: _Request) -> bool:
        state = self.state
        try:
            body = request.json()
        except ValueError:
            body = None
        prompt = parse_prompt(body) if isinstance(body, dict) else None
        key = prompt.key if prompt else UNKNOWN_CHAPTER
        state.begin_call(key)
        try:
            if prompt is None:
                state.record_outcome(key, INVALID_REQUEST)
                response = _error_response(400, "request body must be a JSON object", "invalid_request_error")
            elif not self._authorized(request):
                state.record_outcome(key, AUTH_FAILED)
                response = _error_response(401, *_ERROR_FAULTS["401"][1:])
            else:
                outcome = state.next_outcome(key)
                state.record_outcome(key, outcome)
                return await self._answer(connection, request, prompt, outcome)
            return await connection.send(response, request.keep_alive) and request.keep_alive
        finally:
            state.end_call(key)

    async def _answer(self, connection: _Connection, request: _Request, prompt: ChatPrompt, outcome: str) -> bool:
        config = self.state.config
        delay = config.stall_s if outcome == "stall" else config.latency_s
        if not await connection.wait_unless_closed(delay):
            return False
        if outcome == "reset":
            connection.reset()
            return False
        if outcome in _ERROR_FAULTS:
            response = self._fault_error(prompt.key, outcome)
            return await connection.send(response, request.keep_alive) and request.keep_alive
        content = self._content(prompt, outcome)
        payload = completion_payload(self.state.next_completion_id(), prompt, content, len(request.body))
        delivered = await connection.send(_json_response(200, payload), request.keep_alive)
        if delivered:
            self.state.record_delivery(prompt.key, content.fresh)
        return delivered and request.keep_alive

    def _fault_error(self, key: str, outcome: str) -> _Response:
        status, message, error_type, code = _ERROR_FAULTS[outcome]
        response = _error_response(status, message, error_type, code)
        if outcome == "429":
            seconds = retry_after_seconds(self.state.config)
            response.headers["Retry-After"] = str(seconds)
            self.state.promise_retry_after(key, seconds)
        return response

    def _content(self, prompt: ChatPrompt, outcome: str) -> _Content:
        state = self.state
        questions = state.mint_questions(prompt, _question_count(outcome, prompt, state.config))
        variant = state.next_wrong_schema_variant() if outcome == "wrong_schema" else 0
        return _render_content(outcome, questions, state.first_served.get(prompt.key), variant)


# --------------------------------------------------------------------------- public API


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


class MockServer:
    """In-process mock LLM server running its event loop in a daemon thread.

    >>> with MockServer(MockConfig(latency_s=0)) as server:
    ...     base_url = server.base_url  # "http://127.0.0.1:PORT/v1"
    """

    def __init__(self, config: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.base_url: str | None = None
        self._service = _MockService(copy.deepcopy(config) if config else MockConfig())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Start serving and return the OpenAI base URL ``http://HOST:PORT/v1``."""
        if self._thread is not None:
            raise RuntimeError("MockServer already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run(ready, failure)), name="mockllm", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("mock LLM server did not start within 10 s")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        self.base_url = f"http://{_client_host(self.host)}:{self.port}/v1"
        return self.base_url

    async def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        try:
            self.port = await self._service.listen(self.host, self.port)
        except BaseException as exc:  # handed to the starting thread, which re-raises it
            failure.append(exc)
            ready.set()
            return
        ready.set()
        await self._stop_event.wait()
        await self._service.close()

    def stop(self) -> None:
        """Stop serving and join the server thread (idempotent)."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop_event is not None:
            with contextlib.suppress(RuntimeError):  # loop already gone
                self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the server loop, since the state is not thread-safe."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return fn(*args)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(timeout=10)

    def stats(self) -> dict[str, Any]:
        """Same document as ``GET /_stats``."""
        return self._on_loop(self._service.state.snapshot)

    def reset(self) -> None:
        """Same as ``POST /_reset``: zero stats, clear scripts, re-seed fault draws."""
        self._on_loop(self._service.state.reset)

    def configure(self, **fields: Any) -> MockConfig:
        """Same as ``POST /_config``; raises ValueError on unknown fields or bad values.

        ``script`` replaces the whole script; passing ``seed`` (even unchanged)
        restarts the fault draws from that seed.
        """
        return copy.deepcopy(self._on_loop(self._service.state.update_config, fields))

    @property
    def config(self) -> MockConfig:
        """A copy of the current config."""
        return self._on_loop(lambda: copy.deepcopy(self._service.state.config))

    def __enter__(self) -> MockServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- CLI


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mockllm", description="OpenAI-compatible mock LLM with fault injection.")
    defaults = MockConfig()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--latency-s", type=float, default=defaults.latency_s)
    parser.add_argument("--questions-per-reply", type=int, default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--fault-rate", type=float, default=defaults.fault_rate)
    parser.add_argument("--faults", default=",".join(defaults.faults), help="comma-separated fault names")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--retry-after-s", type=float, default=defaults.retry_after_s)
    parser.add_argument("--stall-s", type=float, default=defaults.stall_s)
    return parser


async def _serve_until_signalled(service: _MockService, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    bound_port = await service.listen(host, port)
    print(f"mock-llm listening on http://{host}:{bound_port}/v1", flush=True)
    await stop.wait()
    await service.close()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: serve until SIGTERM/SIGINT, then exit 0."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        config = MockConfig(
            latency_s=args.latency_s,
            questions_per_reply=args.questions_per_reply,
            api_key=args.api_key,
            fault_rate=args.fault_rate,
            faults=args.faults,
            seed=args.seed,
            retry_after_s=args.retry_after_s,
            stall_s=args.stall_s,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_serve_until_signalled(_MockService(config), args.host, args.port))
    except KeyboardInterrupt:  # a signal that beat the handler installation
        pass
    except OSError as exc:
        sys.stderr.write(f"mock-llm: cannot listen on {args.host}:{args.port}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
