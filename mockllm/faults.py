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
TRANSIENT_FAULTS: tuple[str, ...] = ("429", "500", "503", "reset", "stall", "trickle", "oversized", "cut")
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
# Not a fault: a valid reply in another shape some servers send (a client must read it).
SHAPE_OUTCOMES: tuple[str, ...] = ("list_content",)
ALL_FAULTS: tuple[str, ...] = TRANSIENT_FAULTS + PERMANENT_FAULTS + OUTPUT_FAULTS + SHAPE_OUTCOMES
# Never drawn unless named in `faults`: a trickle holds a request for a minute by default and
# an oversized body is 16 MiB, which would dominate any run that draws faults at random (and
# leaving them out keeps the seeded draws of existing runs unchanged).
# The cut body and list content are opt-in for the same reason (issue 16 added them).
OPT_IN_FAULTS: tuple[str, ...] = ("trickle", "oversized", "cut", "list_content")
DEFAULT_FAULTS: tuple[str, ...] = tuple(f for f in TRANSIENT_FAULTS if f not in OPT_IN_FAULTS) + OUTPUT_FAULTS
# What a constrained decoder makes impossible: a request whose response_format is a JSON schema
# never gets these (they are served as "ok"), as OpenAI, vLLM or Ollama guarantee under a
# schema. Everything a schema cannot prevent still happens: errors, stalls, cut bodies, a
# reply cut at max_tokens ("truncated"), short replies, repeats, refusals (sent in
# message.refusal, content null, as OpenAI does under a schema).
SCHEMA_PREVENTED: frozenset[str] = frozenset(
    {"malformed", "fenced", "wrong_schema", "bad_choices", "bad_index", "empty"})

# What each fault does, for --help and the docs.
FAULT_HELP: dict[str, str] = {
    "429": "429 rate_limit_exceeded with Retry-After (retry_after_s)",
    "500": "500 server_error",
    "503": "503 server_error (overloaded)",
    "reset": "TCP reset before any reply",
    "stall": "no reply for stall_s seconds (notices the client hang up)",
    "trickle": "headers at once, then the body in trickle_pieces pieces trickle_interval_s apart",
    "oversized": "a valid 200 chat completion of oversized_bytes with huge content",
    "cut": "a 200 whose body stops half way: headers, half the body, then the connection closes (billed)",
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
    "list_content": "a valid reply whose content is a list of text parts, as some servers send it",
}
assert set(FAULT_HELP) == set(ALL_FAULTS)

# Outcomes the mock decides itself.
AUTH_FAILED = "auth_failed"
INVALID_REQUEST = "invalid_request"
RATE_LIMITED = "rate_limited"
REQUEST_TOO_LARGE = "request_too_large"
INSUFFICIENT_QUOTA = "insufficient_quota"
# A flex request refused for lack of capacity (``flex_unavailable_rate``): OpenAI's flex guide
# calls it "429 Resource Unavailable" and does not charge for it.
FLEX_UNAVAILABLE = "resource_unavailable"
FLEX_UNAVAILABLE_MESSAGE = ("Resource unavailable: flex capacity is exhausted right now; retry later, or use "
                            "the default service tier.")

# Faults whose reply is a 200 chat completion (billed, as real providers bill them).
COMPLETION_OUTCOMES: frozenset[str] = frozenset(
    {OK, "stall", "trickle", "oversized", "cut", *OUTPUT_FAULTS, *SHAPE_OUTCOMES})

MODEL_ID = "mock-model"

# (status, message, OpenAI error type, OpenAI error code) per error fault.
ERROR_FAULTS: dict[str, tuple[int, str, str, str | None]] = {
    "429": (429, f"Rate limit reached for {MODEL_ID}. Please try again later.", "requests", "rate_limit_exceeded"),
    "500": (500, "The server had an error while processing your request.", "server_error", None),
    "503": (503, "The engine is currently overloaded, please try again later.", "server_error", None),
    "400": (400, "Invalid request (injected fault).", "invalid_request_error", None),
    "401": (401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
}
