"""The mock's runtime behaviour: one validated dataclass, changeable at runtime via ``/_config``.

Every field carries its help line in its metadata; the CLI builds its options from them, so
``mock-llm --help`` lists every field.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mockllm.faults import ALL_FAULTS, DEFAULT_FAULTS, OK

RATELIMIT_HEADER_MODES: tuple[str, ...] = ("openai", "absent", "azure")
MIB = 1024 * 1024


def _help(text: str, unset: str | None = None) -> dict[str, str]:
    """Field metadata for the CLI: its help line, and what an unset (None) default means."""
    return {"help": text, **({"unset": unset} if unset else {})}


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


def _fraction(value: Any, name: str) -> float:
    number = _non_negative_float(value, name)
    if number > 1:
        raise ValueError(f"{name} must be between 0 and 1")
    return number


def _rates(value: Any, name: str) -> dict[str, float]:
    """{item type: share} (examforge.item_types), each share 0..1."""
    from examforge.item_types import ITEM_TYPES

    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object of item type -> share")
    for kind in value:
        if kind not in ITEM_TYPES:
            raise ValueError(f"{name}: {kind!r} is not an item type ({', '.join(ITEM_TYPES)})")
    return {kind: _fraction(share, f"{name}.{kind}") for kind, share in value.items()}


def _int_at_least(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{name} must be an integer >= {minimum}")
    number = int(value)
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}")
    return number


def _optional_int(value: Any, name: str, minimum: int) -> int | None:
    return None if value is None else _int_at_least(value, name, minimum)


def _optional_float(value: Any, name: str) -> float | None:
    return None if value is None else _non_negative_float(value, name)


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false")


@dataclass
class MockConfig:
    """Runtime behaviour of the mock; every field can be changed via ``/_config``.

    ``script`` maps a chapter key (``"<slug>/<chapter_id>"``) to the outcomes
    (fault names or ``"ok"``) of that chapter's next calls, consumed in order;
    once a chapter's list is used up, normal behaviour (including random
    faults) resumes.
    """

    latency_s: float = field(default=0.05, metadata=_help("seconds each reply takes"))
    latency_spread: float = field(
        default=0.0, metadata=_help("each reply takes latency_s times a uniform draw from "
                                    "1 - spread to 1 + spread (0..1; the mean stays latency_s), "
                                    "as a real provider's replies vary"))
    questions_per_reply: int | None = field(
        default=None, metadata=_help("at most this many questions per reply", unset="as many as asked"))
    api_key: str | None = field(
        default=None, metadata=_help("require 'Authorization: Bearer KEY'", unset="any key or none"))
    fault_rate: float = field(default=0.0, metadata=_help("share of calls (0..1) that get a random fault"))
    faults: list[str] = field(
        default_factory=lambda: list(DEFAULT_FAULTS), metadata=_help("faults drawn at random (see --faults)"))
    seed: int = field(default=0, metadata=_help("seed of the fault draws and rewordings"))
    retry_after_s: float = field(
        default=1.0, metadata=_help("Retry-After of the injected 429 fault (rounded up, at least 1)"))
    stall_s: float = field(default=30.0, metadata=_help("seconds the stall fault holds the reply"))
    script: dict[str, list[str]] = field(
        default_factory=dict, metadata=_help("JSON object: chapter key -> outcomes of its next calls, in order"))
    # --- usage
    omit_usage: bool = field(default=False, metadata=_help("send replies without a usage object, as some gateways do"))
    prompt_cache: bool = field(
        default=True,
        metadata=_help("cache prompt prefixes as OpenAI does (1024 tokens or more, 128-token steps, per "
                       "model) and report usage.prompt_tokens_details.cached_tokens"))
    # --- response_format
    refuse_json_schema: bool = field(
        default=False,
        metadata=_help("answer a request whose response_format is json_schema with a 400 naming "
                       "response_format, as servers without structured outputs do"))
    usage_factor: float = field(
        default=1.0,
        metadata=_help("multiply the tokens each reply reports and bills (prompt and completion), as a "
                       "provider whose tokenizer counts higher, or that ignores max_tokens"))
    # --- rate limits and quota
    rpm: int | None = field(default=None, metadata=_help("requests per minute (a token bucket)", unset="unlimited"))
    tpm: int | None = field(
        default=None,
        metadata=_help("tokens per minute: prompt + max_tokens charged at admission", unset="unlimited"))
    burst_fraction: float = field(
        default=0.1,
        metadata=_help("bucket size as a share of the per-minute limit (never less than one request)"))
    ratelimit_headers: str = field(
        default="openai",
        metadata=_help("x-ratelimit-* headers: openai, absent (none, no retry-after-ms) or azure (-1/0, "
                       "no Retry-After)"))
    quota_exhausted: bool = field(
        default=False, metadata=_help("answer every chat call with 429 insufficient_quota"))
    quota_tokens: int | None = field(
        default=None, metadata=_help("the quota runs out after this many billed tokens", unset="unlimited"))
    # --- fault parameters
    trickle_pieces: int = field(default=60, metadata=_help("pieces the trickle fault sends the body in"))
    trickle_interval_s: float = field(default=1.0, metadata=_help("seconds between two trickled pieces"))
    oversized_bytes: int = field(default=16 * MIB, metadata=_help("body size of the oversized fault, in bytes"))
    # --- question content
    reword_rate: float = field(
        default=0.0,
        metadata=_help("share (0..1) of a reply's questions the model means to write again: paraphrases "
                       "of questions already served to the chapter, its first ones most often"))
    avoid_compliance: float = field(
        default=0.9,
        metadata=_help("chance (0..1) that a paraphrase the model means to write of a question the "
                       "prompt's 'do not repeat' list shows becomes a new question instead"))
    answer_position: int | None = field(
        default=None, metadata=_help("put the correct choice always at this index 0..3", unset="spread"))
    wrong_key_rate: float = field(
        default=0.0,
        metadata=_help("share (0..1) of generated questions whose answer_index points at a wrong "
                       "choice (drawn per question; the question and its choices are unchanged)"))
    wrong_key_rates: dict[str, float] = field(
        default_factory=dict,
        metadata=_help("JSON object: item type (mcq, multi, truefalse, short, numeric) -> its "
                       "own wrong_key_rate, for the items of that type"))
    # --- blind solves (VERIFY): a request whose prompt starts with examforge's solve header
    solver_error_rate: float = field(
        default=0.0,
        metadata=_help("share (0..1) of blind-solve answers that pick a wrong choice; the others "
                       "pick the true answer, known from the choices the mock wrote, never from "
                       "a key"))
    solver_error_rates: dict[str, float] = field(
        default_factory=dict,
        metadata=_help("JSON object: item type -> its own solver_error_rate, for the items of "
                       "that type"))
    # --- service tiers (service_tier on chat requests)
    flex_latency_factor: float = field(
        default=3.0, metadata=_help("service_tier flex requests take this many times latency_s"))
    flex_unavailable_rate: float = field(
        default=0.0,
        metadata=_help("share (0..1) of service_tier flex chat requests refused with OpenAI's 429 "
                       "resource_unavailable (not billed, no rate limit charged)"))
    # --- batches
    batch_validation_s: float = field(default=0.1, metadata=_help("seconds a batch spends in 'validating'"))
    batch_request_s: float = field(default=0.01, metadata=_help("seconds each request of a batch takes"))
    batch_finalizing_s: float = field(default=0.1, metadata=_help("seconds a batch spends in 'finalizing'"))
    batch_expire_after_s: float | None = field(
        default=None,
        metadata=_help("a batch not finished this many seconds after creation expires (OpenAI's window is "
                       "24h)", unset="never"))
    batch_enqueued_token_limit: int | None = field(
        default=None,
        metadata=_help("a batch whose requests add up to more tokens (prompt + max_tokens) fails "
                       "validation with token_limit_exceeded", unset="unlimited"))
    # --- batch faults: what recovery after a crash must survive
    batch_create_delay_s: float = field(
        default=0.0,
        metadata=_help("seconds POST /v1/batches holds its reply after the batch exists (listed and "
                       "running): a client killed meanwhile never hears of it"))
    batch_create_lost: int = field(
        default=0,
        metadata=_help("the next N successful POST /v1/batches create the batch, then close the connection "
                       "without any reply (each consumes one; /_config shows how many are left)"))
    batch_upload_fail: int = field(
        default=0,
        metadata=_help("the next N POST /v1/files with purpose batch fail with a 500 server_error and store "
                       "nothing (each consumes one)"))
    batch_output_lost: int = field(
        default=0,
        metadata=_help("the next N batches that finish lose their output and error files as they are "
                       "written (the provider's retention purged them): the batch names the files, and "
                       "GET /v1/files/{id}/content answers 404 (each consumes one)"))
    batch_usage_dropped: int = field(
        default=0,
        metadata=_help("the next N successful batch output lines carry no usage in their body (billed all "
                       "the same; each consumes one)"))

    def __post_init__(self) -> None:
        # Normalising here means both the constructor and dataclasses.replace
        # (used for runtime updates) reject bad values before they take effect.
        self.latency_s = _non_negative_float(self.latency_s, "latency_s")
        self.latency_spread = _fraction(self.latency_spread, "latency_spread")
        self.retry_after_s = _non_negative_float(self.retry_after_s, "retry_after_s")
        self.stall_s = _non_negative_float(self.stall_s, "stall_s")
        self.fault_rate = _fraction(self.fault_rate, "fault_rate")
        self.questions_per_reply = _optional_int(self.questions_per_reply, "questions_per_reply", 0)
        self.api_key = str(self.api_key) if self.api_key else None
        self.seed = int(self.seed)
        self.faults = _as_name_list(self.faults, ALL_FAULTS, "fault")
        if not isinstance(self.script, dict):
            raise ValueError("script must map chapter keys to lists of outcomes")
        self.script = {
            str(key): _as_name_list(outcomes, (*ALL_FAULTS, OK), "script outcome")
            for key, outcomes in self.script.items()
        }
        self.omit_usage = _bool(self.omit_usage, "omit_usage")
        self.prompt_cache = _bool(self.prompt_cache, "prompt_cache")
        self.refuse_json_schema = _bool(self.refuse_json_schema, "refuse_json_schema")
        self.usage_factor = _non_negative_float(self.usage_factor, "usage_factor")
        self.rpm = _optional_int(self.rpm, "rpm", 1)
        self.tpm = _optional_int(self.tpm, "tpm", 1)
        self.burst_fraction = _fraction(self.burst_fraction, "burst_fraction")
        if self.ratelimit_headers not in RATELIMIT_HEADER_MODES:
            raise ValueError(f"ratelimit_headers must be one of {', '.join(RATELIMIT_HEADER_MODES)}")
        self.quota_exhausted = _bool(self.quota_exhausted, "quota_exhausted")
        self.quota_tokens = _optional_int(self.quota_tokens, "quota_tokens", 0)
        self.trickle_pieces = _int_at_least(self.trickle_pieces, "trickle_pieces", 1)
        self.trickle_interval_s = _non_negative_float(self.trickle_interval_s, "trickle_interval_s")
        self.oversized_bytes = _int_at_least(self.oversized_bytes, "oversized_bytes", 1024)
        self.reword_rate = _fraction(self.reword_rate, "reword_rate")
        self.avoid_compliance = _fraction(self.avoid_compliance, "avoid_compliance")
        self.answer_position = _optional_int(self.answer_position, "answer_position", 0)
        if self.answer_position is not None and self.answer_position > 3:
            raise ValueError("answer_position must be 0..3 or null")
        self.wrong_key_rate = _fraction(self.wrong_key_rate, "wrong_key_rate")
        self.solver_error_rate = _fraction(self.solver_error_rate, "solver_error_rate")
        self.wrong_key_rates = _rates(self.wrong_key_rates, "wrong_key_rates")
        self.solver_error_rates = _rates(self.solver_error_rates, "solver_error_rates")
        self.flex_latency_factor = _non_negative_float(self.flex_latency_factor, "flex_latency_factor")
        self.flex_unavailable_rate = _fraction(self.flex_unavailable_rate, "flex_unavailable_rate")
        self.batch_validation_s = _non_negative_float(self.batch_validation_s, "batch_validation_s")
        self.batch_request_s = _non_negative_float(self.batch_request_s, "batch_request_s")
        self.batch_finalizing_s = _non_negative_float(self.batch_finalizing_s, "batch_finalizing_s")
        self.batch_expire_after_s = _optional_float(self.batch_expire_after_s, "batch_expire_after_s")
        self.batch_enqueued_token_limit = _optional_int(
            self.batch_enqueued_token_limit, "batch_enqueued_token_limit", 0)
        self.batch_create_delay_s = _non_negative_float(self.batch_create_delay_s, "batch_create_delay_s")
        self.batch_create_lost = _int_at_least(self.batch_create_lost, "batch_create_lost", 0)
        self.batch_upload_fail = _int_at_least(self.batch_upload_fail, "batch_upload_fail", 0)
        self.batch_output_lost = _int_at_least(self.batch_output_lost, "batch_output_lost", 0)
        self.batch_usage_dropped = _int_at_least(self.batch_usage_dropped, "batch_usage_dropped", 0)

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
