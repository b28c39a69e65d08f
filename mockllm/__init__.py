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

Run it standalone with ``python -m mockllm --port 8089``.
"""

from mockllm.cli import main
from mockllm.config import MockConfig
from mockllm.faults import (
    ALL_FAULTS,
    AUTH_FAILED,
    DEFAULT_FAULTS,
    INVALID_REQUEST,
    MODEL_ID,
    OK,
    OUTPUT_FAULTS,
    PERMANENT_FAULTS,
    TRANSIENT_FAULTS,
)
from mockllm.replies import MALFORMED_CONTENT, REFUSAL_CONTENT
from mockllm.server import MockServer

__all__ = [
    "ALL_FAULTS",
    "AUTH_FAILED",
    "DEFAULT_FAULTS",
    "INVALID_REQUEST",
    "MALFORMED_CONTENT",
    "MODEL_ID",
    "OK",
    "OUTPUT_FAULTS",
    "PERMANENT_FAULTS",
    "REFUSAL_CONTENT",
    "TRANSIENT_FAULTS",
    "MockConfig",
    "MockServer",
    "main",
]
