"""Fault and outcome names: the closed vocabulary of what a chat call can turn into.

Transient faults are what a retry can fix (429, 5xx, a dropped connection, a stall, a body
that trickles in, a body far too large); permanent ones are not (400, 401); output faults are
200 replies whose content a client must reject. The outcome recorded for a call is ``"ok"``,
a fault name, or one of the outcomes the mock decides itself (a bad key, a bad body, a rate
limit, an exhausted quota), kept apart from the injected ``"401"``/``"400"``/``"429"`` so a
client bug or a real limit never hides among planned faults.
"""

from __future__ import annotations

OK = "ok"
TRANSIENT_FAULTS: tuple[str, ...] = ("429", "500", "503", "reset", "stall", "trickle", "oversized")
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
# Never drawn unless named in `faults`: a trickle holds a request for a minute by default and
# an oversized body is 16 MiB, which would dominate any run that draws faults at random (and
# leaving them out keeps the seeded draws of existing runs unchanged).
OPT_IN_FAULTS: tuple[str, ...] = ("trickle", "oversized")
DEFAULT_FAULTS: tuple[str, ...] = tuple(f for f in TRANSIENT_FAULTS if f not in OPT_IN_FAULTS) + OUTPUT_FAULTS

# What each fault does, for --help and the docs.
FAULT_HELP: dict[str, str] = {
    "429": "429 rate_limit_exceeded with Retry-After (retry_after_s)",
    "500": "500 server_error",
    "503": "503 server_error (overloaded)",
    "reset": "TCP reset before any reply",
    "stall": "no reply for stall_s seconds (notices the client hang up)",
    "trickle": "headers at once, then the body in trickle_pieces pieces trickle_interval_s apart",
    "oversized": "a valid 200 chat completion of oversized_bytes with huge content",
    "400": "400 invalid_request_error",
    "401": "401 invalid_api_key",
    "malformed": "content that is not JSON",
    "truncated": "JSON cut in half, finish_reason length",
    "short": "half the questions asked for",
    "fenced": "valid JSON inside a ```json fence",
    "wrong_schema": "'items' instead of 'questions', or no answer_index",
    "bad_choices": "one question with three choices",
    "bad_index": "one question with answer_index 7",
    "refusal": "a refusal sentence instead of JSON",
    "empty": "empty content",
    "duplicate": "one question repeats an earlier one word for word",
}
assert set(FAULT_HELP) == set(ALL_FAULTS)

# Outcomes the mock decides itself.
AUTH_FAILED = "auth_failed"
INVALID_REQUEST = "invalid_request"
RATE_LIMITED = "rate_limited"
REQUEST_TOO_LARGE = "request_too_large"
INSUFFICIENT_QUOTA = "insufficient_quota"

# Faults whose reply is a 200 chat completion (billed, as real providers bill them).
COMPLETION_OUTCOMES: frozenset[str] = frozenset({OK, "stall", "trickle", "oversized", *OUTPUT_FAULTS})

MODEL_ID = "mock-model"

# (status, message, OpenAI error type, OpenAI error code) per error fault.
ERROR_FAULTS: dict[str, tuple[int, str, str, str | None]] = {
    "429": (429, f"Rate limit reached for {MODEL_ID}. Please try again later.", "requests", "rate_limit_exceeded"),
    "500": (500, "The server had an error while processing your request.", "server_error", None),
    "503": (503, "The engine is currently overloaded, please try again later.", "server_error", None),
    "400": (400, "Invalid request (injected fault).", "invalid_request_error", None),
    "401": (401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
}
