"""Fault and outcome names: the closed vocabulary of what a chat call can turn into.

Transient faults are what a retry can fix (429, 5xx, a dropped connection, a stall);
permanent ones are not (400, 401); output faults are 200 replies whose content a client
must reject. The outcome recorded for a call is ``"ok"``, a fault name, or one of the
outcomes the mock decides itself (a bad key, a bad body), kept apart from the injected
``"401"``/``"400"`` so a client bug never hides among planned faults.
"""

from __future__ import annotations

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

# (status, message, OpenAI error type, OpenAI error code) per error fault.
ERROR_FAULTS: dict[str, tuple[int, str, str, str | None]] = {
    "429": (429, f"Rate limit reached for {MODEL_ID}. Please try again later.", "requests", "rate_limit_exceeded"),
    "500": (500, "The server had an error while processing your request.", "server_error", None),
    "503": (503, "The engine is currently overloaded, please try again later.", "server_error", None),
    "400": (400, "Invalid request (injected fault).", "invalid_request_error", None),
    "401": (401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
}


