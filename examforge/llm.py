"""The provider client: one OpenAI-compatible chat-completions call, no retries of its own.

Every httpx and HTTP failure is translated into the error vocabulary of `examforge.errors` here
and nowhere else (the table of HTTP errors is `examforge.classify`). Retries are decided by the
caller, so no SDK-level retry multiplies paid attempts. The transport is injectable: unit
tests pass `httpx.MockTransport`.

A call goes through two steps: `admit` waits until the endpoint's rate limit (shared by every
worker, `examforge.ratelimit`) has room for it, and `complete` sends it. The caller writes the
call to its ledger between the two, so a call waiting for the limiter is never booked as
sent, and a call sent is always booked first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import httpx
from pydantic import SecretStr

from examforge.backoff import parse_retry_after
from examforge.classify import Action, classify
from examforge.deadline import PerThreadTransport, deadline
from examforge.errors import (
    AuthError,
    Billed,
    CapacityUnavailable,
    DeadlineExceeded,
    EndpointUnreachable,
    ErrorKind,
    ModelNotFound,
    PermanentProviderError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    ReplyLost,
    ReplyTooLarge,
    ReplyUnusable,
    RetryableProviderError,
)
from examforge.prices import Price
from examforge.ratelimit import EndpointLimit, Limiter, Limits, LocalLimiter, acquire
from examforge.prompt import types_asked
from examforge.reply_schema import response_format, schema_text
from examforge.settings import Settings
from examforge.tokens import PROMPT_MARGIN  # noqa: F401  (re-exported: it was defined here)
from examforge.tokens import count_messages, count_part, count_text, reserve_prompt_tokens

log = logging.getLogger(__name__)
# A 429 that names no Retry-After still holds every worker back this long.
DEFAULT_RATE_HOLD_S = 1.0
# PROMPT_MARGIN (examforge.tokens) is what a budget reserves on top of a prompt counted with
# the fallback encoding.
# LLM_RESPONSE_FORMAT=auto sends the reply's JSON schema (strict) only where it is known to be
# accepted: OpenAI's API, and the bundled mock (its model id is the default LLM_MODEL). A
# server that does not know json_schema may ignore it instead of refusing it, and its replies
# would then have no JSON mode at all; json_object is the format nearly every
# OpenAI-compatible server (Ollama, vLLM, llama.cpp, gateways) has long accepted. Elsewhere
# set LLM_RESPONSE_FORMAT=json_schema: a refusal falls back by itself (below).
SCHEMA_HOSTS = ("api.openai.com",)
MOCK_MODEL = "mock-model"
# What a server that refuses a response_format (a 400 naming it) is sent instead, from then on.
FORMAT_FALLBACK = {"json_schema": "json_object", "json_object": "none"}


@dataclass(frozen=True)
class Completion:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    model: str
    fallback: bool = False  # served by LLM_FALLBACK_BASE_URL (priced with its rates)
    usage_estimated: bool = False  # the reply had no usage: these are our own counts
    cost_usd: float = 0.0
    price_known: bool = True
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    # The processing tier the reply says served it (OpenAI's `service_tier`: "default",
    # "flex", "priority", ...); None when the reply names none. Priced and booked by it.
    service_tier: str | None = None

    @property
    def endpoint(self) -> str:
        return "fallback" if self.fallback else "primary"


@dataclass(frozen=True)
class _Endpoint:
    http: httpx.Client
    model: str
    base_url: str
    price: Price
    limit: EndpointLimit
    secret: str = field(repr=False)  # never in a repr, a traceback's locals or a log
    fallback: bool = False
    # The service_tier sent (None: none sent) and its factor (the worst case reserved is at
    # Price.at_tier: the data's price for the tier, else this multiple); the call's deadline.
    tier: str | None = None
    tier_factor: float = 1.0
    timeout_s: float = 60.0
    # A tier's price factor (Settings.tier_factor): what a reply reporting it is booked at.
    factor_of: Callable[[str | None], float] = field(default=lambda tier: 1.0, repr=False)

    @property
    def name(self) -> str:
        return "fallback" if self.fallback else "primary"


@dataclass
class Admission:
    """A call the rate limiter has let through (and charged `tokens` for), not yet sent."""

    endpoint: _Endpoint
    tokens: int
    waited_s: float = 0.0
    used: bool = False


class _Unreachable(Exception):
    """The request never reached the endpoint (connect refused or timed out): nothing was paid,
    so the same call may go to the fallback."""


LimiterFactory = Callable[[str, str], Limiter]  # (base_url, model) -> the endpoint's limiter


def local_limiters() -> LimiterFactory:
    """One in-process limiter per endpoint (`producer run`, tests)."""
    made: dict[tuple[str, str], Limiter] = {}
    lock = threading.Lock()

    def get(base_url: str, model: str) -> Limiter:
        with lock:
            return made.setdefault((base_url, model), LocalLimiter())

    return get


class LLMClient:
    """A thread-safe client for many concurrent calls (one connection pool per endpoint).

    With LLM_FALLBACK_BASE_URL set, a call whose connection to the primary fails (refused, a
    name that does not resolve, or no connection within LLM_CONNECT_TIMEOUT_S) goes to the
    fallback at once, and so does every call for the next LLM_FALLBACK_HOLD_S. Only connection
    failures fall back: the request was never delivered, so nothing can have been paid twice.
    A 429, a 5xx or a read timeout came from a primary that is up, and goes to the caller's
    retry policy as usual; a TLS certificate that does not verify is a permanent error.
    """

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 limiters: LimiterFactory | None = None) -> None:
        self._settings = settings
        self._clock = clock
        limiters = limiters or local_limiters()
        # Another client of the same process (the blind solver's, runner.verify) is built on
        # the same factory: an endpoint both call is under one limiter.
        self.limiters = limiters
        self._primary = self._endpoint(
            settings.llm_base_url, settings.llm_api_key, settings.llm_model, transport,
            limiters, Limits(settings.llm_rpm, settings.llm_tpm, settings.llm_rate_burst_s),
            fallback=False)
        self._fallback = None
        if settings.llm_fallback_base_url:
            self._fallback = self._endpoint(
                settings.llm_fallback_base_url, settings.llm_fallback_api_key,
                settings.llm_fallback_model or settings.llm_model, transport, limiters,
                Limits(settings.llm_fallback_rpm, settings.llm_fallback_tpm,
                       settings.llm_rate_burst_s),
                fallback=True)
        self._primary_down_until = float("-inf")  # -inf: the primary is not known to be down
        self._lock = threading.Lock()
        self._refusals_in_row = 0  # flex's "resource unavailable" 429s since the last reply
        # When this process's calls began to find no endpoint that answers (every connection
        # refused or dropped before a reply), across calls; None while one answers.
        self._unreachable_since: float | None = None
        self._models = (self._primary.model,) + ((self._fallback.model,) if self._fallback
                                                   else ())
        # The response_format each endpoint is sent now: LLM_RESPONSE_FORMAT's, lowered once
        # for the rest of the process when the endpoint refuses it (_post).
        self._formats = {ep.name: self._default_format(ep)
                         for ep in (self._primary, self._fallback) if ep is not None}

    def _endpoint(self, base_url: str, key: SecretStr, model: str,
                  transport: httpx.BaseTransport | None, limiters: LimiterFactory,
                  limits: Limits, *, fallback: bool) -> _Endpoint:
        secret = key.get_secret_value()
        # LLM_SERVICE_TIER goes to the primary only: the fallback is another server (often a
        # local one), which may know no tiers and refuse the field.
        tier = None if fallback else self._settings.service_tier
        timeout_s = self._settings.llm_flex_timeout_s if tier == "flex" \
            else self._settings.llm_timeout_s
        http = httpx.Client(
            base_url=base_url.rstrip("/") + "/",
            # Every socket operation is also bounded by the call's total deadline (_post_once),
            # through a connection pool of each thread's own (PerThreadTransport).
            transport=transport or PerThreadTransport(limits=httpx.Limits(
                max_connections=512, max_keepalive_connections=128)),
            # A flex call may wait minutes before its first byte: each read may take that long
            # (the whole call is bounded by the same deadline, _post_once).
            timeout=httpx.Timeout(timeout_s, connect=self._settings.llm_connect_timeout_s),
            headers={"Authorization": f"Bearer {secret}"} if secret else {},
        )
        limit = EndpointLimit(limiters(base_url, model), limits,
                              refund_unused=self._settings.llm_tpm_counts == "usage")
        return _Endpoint(http, model, base_url, self._settings.price(fallback=fallback), limit,
                         secret, fallback, tier, self._settings.tier_factor(tier), timeout_s,
                         self._settings.tier_factor)

    def close(self) -> None:
        self._primary.http.close()
        if self._fallback:
            self._fallback.http.close()

    # ------------------------------------------------------------------ pricing
    def worst_case_usd(self, prompt_tokens: int, max_tokens: int) -> float:
        """The most a call can cost: its prompt and all of its max_tokens, at the dearer of the
        endpoints that may serve it (a call admitted for the primary may end at the fallback),
        at the tier each is sent (LLM_SERVICE_TIER: flex reserves half). A prompt counted with
        the fallback tokenizer (a model tiktoken does not know) is reserved with a margin,
        since the provider's own tokenizer may count more."""
        eps = [self._primary] + ([self._fallback] if self._fallback else [])
        prompt = reserve_prompt_tokens(prompt_tokens, *self._models)
        return max(_sent_price(ep).cost_usd(prompt, max_tokens) for ep in eps)

    @property
    def prices_known(self) -> bool:
        return self._primary.price.known and (self._fallback is None or self._fallback.price.known)

    @property
    def model(self) -> str:
        return self._primary.model

    def count_prompt(self, messages: list[dict[str, str]]) -> int:
        return self._count_prompt(self._primary, messages)

    def _count_prompt(self, ep: _Endpoint, messages: list[dict[str, Any]]) -> int:
        """Our count of a request's prompt: its messages and, when the request carries the
        reply's JSON schema, the schema's tokens too (providers put it into the prompt)."""
        count = count_messages(messages, ep.model)
        if self.response_format_of(ep.name) == "json_schema":
            count += count_part(schema_text(types_asked(messages)), ep.model)
        return count

    # ------------------------------------------------------------------ batch lines
    # A provider batch (runner.batching) carries exactly the synchronous request, and its
    # lines' replies are read, priced and classified exactly as synchronous replies are; the
    # price is the standard one times LLM_BATCH_DISCOUNT. Batches go to the primary only.
    # A batch is its own processing tier: LLM_SERVICE_TIER is for synchronous calls, so a
    # line is sent no service_tier and is priced at the batch rate whatever tier its reply
    # names (as it is reserved: flex's price times the discount would book a quarter).
    def _batch_endpoint(self) -> _Endpoint:
        ep = self._primary
        return dataclasses.replace(ep, price=dataclasses.replace(ep.price, data_ref=None),
                                   tier=None, tier_factor=1.0, factor_of=_standard_factor)

    def batch_body(self, messages: list[dict[str, str]], max_tokens: int | None) -> dict[str, object]:
        """The body a batch line sends: the synchronous request's, without a service_tier."""
        return self._body(self._batch_endpoint(), messages, max_tokens,
                          self.response_format_of("primary"))

    def batch_worst_case_usd(self, prompt_tokens: int, max_tokens: int) -> float:
        """A batch call's reservation: the primary's worst case at the batch price."""
        prompt = reserve_prompt_tokens(prompt_tokens, self._primary.model)
        return self._primary.price.cost_usd(prompt, max_tokens) * self._settings.llm_batch_discount

    def batch_completion(self, status_code: int, body: object, prompt_tokens: int,
                         max_tokens: int | None = None) -> Completion:
        """An output line's response as a Completion at the batch price; raises the
        ProviderError a synchronous reply of that status and body would (ReplyUnusable for a
        broken envelope, with its billed usage at the batch price). A line without usage is
        booked as the synchronous path books a reply without it: `prompt_tokens` (the client's
        own count of the line's prompt, recorded with the call) and the body as received, at
        most `max_tokens` of it; never 0."""
        ep, discount = self._batch_endpoint(), self._settings.llm_batch_discount
        raw = json.dumps(body).encode() if not isinstance(body, (bytes, str)) else (
            body.encode() if isinstance(body, str) else body)
        response = httpx.Response(status_code, content=raw)
        try:
            completion = _translate(response, raw, ep, lambda: prompt_tokens)
        except ProviderError as exc:
            if isinstance(exc, ReplyUnusable) and exc.billed is None:
                got = count_text(raw.decode("utf-8", "replace"), ep.model)
                completion_tokens = got if max_tokens is None else min(got, max_tokens)
                exc.billed = Billed(prompt_tokens, completion_tokens,
                                    _sent_price(ep).cost_usd(prompt_tokens, completion_tokens),
                                    estimated=True)
            if exc.billed is not None:
                exc.billed = dataclasses.replace(exc.billed,
                                                 cost_usd=exc.billed.cost_usd * discount)
            raise _at(exc, ep)
        return dataclasses.replace(completion, cost_usd=completion.cost_usd * discount)

    def batch_error(self, status_code: int, body: object) -> ProviderError:
        """The error of a batch line (or a whole batch) as the synchronous table names it:
        `status_code` 0 for an error with no HTTP reply (batch_expired, batch_cancelled,
        token_limit_exceeded), with `body` OpenAI's {"error": {...}} or the bare error."""
        if isinstance(body, dict) and "error" not in body and ("code" in body or "message" in body):
            body = {"error": body}
        raw = json.dumps(body).encode()
        return _at(_error(httpx.Response(status_code, content=raw), raw, self._primary),
                   self._primary)

    # ------------------------------------------------------------------ response_format
    def _default_format(self, ep: _Endpoint) -> str:
        chosen = self._settings.response_format
        if chosen != "auto":
            return chosen
        known = ep.http.base_url.host in SCHEMA_HOSTS or ep.model == MOCK_MODEL
        return "json_schema" if known else "json_object"

    def response_format_of(self, endpoint: str = "primary") -> str:
        """The response_format ("json_schema", "json_object" or "none") an endpoint is sent."""
        with self._lock:
            return self._formats[endpoint]

    def _lower_format(self, ep: _Endpoint, refused: str, why: str) -> None:
        """The endpoint refused `refused`: send it the next format down from now on (once
        per process; threads that saw the same refusal lower it only once)."""
        with self._lock:
            if self._formats[ep.name] != refused:
                return  # another thread lowered it already
            self._formats[ep.name] = FORMAT_FALLBACK[refused]
        log.warning("the endpoint refused response_format %s; using %s from now on",
                    refused, FORMAT_FALLBACK[refused],
                    extra={"endpoint": ep.name, "error": why[:200]})

    # ------------------------------------------------------------------ admission
    def admit(self, messages: list[dict[str, str]], max_tokens: int | None, *,
              max_wait_s: float, check: Callable[[], None] = lambda: None,
              prompt_tokens: int | None = None) -> Admission:
        """Wait until the endpoint this call will go to has room for it under its rate limit.

        Raises RateLimited (with the wait still ahead as retry_after_s) when that would take
        longer than `max_wait_s`: the caller hands the work back rather than hold it.
        """
        ep = self._primary if self._may_try_primary(peek=True) else self._fallback
        assert ep is not None
        tokens = self._tokens(ep, messages, max_tokens, prompt_tokens)
        try:
            waited = acquire(ep.limit, tokens, max_wait_s=max_wait_s, check=check)
        except TimeoutError as exc:
            wait_s = float(exc.args[0]) if exc.args else max_wait_s
            raise _at(RateLimited(f"rate limit: the shared limiter asks to wait {wait_s:.1f}s",
                                  retry_after_s=wait_s), ep) from None
        return Admission(ep, tokens, waited)

    def try_admit(self, messages: list[dict[str, str]], max_tokens: int | None, *,
                  prompt_tokens: int | None = None) -> Admission | None:
        """`admit` without waiting: the admission if the limiter has room now, else None (and
        None when the limiter cannot be reached: the waiting `admit` handles that)."""
        ep = self._primary if self._may_try_primary(peek=True) else self._fallback
        assert ep is not None
        tokens = self._tokens(ep, messages, max_tokens, prompt_tokens)
        try:
            wait = ep.limit.try_acquire(tokens)
        except Exception:  # noqa: BLE001 - an unreachable limiter: the slow path waits on it
            return None
        return Admission(ep, tokens) if wait <= 0 else None

    def cancel(self, admission: Admission) -> None:
        """The admitted call will not be sent (its budget had no room): give its tokens back."""
        if not admission.used:
            admission.endpoint.limit.refund(admission.tokens)
        admission.used = True

    def _tokens(self, ep: _Endpoint, messages: list[dict[str, str]], max_tokens: int | None,
                prompt_tokens: int | None) -> int:
        if not ep.limit.limits.tpm:
            return 0  # nothing to charge tokens to: skip counting them
        if prompt_tokens is None:
            prompt_tokens = self._count_prompt(ep, messages)
        return prompt_tokens + (max_tokens or 0)

    # ------------------------------------------------------------------ the call
    def complete(self, messages: list[dict[str, str]], *, max_tokens: int | None = None,
                 admission: Admission | None = None) -> Completion:
        """One paid call. Raises a ProviderError subclass on any failure; EndpointUnreachable
        once every connection of this process's calls, to the endpoint and its fallback, has
        been refused or dropped before a reply for LLM_UNREACHABLE_PAUSE_S."""
        try:
            completion = self._complete(messages, max_tokens=max_tokens, admission=admission)
        except ProviderError as exc:
            if exc.kind in (ErrorKind.connection, ErrorKind.timeout) and exc.billed is None \
                    and not isinstance(exc, DeadlineExceeded):
                self._no_answer(exc)
            else:
                self._unreachable_since = None  # an endpoint answered, if with an error
            raise
        self._unreachable_since = None
        return completion

    def _no_answer(self, exc: ProviderError) -> None:
        """Another call that no endpoint answered: past LLM_UNREACHABLE_PAUSE_S since the first
        of them, the exam pauses (examforge.retry), naming the endpoints."""
        now = self._clock()
        with self._lock:
            if self._unreachable_since is None:
                self._unreachable_since = now
            down_s = now - self._unreachable_since
        limit = self._settings.llm_unreachable_pause_s
        if down_s < limit:
            return
        where = str(self._primary.http.base_url) + (
            f" and the fallback {self._fallback.http.base_url}" if self._fallback else "")
        err = EndpointUnreachable(
            f"the model endpoint {where} refused or dropped every connection for "
            f"{down_s:.0f} s ({exc}): check that it is running and LLM_BASE_URL; then "
            "python -m producer resume SLUG")
        raise _at(err, self._primary) from exc

    def _complete(self, messages: list[dict[str, str]], *, max_tokens: int | None,
                  admission: Admission | None) -> Completion:
        if admission is None:
            admission = self.admit(messages, max_tokens, max_wait_s=float("inf"))
        admission.used = True
        fallback = self._fallback
        skipped = admission.endpoint.fallback or not self._may_try_primary()
        if not skipped:
            try:
                completion = self._post(self._primary, messages, max_tokens, admission.tokens)
            except _Unreachable as exc:
                if fallback is None:
                    unreachable = RetryableProviderError(str(exc))
                    unreachable.kind = ErrorKind.connection
                    raise _at(unreachable, self._primary) from exc.__cause__
                with self._lock:
                    self._primary_down_until = self._clock() + self._settings.llm_fallback_hold_s
                log.warning("primary model endpoint unreachable; using the fallback",
                            extra={"error": str(exc),
                                   "hold_s": self._settings.llm_fallback_hold_s})
            else:
                if fallback is not None:
                    with self._lock:
                        self._primary_down_until = float("-inf")  # it is back
                return completion
        assert fallback is not None  # reached only when the primary was skipped or unreachable
        tokens = admission.tokens
        if not admission.endpoint.fallback:
            # Admitted for the primary, which turned out unreachable: the fallback has a limit
            # of its own. A short wait at most; nothing was sent anywhere yet.
            tokens = self._tokens(fallback, messages, max_tokens, None)
            acquire(fallback.limit, tokens, max_wait_s=float("inf"))
        try:
            return self._post(fallback, messages, max_tokens, tokens)
        except _Unreachable as exc:
            where = "fallback; primary held off" if skipped else "primary and fallback"
            unreachable = RetryableProviderError(f"{exc} ({where})")
            unreachable.kind = ErrorKind.connection
            raise _at(unreachable, fallback) from exc.__cause__

    def _may_try_primary(self, *, peek: bool = False) -> bool:
        """False while the primary is held off. When a hold ends, one call probes the primary
        and the others keep using the fallback until the probe has had its connect timeout:
        32 threads do not all stall on a primary that is still down. `peek` asks without
        becoming the probe."""
        if self._fallback is None:
            return True
        with self._lock:
            now = self._clock()
            if now < self._primary_down_until:
                return False
            if self._primary_down_until != float("-inf") and not peek:
                # Was down: this call is the probe.
                self._primary_down_until = now + self._settings.llm_connect_timeout_s + 1
            return True

    def _post(self, ep: _Endpoint, messages: list[dict[str, str]], max_tokens: int | None,
              tokens: int) -> Completion:
        while True:
            fmt = self.response_format_of(ep.name)
            try:
                completion, headers = self._post_once(ep, messages, max_tokens, fmt)
            except _FormatRefused as exc:
                # Refused before any work (nothing billed, nothing counted twice): the same
                # call goes again at once with the next format down, within this attempt.
                self._lower_format(ep, fmt, str(exc))
                continue
            except _Unreachable:
                ep.limit.refund(tokens)  # never reached the provider: nothing was counted there
                raise
            except ProviderError as exc:
                if exc.headers:
                    ep.limit.observe(exc.headers, tokens)
                if isinstance(exc, RateLimited):
                    ep.limit.hold(exc.retry_after_s or DEFAULT_RATE_HOLD_S)
                if isinstance(exc, CapacityUnavailable):
                    # No hold of the shared limiter: flex capacity is not the account's
                    # rate limit, and holding it would stall every worker and every tier
                    # sharing the endpoint. This chapter alone backs off (examforge.retry),
                    # the longer the more refusals in a row this process has seen.
                    with self._lock:
                        self._refusals_in_row += 1
                        exc.in_row = self._refusals_in_row
                if exc.billed is None:
                    # Refused or failed before the provider did the work, or never delivered:
                    # it did not count it.
                    ep.limit.refund(tokens)
                elif tokens and not exc.billed.estimated:
                    # A reply read but unusable: its real usage, like any reply. A worst case
                    # (the reply never came whole) keeps the whole reservation.
                    ep.limit.settle(tokens, exc.billed.prompt_tokens
                                    + exc.billed.completion_tokens)
                raise _at(exc, ep)
            break
        if self._refusals_in_row and ep.tier == "flex":
            with self._lock:
                self._refusals_in_row = 0  # flex served a reply: capacity is back
        ep.limit.observe(headers, tokens)
        if tokens:
            ep.limit.settle(tokens, completion.prompt_tokens + completion.completion_tokens)
        return completion

    def _body(self, ep: _Endpoint, messages: list[dict[str, str]],
              max_tokens: int | None, fmt: str) -> dict[str, object]:
        body: dict[str, object] = {
            "model": ep.model,
            "messages": messages,
            "temperature": self._settings.llm_temperature,
        }
        if max_tokens is not None:
            body[self._max_tokens_param(ep)] = max_tokens
        if ep.tier is not None:
            body["service_tier"] = ep.tier
        # The schema of the item types the call asks for (its Item types line).
        shape = response_format(fmt, types_asked(messages))
        if shape is not None:
            body["response_format"] = shape
        return body

    def _worst_case(self, ep: _Endpoint, messages: list[dict[str, Any]],
                    max_tokens: int | None) -> Billed:
        """What a call sent and never answered whole may be billed: our count of its prompt
        and all of its max_tokens (with no max_tokens, our count of the prompt only)."""
        # The same margin as the reservation's (examforge.tokens): a model whose own tokenizer
        # we do not have may have counted more than we did.
        prompt = reserve_prompt_tokens(self._count_prompt(ep, messages), ep.model)
        completion = max_tokens or 0
        return Billed(prompt, completion, _sent_price(ep).cost_usd(prompt, completion),
                      estimated=True)

    def _max_tokens_param(self, ep: _Endpoint) -> str:
        chosen = self._settings.llm_max_tokens_param
        if chosen != "auto":
            return chosen
        # OpenAI's reasoning models refuse max_tokens; elsewhere (Ollama, vLLM, gateways) the
        # older name is the one every server knows.
        host = ep.http.base_url.host
        return "max_completion_tokens" if host.endswith("openai.com") else "max_tokens"

    def _post_once(self, ep: _Endpoint, messages: list[dict[str, str]],
                   max_tokens: int | None, fmt: str) -> tuple[Completion, httpx.Headers]:
        body = self._body(ep, messages, max_tokens, fmt)
        cap = self._settings.llm_max_reply_bytes
        response: httpx.Response | None = None  # set once the reply's headers have arrived
        try:
            with deadline(ep.timeout_s), \
                    ep.http.stream("POST", "chat/completions", json=body) as response:
                raw = _read_capped(response, cap)
        except httpx.ConnectTimeout as exc:
            raise _Unreachable(f"timeout: {type(exc).__name__}") from exc
        except httpx.ConnectError as exc:
            if _caused_by(exc, ssl.SSLCertVerificationError):
                # A certificate that does not verify is a configuration problem: no retry
                # fixes it, and it must not quietly send the traffic to the fallback.
                err: ProviderError = PermanentProviderError(
                    f"TLS certificate verification failed for {ep.http.base_url.host}")
                err.kind = ErrorKind.tls
                raise err from exc
            # Refused, unreachable, or a name that does not resolve (in a compose network a
            # service's name exists only while it runs): the request was never sent.
            raise _Unreachable(f"connection error: {type(exc).__name__}") from exc
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ReadTimeout):
                # Sent and not answered in full within the deadline (a read is never given
                # more than what is left of it): the provider may well bill it.
                name = "LLM_FLEX_TIMEOUT_S" if ep.tier == "flex" else "LLM_TIMEOUT_S"
                err = DeadlineExceeded(
                    f"deadline: no complete reply within {name}="
                    f"{ep.timeout_s:g}s ({type(exc).__name__})")
                err.billed = self._worst_case(ep, messages, max_tokens)
                raise err from exc
            err = RetryableProviderError(f"timeout: {type(exc).__name__}")
            err.kind = ErrorKind.timeout
            raise err from exc
        except _TooLarge as exc:
            err = ReplyTooLarge(f"reply_too_large: {exc} (LLM_MAX_REPLY_BYTES={cap})")
            err.billed = self._worst_case(ep, messages, max_tokens)
            raise err from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if response is None or not 200 <= response.status_code < 300:
                # Before any reply (a reset), or an error reply cut short: nothing was billed.
                err = RetryableProviderError(f"connection error: {type(exc).__name__}")
                err.kind = ErrorKind.connection
                raise err from exc
            # A 200 whose body stopped mid-way: the completion was generated, and billed. The
            # same as a deadline: booked at its worst case, and retried.
            err = ReplyLost(f"reply_cut: the connection closed in the middle of a "
                            f"{response.status_code} reply's body ({type(exc).__name__})")
            err.billed = self._worst_case(ep, messages, max_tokens)
            err.headers = response.headers
            raise err from exc
        except httpx.TransportError as exc:
            err = RetryableProviderError(f"connection error: {type(exc).__name__}")
            err.kind = ErrorKind.connection
            raise err from exc
        except httpx.RequestError as exc:  # e.g. DecodingError: a corrupt compressed body
            err = RetryableProviderError(f"unreadable reply: {type(exc).__name__}")
            err.kind = ErrorKind.unreadable
            raise err from exc
        if fmt != "none" and _refuses_format(response, raw):
            raise _FormatRefused(_redact(raw[:300].decode("utf-8", "replace"), ep.secret))
        try:
            return (_translate(response, raw, ep, lambda: self._count_prompt(ep, messages)),
                    response.headers)
        except ReplyUnusable as exc:
            if exc.billed is None:
                # The reply carried no usage: count it ourselves, the prompt as sent and the
                # body as received (at most max_tokens of it: the most a model may bill).
                prompt = self._count_prompt(ep, messages)
                got = count_text(raw.decode("utf-8", "replace"), ep.model)
                completion = got if max_tokens is None else min(got, max_tokens)
                exc.billed = Billed(prompt, completion,
                                    _sent_price(ep).cost_usd(prompt, completion),
                                    estimated=True)
            exc.headers = response.headers
            raise


class _FormatRefused(Exception):
    """The server refused the request's response_format (a 400 naming it): nothing was done."""


def _refuses_format(response: httpx.Response, raw: bytes) -> bool:
    """A 400 (or 422: FastAPI-based servers) that names response_format, and is no error the
    classification table knows better (a quota, a key, a model)."""
    if response.status_code not in (400, 422) or b"response_format" not in raw:
        return False
    message, code, type_ = _error_fields(raw)
    return classify(response.status_code, code, type_, message or "").action is Action.fail_chapter


class _TooLarge(Exception):
    pass


def _read_capped(response: httpx.Response, cap: int) -> bytes:
    """The whole body, refused as soon as it passes `cap` bytes (decompressed, so a small
    gzip bomb is caught too); a declared Content-Length over the cap is refused unread."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _TooLarge(f"Content-Length {declared} bytes")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > cap:
            raise _TooLarge(f"more than {cap} bytes")
    return bytes(body)


def _at(exc: ProviderError, ep: _Endpoint) -> ProviderError:
    """Say which endpoint an error came from (the ledger books failed calls by endpoint too)."""
    exc.endpoint = ep.name
    return exc


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `kind` is anywhere in the chain (httpcore re-raises with `from None`, so the
    original error sits on __context__)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, kind):
            return True
        seen.add(id(e))
        stack += [e.__cause__, e.__context__]
    return False


def _redact(text: str, secret: str) -> str:
    """Providers echo the key they rejected ("Incorrect API key provided: sk-..."): drop it."""
    return text.replace(secret, "***") if secret else text


def _error_fields(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """(message, code, type) of an OpenAI-style error body; None where absent."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError, RecursionError):
        return None, None, None
    if not isinstance(err, dict):
        return (str(err) if err else None), None, None

    def text(v: object) -> str | None:
        return str(v) if isinstance(v, (str, int)) and str(v) else None

    return text(err.get("message")), text(err.get("code")), text(err.get("type"))


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """OpenAI sends retry-after-ms beside Retry-After; the finer one wins."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


_ERROR_CLASS: dict[tuple[Action, ErrorKind | None], type[ProviderError]] = {
    (Action.retry, ErrorKind.rate_limited): RateLimited,
    (Action.retry, ErrorKind.resource_unavailable): CapacityUnavailable,
    (Action.retry, None): RetryableProviderError,
    (Action.pause_exam, ErrorKind.auth): AuthError,
    (Action.pause_exam, ErrorKind.quota): QuotaExceeded,
    (Action.pause_exam, ErrorKind.model_not_found): ModelNotFound,
    (Action.fail_chapter, None): PermanentProviderError,
}


def _error(response: httpx.Response, raw: bytes, ep: _Endpoint) -> ProviderError:
    status = response.status_code
    message, code, type_ = _error_fields(raw)
    rule = classify(status, code, type_, message or "")
    cls = _ERROR_CLASS.get((rule.action, rule.kind)) or _ERROR_CLASS[(rule.action, None)]
    text = _redact(f"HTTP {status}" + (f": {message}" if message else ""), ep.secret)[:220]
    err = cls(text, status_code=status, retry_after_s=_retry_after_s(response.headers)
              if rule.action is Action.retry else None)
    err.kind = rule.kind
    err.headers = response.headers  # the limiter learns from them
    return err


def _content(content: object) -> str | None:
    """A message's content: a string, None, or a list of parts (some OpenAI-compatible
    servers, reasoning models among them, send `[{"type": "text", "text": ...}]`): its text
    parts joined as they come (a JSON reply may be split anywhere), other parts (reasoning,
    images) left out. Raises TypeError for any other shape."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError(f"message content is {type(content).__name__}, not a string")
    texts = []
    for part in content:
        if not isinstance(part, dict):
            raise TypeError(f"a content part is {type(part).__name__}, not an object")
        if part.get("type") == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise TypeError(f"a text part's text is {type(text).__name__}, not a string")
            texts.append(text)
    return "".join(texts) if texts else None


def _standard_factor(tier: str | None) -> float:
    return 1.0


def _tier(data: Any) -> str | None:
    """The tier a reply says served it (`service_tier`), or None when it names none."""
    tier = data.get("service_tier") if isinstance(data, dict) else None
    if not isinstance(tier, str):
        return None
    return tier.strip().lower()[:32] or None


def _sent_price(ep: _Endpoint) -> Price:
    """The price at the tier a call was sent at: its worst case, reserved before it is sent,
    and what a call never answered whole (so no tier reported) is booked at."""
    return ep.price.at_tier(ep.tier, ep.tier_factor)


def _booked_price(ep: _Endpoint, reported: str | None) -> Price:
    """The price a call is booked at: the price of the tier its reply reports (OpenAI's
    replies always name one; Price.at_tier: the price data's, else the tier's factor). A reply that names none came from a
    server without tiers, which bills its one price: booked at the tier sent when that is
    dearer than standard (priority), else at standard, so that a cost is never booked below
    the bill (flex unreported: standard, twice what flex would be)."""
    if reported is not None:
        return ep.price.at_tier(reported, ep.factor_of(reported))
    return _sent_price(ep) if ep.tier_factor > 1.0 else ep.price


def _usage(data: dict[str, object]) -> tuple[int, int, int] | None:
    """(prompt, completion, cached prompt) tokens of a reply's usage, or None without one.
    Cached tokens are part of prompt_tokens: OpenAI's `prompt_tokens_details.cached_tokens`,
    or `cache_read_input_tokens` as gateways pass Anthropic's cache reads through."""
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None

    def _int(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = _int(usage.get("cache_read_input_tokens"))
    return prompt, completion, min(cached or 0, prompt)


def _translate(response: httpx.Response, raw: bytes, ep: _Endpoint,
               count_prompt: Callable[[], int]) -> Completion:
    status, secret = response.status_code, ep.secret
    if status >= 400:
        raise _error(response, raw, ep)
    if status >= 300:
        # httpx does not follow redirects here on purpose: a POST redirected is a wrong
        # LLM_BASE_URL (http vs https, a missing /v1), which no retry can fix.
        err: ProviderError = PermanentProviderError(
            f"HTTP {status} redirect to {response.headers.get('location', '?')[:200]}: "
            "check LLM_BASE_URL", status_code=status)
        err.kind = ErrorKind.redirect
        raise err
    data: Any = None
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        content, finish_reason = _content(message.get("content")), choice.get("finish_reason")
        if not isinstance(finish_reason, (str, type(None))):
            raise TypeError(f"finish_reason is {type(finish_reason).__name__}, not a string")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        # A 200 whose envelope is broken: often a proxy's fault, but the provider may have
        # billed it, and says so when it carries usage. Booked at that (or at our count, see
        # _post_once) as wasted invalid output, and re-asked like any (never a transient
        # retry: the same call would be paid again with no cap).
        err = ReplyUnusable(_redact(f"unreadable reply envelope: {exc!r}", secret)[:200])
        usage = _usage(data) if isinstance(data, dict) else None
        if usage is not None:
            tier = _tier(data)
            err.billed = Billed(usage[0], usage[1], _booked_price(ep, tier).cost_usd(*usage),
                                estimated=False, cached_tokens=usage[2], service_tier=tier)
        raise err from exc
    usage = _usage(data)
    estimated = usage is None
    if usage is None:
        # Some servers and gateways send no usage. That call is not free: count it ourselves
        # (the prompt as sent, the reply as received) and say the count is ours.
        usage = (count_prompt(), count_text(content or "", ep.model), 0)
    prompt_tokens, completion_tokens, cached_tokens = usage
    tier = _tier(data)
    return Completion(
        content=content,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        model=str(data.get("model") or ep.model),
        fallback=ep.fallback,
        usage_estimated=estimated,
        cost_usd=_booked_price(ep, tier).cost_usd(prompt_tokens, completion_tokens,
                                                  cached_tokens),
        price_known=ep.price.known,
        cached_tokens=cached_tokens,
        service_tier=tier,
    )


__all__ = ["Admission", "Completion", "LLMClient", "ProviderError", "local_limiters"]
