"""One provider's rate limit, shared by every worker and machine: requests and tokens per
minute, spread evenly, learned from the provider's own headers and its 429s.

The algorithm is GCRA (the generic cell rate algorithm, a token bucket kept as one timestamp
per limit): each limit keeps its "theoretical arrival time" `tat`; admitting a request of cost
c moves it c x T later (T = 60 / limit seconds). A request is admitted while the backlog
`tat - now` is within the burst (`LLM_RATE_BURST_S`), and the cost is added after the check,
so one request larger than the burst (a big prompt plus its `max_tokens`) still passes when
the bucket is full and the ones after it wait until its debt is paid. 600 RPM is then 10
requests at once and one every 100 ms after, as providers enforce per-minute limits over
short windows.

Why a Lua script and not a library: the check and the charge must be one atomic step in
Redis, or N workers each see room for the same request (the multi-replica overshoot LiteLLM
users report). `limits` is atomic, but its moving window stores one list entry per unit of
cost (a 4,000-token call is 4,000 entries) and it has no refund or hold; redis-cell is a
Redis module the server must load, and it is in maintenance mode; PyrateLimiter has reported
concurrency bugs on Redis. GCRA is a few lines of arithmetic on two numbers, which the script
below does with Redis's own clock, so machines with skewed clocks share one timeline.

A provider's hold (a 429's Retry-After) is a key of its own, `<limit key>:hold`, whose expiry
is the hold's end: Redis forgets it exactly when nobody need wait any more, and nothing that
sets the limit's own expiry (which follows its backlog) can cut it short. Every worker reads
it at each admission: one whose limits are configured or learned in the admission's script,
one with none by a single PTTL, the only Redis round trip it makes.

`LocalLimiter` is the same arithmetic in process, for `producer run` with no Redis.

When Redis is unreachable the limiter fails safe: `acquire` keeps waiting and retrying, and
never sends a request it could not account for.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

log = logging.getLogger(__name__)
# Float sums of intervals drift by ulps; a burst of ten must not become nine.
_EPSILON_S = 1e-9


@dataclass(frozen=True)
class Limits:
    rpm: float | None = None
    tpm: float | None = None
    burst_s: float = 1.0

    @property
    def request_interval_s(self) -> float:
        return 60.0 / self.rpm if self.rpm else 0.0

    @property
    def token_interval_s(self) -> float:
        return 60.0 / self.tpm if self.tpm else 0.0

    def tolerance_s(self) -> tuple[float, float]:
        """Backlog allowed before a new request waits: for requests, a burst of `burst_s`
        worth of them passes at once; for tokens, `burst_s` worth plus the request's own."""
        tau_r = max(0.0, self.burst_s - self.request_interval_s)
        return tau_r, self.burst_s


class Limiter(Protocol):
    """What the client needs from a rate limiter (RedisLimiter or LocalLimiter)."""

    def try_acquire(self, limits: Limits, tokens: int) -> float:
        """Admit one request of `tokens` and charge it (returns 0), or say how many seconds to
        wait before asking again (nothing charged)."""

    def adjust(self, limits: Limits, tokens: int) -> None:
        """Charge `tokens` more (or refund, if negative) after the fact."""

    def hold(self, seconds: float) -> None:
        """Nobody on this endpoint sends anything for `seconds` (a 429's Retry-After)."""

    def held(self) -> float:
        """The seconds left of the endpoint's hold (0 when there is none): what a worker with
        no limits to enforce asks before each call."""

    def push_back(self, limits: Limits, requests_wait_s: float, tokens_wait_s: float) -> None:
        """The provider says it has no room: make the next admission wait at least this."""


# ---------------------------------------------------------------- Redis, shared
# KEYS: the limit's hash, its hold key. The hash's expiry is always set from the later of its
# two backlogs (+60 s), so that no script shortens the life of a backlog another one set.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local st = redis.call('HMGET', KEYS[1], 'tat_r', 'tat_t')
local tat_r = math.max(tonumber(st[1]) or now, now)
local tat_t = math.max(tonumber(st[2]) or now, now)
local held = redis.call('PTTL', KEYS[2])
local Tr, Tt = tonumber(ARGV[1]), tonumber(ARGV[2])
local tau_r, tau_t, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local wait = 0
if held > 0 then wait = held / 1000 end
if Tr > 0 and tat_r - now > tau_r + 1e-9 then wait = math.max(wait, tat_r - now - tau_r) end
if Tt > 0 and tat_t - now > tau_t + 1e-9 then wait = math.max(wait, tat_t - now - tau_t) end
if wait > 0 then return tostring(wait) end
if Tr > 0 then tat_r = tat_r + Tr end
if Tt > 0 then tat_t = tat_t + cost * Tt end
redis.call('HSET', KEYS[1], 'tat_r', tostring(tat_r), 'tat_t', tostring(tat_t))
redis.call('PEXPIRE', KEYS[1], math.ceil((math.max(tat_r, tat_t) - now + 60) * 1000))
return '0'
"""

_ADJUST = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat_t = math.max(tonumber(redis.call('HGET', KEYS[1], 'tat_t')) or now, now)
tat_t = math.max(tat_t + tonumber(ARGV[1]) * tonumber(ARGV[2]), now)
redis.call('HSET', KEYS[1], 'tat_t', tostring(tat_t))
local tat_r = tonumber(redis.call('HGET', KEYS[1], 'tat_r')) or now
redis.call('PEXPIRE', KEYS[1], math.ceil((math.max(tat_r, tat_t) - now + 60) * 1000))
return 1
"""

# ARGV: field, seconds from now: the field becomes at least now + seconds.
_PUSH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local until_ = now + tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
if until_ > current then redis.call('HSET', KEYS[1], ARGV[1], tostring(until_)) end
local st = redis.call('HMGET', KEYS[1], 'tat_r', 'tat_t')
local last = math.max(tonumber(st[1]) or now, tonumber(st[2]) or now)
redis.call('PEXPIRE', KEYS[1], math.ceil((last - now + 60) * 1000))
return 1
"""

# KEYS: the hold key; ARGV: the hold in ms. The key lives until the hold ends; a shorter hold
# set meanwhile never shortens a longer one.
_HOLD = """
local ms = math.max(1, math.ceil(tonumber(ARGV[1])))
if redis.call('PTTL', KEYS[1]) < ms then redis.call('SET', KEYS[1], '1', 'PX', ms) end
return 1
"""


def limiter_key(base_url: str, model: str) -> str:
    """One limit per endpoint and model: providers limit each model of an account apart."""
    digest = hashlib.sha1(f"{base_url.rstrip('/')}|{model}".encode()).hexdigest()[:16]
    return f"examforge:rate:{digest}"


class RedisLimiter:
    """The shared limiter: its state is one Redis hash per endpoint and model."""

    def __init__(self, client: Any, key: str) -> None:
        self._client = client
        self._key = key
        self.hold_key = f"{key}:hold"
        self._acquire = client.register_script(_ACQUIRE)
        self._adjust = client.register_script(_ADJUST)
        self._push = client.register_script(_PUSH)
        self._hold = client.register_script(_HOLD)

    def try_acquire(self, limits: Limits, tokens: int) -> float:
        tau_r, tau_t = limits.tolerance_s()
        return float(self._acquire(keys=[self._key, self.hold_key], args=[
            repr(limits.request_interval_s), repr(limits.token_interval_s), repr(tau_r),
            repr(tau_t), int(tokens)]))

    def adjust(self, limits: Limits, tokens: int) -> None:
        if limits.tpm and tokens:
            self._adjust(keys=[self._key], args=[int(tokens), repr(limits.token_interval_s)])

    def hold(self, seconds: float) -> None:
        self._hold(keys=[self.hold_key], args=[repr(float(seconds) * 1000)])

    def held(self) -> float:
        return max(0, int(self._client.pttl(self.hold_key))) / 1000

    def push_back(self, limits: Limits, requests_wait_s: float, tokens_wait_s: float) -> None:
        tau_r, tau_t = limits.tolerance_s()
        if requests_wait_s > 0 and limits.rpm:
            self._push(keys=[self._key], args=["tat_r", repr(tau_r + requests_wait_s)])
        if tokens_wait_s > 0 and limits.tpm:
            self._push(keys=[self._key], args=["tat_t", repr(tau_t + tokens_wait_s)])


def redis_limiters(redis_at: str | Any) -> Callable[[str, str], Limiter]:
    """Shared limiters, one per endpoint and model, on the broker's Redis: a redis-py client
    (tasks.broker.broker_redis, which also goes through Sentinel), or a redis:// URL."""
    if isinstance(redis_at, str):
        import redis

        client = redis.Redis.from_url(redis_at, socket_timeout=2, socket_connect_timeout=2,
                                      health_check_interval=10)
    else:
        client = redis_at
    return lambda base_url, model: RedisLimiter(client, limiter_key(base_url, model))


# ---------------------------------------------------------------- in process
class LocalLimiter:
    """The same arithmetic as the Lua scripts, for one process (`producer run`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tat_r = self._tat_t = self._hold = float("-inf")

    def try_acquire(self, limits: Limits, tokens: int) -> float:
        tau_r, tau_t = limits.tolerance_s()
        with self._lock:
            now = self._clock()
            tat_r, tat_t = max(self._tat_r, now), max(self._tat_t, now)
            wait = max(0.0, self._hold - now)
            if limits.rpm and tat_r - now > tau_r + _EPSILON_S:
                wait = max(wait, tat_r - now - tau_r)
            if limits.tpm and tat_t - now > tau_t + _EPSILON_S:
                wait = max(wait, tat_t - now - tau_t)
            if wait > 0:
                return wait
            if limits.rpm:
                self._tat_r = tat_r + limits.request_interval_s
            if limits.tpm:
                self._tat_t = tat_t + tokens * limits.token_interval_s
            return 0.0

    def adjust(self, limits: Limits, tokens: int) -> None:
        if not limits.tpm or not tokens:
            return
        with self._lock:
            now = self._clock()
            self._tat_t = max(max(self._tat_t, now) + tokens * limits.token_interval_s, now)

    def hold(self, seconds: float) -> None:
        with self._lock:
            self._hold = max(self._hold, self._clock() + seconds)

    def held(self) -> float:
        with self._lock:
            return max(0.0, self._hold - self._clock())

    def push_back(self, limits: Limits, requests_wait_s: float, tokens_wait_s: float) -> None:
        tau_r, tau_t = limits.tolerance_s()
        with self._lock:
            now = self._clock()
            if requests_wait_s > 0 and limits.rpm:
                self._tat_r = max(self._tat_r, now + tau_r + requests_wait_s)
            if tokens_wait_s > 0 and limits.tpm:
                self._tat_t = max(self._tat_t, now + tau_t + tokens_wait_s)


# ---------------------------------------------------------------- the provider's headers
def parse_duration_s(value: str | None) -> float | None:
    """OpenAI's reset durations: `1s`, `120ms`, `6m0s`, `1h2m3.5s`, or plain seconds."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    total, number = 0.0, ""
    i = 0
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    while i < len(value):
        c = value[i]
        if c.isdigit() or c == ".":
            number += c
            i += 1
            continue
        unit = "ms" if value.startswith("ms", i) else c
        if unit not in units or not number:
            return None
        try:
            total += float(number) * units[unit]
        except ValueError:
            return None
        number = ""
        i += len(unit)
    return None if number else total


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    try:
        value = int(float(raw)) if raw is not None else None
    except ValueError:
        return None
    # Azure has been seen sending -1 and 0 for "unknown": hints only, never trusted blindly.
    return value if value is not None and value >= 0 else None


@dataclass(frozen=True)
class Advertised:
    """What a reply's x-ratelimit-* headers say (None where absent or nonsensical)."""

    limit_requests: int | None
    limit_tokens: int | None
    remaining_requests: int | None
    remaining_tokens: int | None
    reset_requests_s: float | None
    reset_tokens_s: float | None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> "Advertised":
        return cls(
            limit_requests=_header_int(headers, "x-ratelimit-limit-requests") or None,
            limit_tokens=_header_int(headers, "x-ratelimit-limit-tokens") or None,
            remaining_requests=_header_int(headers, "x-ratelimit-remaining-requests"),
            remaining_tokens=_header_int(headers, "x-ratelimit-remaining-tokens"),
            reset_requests_s=parse_duration_s(headers.get("x-ratelimit-reset-requests")),
            reset_tokens_s=parse_duration_s(headers.get("x-ratelimit-reset-tokens")),
        )


class EndpointLimit:
    """One endpoint's limit as a worker applies it: the configured RPM/TPM, tightened by what
    the provider advertises, charged to a shared (or local) limiter."""

    def __init__(self, limiter: Limiter, configured: Limits, *,
                 refund_unused: bool = False) -> None:
        self.limiter = limiter
        self.configured = configured
        self._learned_rpm: float | None = None
        self._learned_tpm: float | None = None
        self.refund_unused = refund_unused
        self._hold_unread = False  # the last read of the hold failed (logged once)

    @property
    def limits(self) -> Limits:
        def tighter(a: float | None, b: float | None) -> float | None:
            return min(x for x in (a, b) if x) if (a or b) else None

        return Limits(tighter(self.configured.rpm, self._learned_rpm),
                      tighter(self.configured.tpm, self._learned_tpm), self.configured.burst_s)

    @property
    def active(self) -> bool:
        """Whether there is a limit to enforce, configured or learned. When not, an admission
        only reads the endpoint's hold."""
        limits = self.limits
        return bool(limits.rpm or limits.tpm)

    def try_acquire(self, tokens: int) -> float:
        if self.active:
            return self.limiter.try_acquire(self.limits, tokens)
        # Any worker's 429 holds this one too, limits or not. A hold that cannot be read is
        # taken as none: with no limit to keep, there is nothing the wait would account for,
        # and the provider says so again with its next 429 (whose hold is then set here).
        try:
            held = self.limiter.held()
        except Exception as exc:  # noqa: BLE001
            if not self._hold_unread:
                log.warning("rate limiter unreachable; its hold is not read: %s",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self._hold_unread = True
            return 0.0
        self._hold_unread = False
        return held

    def hold(self, seconds: float) -> None:
        """Every worker on this endpoint waits `seconds` (a 429's Retry-After)."""
        self._quietly(self.limiter.hold, seconds)

    def refund(self, tokens: int) -> None:
        """Tokens charged for a request the provider never counted (refused, unreachable)."""
        if tokens:
            self._quietly(self.limiter.adjust, self.limits, -tokens)

    def _quietly(self, fn: Callable[..., None], *args: Any) -> None:
        """Bookkeeping after a call was made must never fail the call: a limiter that cannot
        be reached now is seen (and waited for) at the next admission."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            log.warning("rate limiter unreachable; bookkeeping skipped: %s",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def settle(self, reserved: int, actual: int) -> None:
        """Correct the tokens charged at admission with the reply's real usage: more is always
        charged; less is refunded only where the provider counts real usage, not `max_tokens`
        (OpenAI counts a request's max_tokens toward TPM when it admits it)."""
        delta = actual - reserved
        if delta > 0 or (delta < 0 and self.refund_unused):
            self._quietly(self.limiter.adjust, self.limits, delta)

    def observe(self, headers: Mapping[str, str], last_tokens: int) -> None:
        """Learn from a reply's headers: adopt an advertised limit tighter than ours, and when
        the provider has no room left for a request like the last one, wait until it has."""
        ad = Advertised.from_headers(headers)
        if ad.limit_requests:
            self._learned_rpm = float(ad.limit_requests)
        if ad.limit_tokens:
            self._learned_tpm = float(ad.limit_tokens)
        limits = self.limits
        requests_wait = tokens_wait = 0.0
        if ad.remaining_requests == 0:
            requests_wait = ad.reset_requests_s or limits.request_interval_s
        if ad.remaining_tokens is not None and limits.tpm and ad.remaining_tokens < last_tokens:
            tokens_wait = (last_tokens - ad.remaining_tokens) * limits.token_interval_s
        if requests_wait or tokens_wait:
            self._quietly(self.limiter.push_back, limits, requests_wait, tokens_wait)


def acquire(limit: EndpointLimit, tokens: int, *, max_wait_s: float,
            check: Callable[[], None] = lambda: None,
            sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until `limit` admits a request of `tokens`; returns the seconds waited.

    Raises TimeoutError (carrying the wait still ahead) when that would exceed `max_wait_s`,
    so the caller can hand its work back instead of holding it. `check` is called between
    waits and may raise (a shutdown, a lost lease). A limiter that cannot be reached is waited
    on as if it had said no: nothing is sent unaccounted for.
    """
    waited, failures = 0.0, 0
    while True:
        check()
        try:
            wait = limit.try_acquire(tokens)
            failures = 0
        except Exception as exc:  # Redis down or restarting: fail safe, keep waiting
            failures += 1
            wait = min(0.5 * 2 ** min(failures, 4), 5.0)
            if failures == 1:
                log.warning("rate limiter unreachable; waiting for it: %s",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        if wait <= 0:
            return waited
        if waited + wait > max_wait_s:
            raise TimeoutError(wait)
        step = min(wait, 1.0)
        sleep(step)
        waited += step
