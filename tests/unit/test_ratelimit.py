"""The shared rate limiter: GCRA arithmetic in process (a fake clock) and in Redis (fakeredis
with Lua, real time), the provider's headers, and failing safe."""

from __future__ import annotations

import threading
import time

import fakeredis
import pytest

from examforge.ratelimit import (
    Advertised,
    EndpointLimit,
    Limits,
    LocalLimiter,
    RedisLimiter,
    acquire,
    limiter_key,
    parse_duration_s,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_600_rpm_is_ten_at_once_then_one_every_100_ms():
    clock = Clock()
    limiter = LocalLimiter(clock)
    limits = Limits(rpm=600, burst_s=1.0)
    admitted = [limiter.try_acquire(limits, 0) == 0 for _ in range(15)]
    assert admitted == [True] * 10 + [False] * 5
    wait = limiter.try_acquire(limits, 0)
    assert wait == pytest.approx(0.1)
    clock.now += 0.1
    assert limiter.try_acquire(limits, 0) == 0
    assert limiter.try_acquire(limits, 0) > 0
    # Over a long run the rate is the limit, whatever the burst.
    count, start = 0, clock.now
    while clock.now < start + 60:
        if limiter.try_acquire(limits, 0) == 0:
            count += 1
        else:
            clock.now += 0.01
    assert 599 <= count <= 611


def test_a_request_larger_than_the_burst_passes_when_the_bucket_is_full_then_others_wait():
    clock = Clock()
    limiter = LocalLimiter(clock)
    limits = Limits(tpm=60_000, burst_s=1.0)  # 1,000 tokens a second
    assert limiter.try_acquire(limits, 4_000) == 0  # 4 s of debt
    wait = limiter.try_acquire(limits, 4_000)
    assert wait == pytest.approx(3.0)  # until the debt is back within the burst
    clock.now += 3.0
    assert limiter.try_acquire(limits, 4_000) == 0


def test_a_hold_stops_everyone_until_it_ends():
    clock = Clock()
    limiter = LocalLimiter(clock)
    limiter.hold(5.0)
    assert limiter.try_acquire(Limits(), 0) == pytest.approx(5.0)
    clock.now += 5.0
    assert limiter.try_acquire(Limits(), 0) == 0


def test_tokens_can_be_charged_after_the_fact_and_refunded():
    clock = Clock()
    limiter = LocalLimiter(clock)
    limits = Limits(tpm=60_000, burst_s=1.0)
    assert limiter.try_acquire(limits, 3_000) == 0
    limiter.adjust(limits, -2_500)  # the reply used less than reserved
    assert limiter.try_acquire(limits, 100) == 0
    limiter.adjust(limits, 5_000)
    assert limiter.try_acquire(limits, 100) > 0


def _redis_limiter() -> RedisLimiter:
    client = fakeredis.FakeRedis()
    return RedisLimiter(client, limiter_key("http://x/v1", "m"))


@pytest.mark.parametrize("make", [LocalLimiter, _redis_limiter], ids=["local", "redis"])
def test_both_limiters_admit_the_same_burst_and_space_the_rest(make):
    limiter = make()
    # One every 0.5 s, 5 at once: slow enough that no token comes back while the seven asks
    # run (fakeredis's Lua took over 50 ms for them in a loaded suite, at one every 50 ms).
    limits = Limits(rpm=120, burst_s=2.5)
    results = [limiter.try_acquire(limits, 0) for _ in range(7)]
    assert [r == 0 for r in results] == [True] * 5 + [False] * 2
    assert 0 < results[-1] <= 0.5 + 1e-6


@pytest.mark.parametrize("make", [LocalLimiter, _redis_limiter], ids=["local", "redis"])
def test_both_limiters_hold_and_push_back(make):
    limiter = make()
    limits = Limits(rpm=600, tpm=60_000, burst_s=1.0)
    limiter.hold(0.3)
    assert 0.25 < limiter.try_acquire(limits, 10) <= 0.3
    time.sleep(0.31)
    assert limiter.try_acquire(limits, 10) == 0
    limiter.push_back(limits, 0.0, 0.4)  # the provider has no tokens left for 0.4 s
    assert 0.35 < limiter.try_acquire(limits, 10) <= 0.4 + 1e-6


def test_many_threads_sharing_one_redis_limiter_never_exceed_it():
    client = fakeredis.FakeRedis()
    key = limiter_key("http://shared/v1", "m")
    limits = Limits(rpm=6000, burst_s=0.1)  # 100/s, 10 at once
    admitted: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        limiter = RedisLimiter(client, key)  # each "process" its own client object
        limit = EndpointLimit(limiter, limits)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            acquire(limit, 0, max_wait_s=5)
            with lock:
                admitted.append(time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = admitted[-1] - admitted[0]
    # At most the burst plus the rate over the span: never the rate times the workers.
    assert len(admitted) <= 10 + 100 * span + 2, (len(admitted), span)
    assert len(admitted) >= 50


@pytest.mark.parametrize(("text", "seconds"), [
    ("1s", 1.0), ("120ms", 0.12), ("6m0s", 360.0), ("1h2m3.5s", 3723.5), ("0s", 0.0),
    ("2.5", 2.5), ("59.997s", 59.997), ("", None), (None, None), ("soon", None), ("5x", None),
    ("1m", 60.0), ("3", 3.0),
])
def test_openai_reset_durations(text, seconds):
    parsed = parse_duration_s(text)
    assert parsed == (pytest.approx(seconds) if seconds is not None else None)


def test_nonsense_headers_are_ignored_like_azures():
    ad = Advertised.from_headers({"x-ratelimit-limit-requests": "-1",
                                  "x-ratelimit-limit-tokens": "0",
                                  "x-ratelimit-remaining-tokens": "-1",
                                  "x-ratelimit-reset-tokens": "soon"})
    assert (ad.limit_requests, ad.limit_tokens, ad.remaining_tokens, ad.reset_tokens_s) == (
        None, None, None, None)


def test_an_advertised_limit_tighter_than_ours_is_adopted_and_no_room_waits():
    clock = Clock()
    limit = EndpointLimit(LocalLimiter(clock), Limits(rpm=1000, tpm=None, burst_s=1.0))
    limit.observe({"x-ratelimit-limit-requests": "600", "x-ratelimit-limit-tokens": "60000",
                   "x-ratelimit-remaining-tokens": "1000"}, last_tokens=4000)
    assert limit.limits.rpm == 600 and limit.limits.tpm == 60000
    # 3,000 tokens short at 1,000 a second: the next admission waits about 3 s.
    assert limit.try_acquire(100) == pytest.approx(3.0)
    limit.observe({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s"},
                  last_tokens=0)
    assert limit.try_acquire(0) >= 2.0


def test_unused_tokens_are_refunded_only_where_the_provider_counts_real_usage():
    clock = Clock()
    counts_max_tokens = EndpointLimit(LocalLimiter(clock), Limits(tpm=60_000))
    counts_usage = EndpointLimit(LocalLimiter(clock), Limits(tpm=60_000), refund_unused=True)
    for limit in (counts_max_tokens, counts_usage):
        assert limit.try_acquire(4_000) == 0
        limit.settle(reserved=4_000, actual=1_200)
    assert counts_max_tokens.try_acquire(100) == pytest.approx(3.0)
    assert counts_usage.try_acquire(100) == pytest.approx(0.2)


def test_acquire_waits_out_an_unreachable_limiter_instead_of_sending():
    class Down:
        calls = 0

        def try_acquire(self, limits, tokens):
            Down.calls += 1
            if Down.calls < 3:
                raise ConnectionError("Redis is restarting")
            return 0.0

    slept: list[float] = []
    waited = acquire(EndpointLimit(Down(), Limits(rpm=60)), 0, max_wait_s=60,  # type: ignore[arg-type]
                     sleep=slept.append)
    assert Down.calls == 3 and len(slept) == 2 and waited > 0


def test_acquire_hands_back_when_the_wait_is_longer_than_allowed():
    limit = EndpointLimit(LocalLimiter(), Limits())
    limit.hold(30)
    with pytest.raises(TimeoutError) as info:
        acquire(limit, 0, max_wait_s=5)
    assert 29 < info.value.args[0] <= 30


def test_an_endpoint_with_nothing_to_enforce_only_reads_the_hold():
    class Counting(LocalLimiter):
        asked = reads = 0

        def try_acquire(self, limits, tokens):  # type: ignore[no-untyped-def]
            Counting.asked += 1
            return super().try_acquire(limits, tokens)

        def held(self):  # type: ignore[no-untyped-def]
            Counting.reads += 1
            return super().held()

    clock = Clock()
    limit = EndpointLimit(Counting(clock), Limits())  # no RPM/TPM configured or learned
    assert limit.try_acquire(100) == 0 and (Counting.asked, Counting.reads) == (0, 1)
    limit.hold(120)  # any worker's 429: this one waits it out too, from its first admission
    assert limit.try_acquire(100) == pytest.approx(120) and Counting.asked == 0
    clock.now += 120
    assert limit.try_acquire(100) == 0 and (Counting.asked, Counting.reads) == (0, 3)
    limit.observe({"x-ratelimit-limit-requests": "600"}, last_tokens=0)
    assert limit.active and limit.limits.rpm == 600  # learned from the provider
    limit.try_acquire(100)
    assert (Counting.asked, Counting.reads) == (1, 3)  # the admission's script reads the hold


def test_a_hold_that_cannot_be_read_does_not_stop_an_endpoint_with_nothing_to_enforce():
    class Down(LocalLimiter):
        def held(self):  # type: ignore[no-untyped-def]
            raise ConnectionError("Redis is restarting")

    assert EndpointLimit(Down(), Limits()).try_acquire(100) == 0


def test_no_write_to_the_shared_limit_shortens_a_backlog_or_a_hold():
    """A push-back or a refund that leaves a short backlog must not expire the key holding a
    longer one (the old scripts set the expiry from the field they wrote: 60 s later the
    limit forgot a 300 s token backlog, and a 120 s hold)."""
    client = fakeredis.FakeRedis()
    limiter = RedisLimiter(client, limiter_key("http://x/v1", "m"))
    limits = Limits(rpm=600, tpm=6_000, burst_s=1.0)
    assert limiter.try_acquire(limits, 30_000) == 0  # 300 s of tokens charged at once
    limiter.hold(120)
    limiter.adjust(limits, -10)  # a refund: its tokens field still 300 s ahead
    limiter.push_back(limits, 0.5, 0.0)  # the requests field: half a second ahead
    assert client.pttl(limiter_key("http://x/v1", "m")) > 290_000
    assert 119_000 < client.pttl(limiter.hold_key) <= 120_000
    limiter.hold(1)  # a shorter hold set meanwhile
    assert client.pttl(limiter.hold_key) > 119_000
    assert limiter.held() == pytest.approx(120, abs=1)
