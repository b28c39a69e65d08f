"""One chat completion, from request body to reply, shared by the HTTP endpoint and batches.

The steps, in the order a provider takes them: read and validate the body (400), check the
quota (429 ``insufficient_quota``), check flex capacity for a ``service_tier`` flex request (429
``resource_unavailable``; the HTTP endpoint only), admit under the rate limits (429 ``rate_limit_exceeded``;
the HTTP endpoint only, batches have their own queue), draw the outcome (script or seeded
fault), then build the completion or the error of that outcome, and log its usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from examforge.tokens import count_messages, encoding_for
from mockllm.cache import prompt_token_ids
from mockllm.faults import (
    ERROR_FAULTS,
    FLEX_UNAVAILABLE,
    FLEX_UNAVAILABLE_MESSAGE,
    INSUFFICIENT_QUOTA,
    INVALID_REQUEST,
    OK,
    RATE_LIMITED,
    REQUEST_TOO_LARGE,
    SCHEMA_PREVENTED,
)
from mockllm.http import error_payload
from mockllm.limits import INSUFFICIENT_QUOTA_MESSAGE, quota_exceeded, retry_headers
from mockllm.prompt import ChatPrompt, parse_prompt
from mockllm.questions import cited, labelled, typed
from mockllm.replies import (
    REFUSAL_CONTENT,
    Content,
    Item,
    completion_payload,
    cut_at_max_tokens,
    oversized_payload,
    render_content,
)
from mockllm.solve import solve
from mockllm.state import MockState
from mockllm.usage import UsageRecord


class ChatError(Exception):
    """Raised when a chat request is answered with an error before any model work."""

    def __init__(
        self, status: int, outcome: str, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(payload["error"]["message"])
        self.status = status
        self.outcome = outcome
        self.payload = payload
        self.headers = dict(headers or {})


def _invalid(message: str, param: str | None = None, code: str | None = None) -> ChatError:
    return ChatError(400, INVALID_REQUEST, error_payload(message, "invalid_request_error", code, param))


@dataclass(frozen=True)
class ChatCall:
    """A validated chat request."""

    prompt: ChatPrompt
    max_tokens: int | None
    prompt_tokens: int
    request_id: str
    batch_id: str | None = None
    custom_id: str | None = None
    # The prompt's tokens, for the prompt cache (empty when it is off).
    prompt_ids: tuple[int, ...] = ()
    # The request's response_format type ("text", "json_object", "json_schema") and, for
    # json_schema, the schema the reply must fit (None when the request sent none).
    response_format: str | None = None
    schema: dict[str, Any] | None = None
    # The tier that serves the request, as the reply reports it: default, flex or priority.
    service_tier: str = "default"

    @property
    def constrained(self) -> bool:
        """Whether the reply is decoded under a JSON schema (it parses and fits the schema)."""
        return self.response_format == "json_schema"

    @property
    def key(self) -> str:
        return self.prompt.key

    @property
    def requester(self) -> str:
        return self.prompt.requester

    @property
    def model(self) -> str:
        return self.prompt.model

    def admission_tokens(self) -> int:
        """What TPM charges at admission: the prompt plus the most the completion may take."""
        return self.prompt_tokens + (self.max_tokens or 0)


@dataclass
class Completion:
    """A 200 reply: its body, and what it carries."""

    payload: dict[str, Any]
    content: Content
    completion_tokens: int
    finish_reason: str
    cached_tokens: int = 0


def _max_tokens(body: dict[str, Any]) -> int | None:
    """``max_completion_tokens`` or ``max_tokens`` (the smaller if both), validated like OpenAI."""
    found = []
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise _invalid(f"Invalid type for '{name}': expected an integer, but got {type(value).__name__} "
                           "instead.", name, "invalid_type")
        if value < 1:
            raise _invalid(f"Invalid '{name}': integer below minimum value. Expected a value >= 1, but got "
                           f"{value} instead.", name, "integer_below_min_value")
        found.append(value)
    return min(found) if found else None


_SCHEMA_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _strict_problem(schema: Any, where: tuple[str, ...] = ()) -> str | None:
    """What OpenAI's strict mode refuses in ``schema``, or None: every object must close with
    ``additionalProperties: false`` and list each of its properties in ``required``."""
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            problem = _strict_problem(sub, where)
            if problem:
                return problem
        return None
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object" or "properties" in schema:
        context = f"In context={where!r}, "
        if schema.get("additionalProperties") is not False:
            return context + "'additionalProperties' is required to be supplied and to be false."
        properties = schema.get("properties") or {}
        required = schema.get("required")
        missing = [name for name in properties if not isinstance(required, list) or name not in required]
        if missing:
            return (context + "'required' is required to be supplied and to be an array including every key "
                    f"in properties. Missing '{missing[0]}'.")
        for name, sub in properties.items():
            problem = _strict_problem(sub, (*where, "properties", name))
            if problem:
                return problem
    for keyword in ("items", "anyOf", "$defs", "definitions"):
        if keyword in schema:
            sub = schema[keyword]
            subs = sub.values() if keyword in ("$defs", "definitions") and isinstance(sub, dict) else [sub]
            for part in subs:
                problem = _strict_problem(part, (*where, keyword))
                if problem:
                    return problem
    return None


def _response_format(body: dict[str, Any], refuse_json_schema: bool) -> tuple[str | None, dict[str, Any] | None]:
    """The request's response_format type and schema, validated as OpenAI does (400 naming
    ``response_format``); a server without structured outputs refuses json_schema."""
    value = body.get("response_format")
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise _invalid("Invalid value for 'response_format.type': expected one of 'text', 'json_object' or "
                       "'json_schema'.", "response_format", "invalid_value")
    if kind != "json_schema":
        return kind, None
    if refuse_json_schema:
        raise _invalid("Invalid parameter: 'response_format' of type 'json_schema' is not supported with this "
                       "model.", "response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not _SCHEMA_NAME_RE.match(spec["name"]):
        raise _invalid("Missing or invalid 'response_format.json_schema.name': a-z, A-Z, 0-9, underscores and "
                       "dashes, at most 64.", "response_format.json_schema.name")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise _invalid("Invalid 'response_format.json_schema.schema': expected an object.", "response_format")
    if spec.get("strict") is True:
        problem = _strict_problem(schema)
        if problem:
            raise _invalid(f"Invalid schema for response_format '{spec['name']}': {problem}", "response_format",
                           "invalid_json_schema")
    return kind, schema


# The values OpenAI accepts for ``service_tier``. "scale" is the Scale Tier of projects that bought
# its units; the mock's project has none, so it is served at default, as "auto" is.
SERVICE_TIERS: tuple[str, ...] = ("auto", "default", "flex", "scale", "priority")


def _service_tier(body: dict[str, Any]) -> str:
    """The tier that serves the request, from its ``service_tier`` (absent or null: auto),
    validated as OpenAI validates it (400 naming ``service_tier``)."""
    value = body.get("service_tier")
    if value is None:
        return "default"
    listed = ", ".join(f"'{tier}'" for tier in SERVICE_TIERS[:-1]) + f", and '{SERVICE_TIERS[-1]}'"
    if not isinstance(value, str):
        raise _invalid(f"Invalid type for 'service_tier': expected one of {listed}, but got "
                       f"{type(value).__name__} instead.", "service_tier", "invalid_type")
    if value not in SERVICE_TIERS:
        raise _invalid(f"Invalid value: '{value}'. Supported values are: {listed}.", "service_tier",
                       "invalid_value")
    return value if value in ("flex", "priority") else "default"


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' is a required property and must be a non-empty array", "messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise _invalid("Invalid 'messages': each message must be an object with a 'role'", "messages")
    return messages


class ChatEngine:
    """The chat logic over one ``MockState``."""

    def __init__(self, state: MockState) -> None:
        self.state = state
        self._tokenizers_ready: set[str] = set()
        self._request_seq = 0

    async def warm_up(self, model: str) -> None:
        """Load ``model``'s tokenizer off the event loop: the first use may read (or try to
        download) its encoding, and the other requests must keep flowing meanwhile."""
        if model not in self._tokenizers_ready:
            await asyncio.to_thread(encoding_for, model)
            self._tokenizers_ready.add(model)

    def next_request_id(self) -> str:
        self._request_seq += 1
        return f"req_mock_{self._request_seq:08d}"

    async def read(self, body: Any, batch_id: str | None = None, custom_id: str | None = None) -> ChatCall:
        """Validate a request body and count its prompt tokens; raises ChatError (400)."""
        if not isinstance(body, dict):
            raise _invalid("request body must be a JSON object")
        messages = _messages(body)
        max_tokens = _max_tokens(body)
        response_format, schema = _response_format(body, self.state.config.refuse_json_schema)
        service_tier = _service_tier(body)
        prompt = parse_prompt(body)
        await self.warm_up(prompt.model)
        return ChatCall(
            prompt=prompt,
            max_tokens=max_tokens,
            prompt_tokens=round(count_messages(messages, prompt.model) * self.state.config.usage_factor),
            request_id=self.next_request_id(),
            batch_id=batch_id,
            custom_id=custom_id,
            prompt_ids=(tuple(prompt_token_ids(messages, prompt.model))
                        if self.state.config.prompt_cache else ()),
            response_format=response_format,
            schema=schema,
            service_tier=service_tier,
        )

    def decode(self, call: ChatCall, outcome: str) -> str:
        """The outcome as served: under a JSON schema, a constrained decoder cannot emit broken
        JSON or output that does not fit the schema, so those faults are served as ``ok``."""
        if call.constrained and outcome in SCHEMA_PREVENTED:
            self.state.schema_prevented += 1
            return OK
        return outcome

    def check_quota(self) -> None:
        """Raise ChatError (429 insufficient_quota) when the quota is used up."""
        config = self.state.config
        if quota_exceeded(config.quota_exhausted, config.quota_tokens, self.state.usage.billed_tokens):
            payload = error_payload(INSUFFICIENT_QUOTA_MESSAGE, "insufficient_quota", "insufficient_quota")
            raise ChatError(429, INSUFFICIENT_QUOTA, payload)

    def check_flex_capacity(self, call: ChatCall) -> None:
        """Refuse a flex request for lack of capacity (``flex_unavailable_rate`` of them) with
        the 429 OpenAI's flex guide describes: not billed, and no rate limit is charged."""
        rate = self.state.config.flex_unavailable_rate
        if call.service_tier == "flex" and rate > 0 and self.state.flex_rng.random() < rate:
            payload = error_payload(FLEX_UNAVAILABLE_MESSAGE, "rate_limit_error", FLEX_UNAVAILABLE)
            raise ChatError(429, FLEX_UNAVAILABLE, payload)

    def admit(self, call: ChatCall) -> None:
        """Charge the rate limits, or raise ChatError (429 rate_limit_exceeded) charging nothing."""
        state = self.state
        refusal = state.limiter.admit(call.admission_tokens())
        if refusal is None:
            state.record_admission()
            return
        state.record_rate_limited(refusal.limit_type)
        payload = error_payload(refusal.message(call.model), refusal.limit_type, "rate_limit_exceeded")
        if refusal.too_large:  # waiting cannot help: no Retry-After
            raise ChatError(429, REQUEST_TOO_LARGE, payload)
        mode = state.config.ratelimit_headers
        if mode != "azure":
            state.promise_retry_after(call.requester, refusal.wait_s)
        raise ChatError(429, RATE_LIMITED, payload, retry_headers(refusal.wait_s, mode))

    def fault_error(self, call: ChatCall, outcome: str) -> ChatError:
        """The error reply of an injected error fault (429, 500, 503, 400, 401)."""
        status, message, error_type, code = ERROR_FAULTS[outcome]
        headers: dict[str, str] = {}
        if outcome == "429":
            seconds = max(1, math.ceil(self.state.config.retry_after_s))
            headers["Retry-After"] = str(seconds)
            self.state.promise_retry_after(call.requester, seconds)
        return ChatError(status, outcome, error_payload(message, error_type, code), headers)

    def complete(self, call: ChatCall, outcome: str) -> Completion:
        """Generate the 200 reply of ``outcome`` (ok, an output fault, stall, trickle, oversized)."""
        state, config = self.state, self.state.config
        completion_id = state.next_completion_id()
        if outcome == "oversized":
            # A broken upstream or gateway, not a model: max_tokens does not hold it back.
            payload, tokens = oversized_payload(
                completion_id, call.model, call.prompt_tokens, config.oversized_bytes, config.omit_usage,
                call.service_tier)
            return Completion(payload, Content("", "length"), tokens, "length")
        if call.prompt.solve_text is not None:
            return self._solve(call, outcome, completion_id)
        items = state.mint_items(call.prompt, question_count(outcome, call.prompt.count, config.questions_per_reply))
        items = cited(labelled(typed(items, call.prompt, config.seed, config.wrong_key_rates),
                               call.prompt), call.prompt)
        if call.schema is not None:
            items = [_conform(item, call.schema) for item in items]
        variant = state.next_wrong_schema_variant() if outcome == "wrong_schema" else 0
        content = render_content(outcome, items, state.first_served.get(call.key), variant)
        content, tokens, cut = cut_at_max_tokens(content, call.model, call.max_tokens)
        if cut:
            state.cut_at_max_tokens += 1
        tokens = round(tokens * config.usage_factor)  # reported and billed beyond max_tokens
        if call.max_tokens is None and call.batch_id is None:
            # Admission charged TPM the prompt only; the completion is charged as it is generated.
            state.limiter.debit_tokens(tokens)
        payload = completion_payload(
            completion_id, call.model, content.text, content.finish_reason, call.prompt_tokens, tokens,
            config.omit_usage, call.service_tier)
        message = payload["choices"][0]["message"]
        if outcome == "refusal" and call.constrained:
            # Under a schema OpenAI sends a refusal apart, with no content.
            message["content"], message["refusal"] = None, REFUSAL_CONTENT
        elif outcome == "list_content":
            message["content"] = as_parts(content.text)
        cached = self._cached_tokens(call, payload)
        return Completion(payload, content, tokens, content.finish_reason, cached)

    def _solve(self, call: ChatCall, outcome: str, completion_id: str) -> Completion:
        """A blind solve's reply: truthful answers at ``solver_error_rate`` (mockllm.solve);
        the output faults that leave nothing readable (malformed, empty, refusal, truncated)
        are served as such, the others as ok."""
        state, config = self.state, self.state.config
        solved = solve(call.prompt.solve_text or "", config.seed, config.solver_error_rate,
                       config.solver_error_rates)
        text, finish = solved.content, "stop"
        if outcome == "malformed" or outcome == "refusal":
            text = "I cannot help with that." if outcome == "refusal" else "answers: B, A"
        elif outcome == "empty":
            text = ""
        elif outcome == "truncated":
            text, finish = text[: len(text) // 2], "length"
        else:
            state.solves += 1
            state.solved_questions += solved.answers
            state.solver_errors += solved.errors
            state.solved_with_passage += solved.passages
        content, tokens, cut = cut_at_max_tokens(Content(text, finish), call.model, call.max_tokens)
        tokens = round(tokens * config.usage_factor)
        payload = completion_payload(completion_id, call.model, content.text, content.finish_reason,
                                     call.prompt_tokens, tokens, config.omit_usage, call.service_tier)
        cached = self._cached_tokens(call, payload)
        return Completion(payload, content, tokens, content.finish_reason, cached)

    def _cached_tokens(self, call: ChatCall, payload: dict[str, Any]) -> int:
        """Look the prompt up in the prompt cache (and store its prefixes); report the cached
        part in the usage as OpenAI does. Billed either way, even without a usage object."""
        if not call.prompt_ids:
            return 0
        cached = self.state.prompt_cache.lookup_and_store(call.model, list(call.prompt_ids),
                                                          call.prompt_tokens)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        return cached

    def log(
        self,
        key: str,
        model: str,
        status: int | None,
        outcome: str,
        *,
        call: ChatCall | None = None,
        completion: Completion | None = None,
        delivered: bool,
        batch_id: str | None = None,
        custom_id: str | None = None,
    ) -> None:
        """Record one request in the usage log; a completion is billed whether delivered or not."""
        self.state.record_usage(UsageRecord(
            time=time.time(),
            chapter=key,
            model=model,
            status=status,
            outcome=outcome,
            prompt_tokens=call.prompt_tokens if call else 0,
            completion_tokens=completion.completion_tokens if completion else 0,
            billed=completion is not None,
            delivered=delivered,
            request_id=call.request_id if call else self.next_request_id(),
            finish_reason=completion.finish_reason if completion else None,
            max_tokens=call.max_tokens if call else None,
            batch_id=batch_id if batch_id is not None else (call.batch_id if call else None),
            custom_id=custom_id if custom_id is not None else (call.custom_id if call else None),
            cached_tokens=completion.cached_tokens if completion else 0,
            service_tier=call.service_tier if call else None,
        ))


def as_parts(text: str) -> list[dict[str, str]]:
    """Content as a list of text parts (as some OpenAI-compatible servers send it), split in
    the middle: a client must join the parts to read the reply."""
    middle = len(text) // 2
    return [{"type": "text", "text": text[:middle]}, {"type": "text", "text": text[middle:]}]


def _conform(item: Item, schema: dict[str, Any]) -> Item:
    """A question as a decoder under ``schema`` writes it: each property the question items
    require and the question lacks (a level the prompt did not ask for) is written as null."""
    try:
        items = schema["properties"]["questions"]["items"]
        ref = items.get("$ref", "")
        if ref.startswith("#/$defs/"):  # the official SDK's schemas refer to their models
            items = schema["$defs"][ref.removeprefix("#/$defs/")]
        if "anyOf" in items:  # the union of item types: the branch of the item's type
            kind = item.question.get("type", "mcq")
            items = next(b for b in items["anyOf"]
                         if kind in b["properties"]["type"].get("enum", ()))
        required = items["required"]
    except (KeyError, TypeError, AttributeError, StopIteration):
        return item
    question = dict(item.question)
    for name in required if isinstance(required, list) else ():
        question.setdefault(str(name), None)
    return dataclasses.replace(item, question=question)


def question_count(outcome: str, asked: int, per_reply: int | None) -> int:
    count = asked if per_reply is None else min(asked, per_reply)
    if outcome == "short":
        # Halving the capped count keeps "short" strictly shorter than a normal reply.
        return max(0, count // 2)
    return count
