"""OpenAI-compatible mock model server with fault injection: examforge's stand-in provider.

Used by tests, demos and benchmarks in place of a real LLM provider, and built to behave like
one. ``POST /v1/chat/completions`` answers multiple-choice questions built from the prompt's
``Label: value`` lines (read with ``examforge.prompt.read_fields``): lexically distinct
questions per chapter, with ``reword_rate`` of them paraphrases of questions already served
and ``answer_position`` to pin the answer (``0``: always first, the worst bias a model can
have); a prompt with ``Difficulty`` and ``Bloom levels`` lines gets each question labelled
with a ``difficulty`` and a ``bloom`` as those lines ask, as a model that follows its prompt
would (``mockllm.questions.labelled``). Usage is counted with tiktoken
(``examforge.tokens``); ``max_tokens`` cuts a completion with ``finish_reason: "length"``.
Rate limits (``rpm``, ``tpm``) are token buckets enforced at admission with OpenAI's 429
bodies and ``x-ratelimit-*`` headers; ``quota_exhausted``/``quota_tokens`` answer OpenAI's
``insufficient_quota``. The Files and Batch APIs (``/v1/files``, ``/v1/batches``) run batches
in the background through the same chat logic.

Faults, injected at random (``fault_rate`` over ``faults``, seeded, hence reproducible) or
from a per-chapter ``script``: transport faults (429/5xx, TCP resets, stalls, a body trickled
out slowly, an oversized body) and output faults (malformed, truncated, wrong schema, ...);
``mock-llm --help`` lists them all.

Control endpoints: ``GET /v1/models`` (health check), ``GET /_stats``, ``GET /_usage`` (every
chat request with its tokens and whether it was billed or delivered), ``POST /_reset``,
``POST /_config`` (``GET /_config`` shows the config). Every path also works with or without
the ``/v1`` prefix.

Outcome names recorded in the stats are ``"ok"`` for normal replies, the fault name for
injected faults, and outcomes the mock decides itself: ``"auth_failed"`` (the API key does not
match), ``"invalid_request"`` (the body is not a valid chat request), ``"rate_limited"`` and
``"request_too_large"`` (the rate limits), ``"insufficient_quota"``. They are kept apart from
the injected ``"401"``/``"400"``/``"429"`` so a client bug or a real limit never hides among
planned faults.

Why the HTTP layer is hand-written on ``asyncio.start_server`` instead of an ASGI framework:
the faults must act on the socket itself (a TCP RST through ``SO_LINGER`` 0 +
``transport.abort()``, a stall that notices the client hang up, headers sent at once and the
body trickled after them), which ASGI servers hide behind their own connection handling; it
also keeps the mock free of any extra dependency.

Modules, one concept each: ``faults`` (the outcome vocabulary), ``config``, ``prompt``
(reading requests), ``questions`` (texts and paraphrases), ``replies`` (content and
envelopes), ``limits`` (rate limits and quota), ``usage`` (the usage log), ``state`` (stats
and history), ``chat`` (one completion, end to end), ``http`` (the HTTP/1.1 layer),
``files`` and ``batches``, ``service`` (routes), ``server`` (the in-process ``MockServer``),
``cli``.

Run it standalone with ``python -m mockllm --port 8089`` (or ``python -m producer mock-llm``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from mockllm.replies import MALFORMED_CONTENT, REFUSAL_CONTENT
    from mockllm.server import MockServer

# Loaded on first use (PEP 562): `python -m mockllm --help` imports this package, and the
# server pulls in asyncio, tiktoken and the syllabus models, which the parser never needs.
_LAZY = {"MockServer": "mockllm.server", "MALFORMED_CONTENT": "mockllm.replies",
         "REFUSAL_CONTENT": "mockllm.replies"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mockllm' has no attribute {name!r}")


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
