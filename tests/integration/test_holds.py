"""Holds. A provider's hold (a 429's Retry-After longer than a minute) outlives 60 s for every
worker: one process with RPM and TPM configured gets the 429 from the mock through the real
client (which then refunds its tokens, the write that used to cut the hold's key to 60 s);
another with no limits configured, sharing the real Redis, sees the hold and sends nothing.

The fast test reads what Redis will do from the hold key's PTTL (its expiry is the hold's
end) and the wait the second process is told, without waiting a minute; the slow one waits
past the 60th second and then for the hold's end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import redis

from examforge.errors import RateLimited
from examforge.llm import LLMClient
from examforge.ratelimit import Limits, limiter_key, redis_limiters
from mockllm import MockConfig
from mockllm.server import MockServer

MESSAGES = [{"role": "user", "content": "Exam: ex\nChapter: a\nQuestions: 1"}]

# The first worker: limits configured, one call, which the mock answers with a 429.
HOLDER = r"""
import json, sys
from examforge.errors import RateLimited
from examforge.llm import LLMClient
from examforge.ratelimit import redis_limiters
from examforge.settings import Settings

base_url, redis_url, tmp = sys.argv[1:4]
settings = Settings(database_url=f"sqlite:///{tmp}/w.db", broker_url=redis_url, exams_dir=tmp,
                    llm_base_url=base_url, llm_api_key="sk-test", llm_rpm=600,
                    llm_tpm=100_000)
client = LLMClient(settings, limiters=redis_limiters(redis_url))
try:
    client.complete(json.loads(sys.argv[4]), max_tokens=50)
except RateLimited as exc:
    print(json.dumps({"retry_after_s": exc.retry_after_s}))
"""


def _hold_from_another_process(base_url: str, redis_url: str, tmp_path) -> float:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [sys.executable, "-c", HOLDER, base_url, redis_url, str(tmp_path), json.dumps(MESSAGES)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return float(json.loads(out.stdout.strip().splitlines()[-1])["retry_after_s"])


@pytest.fixture
def mock_429():  # type: ignore[no-untyped-def]
    def start(retry_after_s: float) -> MockServer:
        server = MockServer(MockConfig(latency_s=0, fault_rate=1.0, faults=["429"],
                                       retry_after_s=retry_after_s, seed=1))
        server.start()
        started.append(server)
        return server

    started: list[MockServer] = []
    yield start
    for server in started:
        server.stop()


def _unlimited(make_settings, base_url: str, redis_url: str) -> LLMClient:  # type: ignore[no-untyped-def]
    """A worker with no RPM or TPM configured (and none learned: the mock's 429 fault sends
    no x-ratelimit-* headers), on the same Redis."""
    client = LLMClient(make_settings(llm_base_url=base_url, broker_url=redis_url),
                       limiters=redis_limiters(redis_url))
    assert not client._primary.limit.active
    return client


@pytest.mark.slow
def test_a_hold_outlives_60_s_for_every_worker(redis_url, make_settings, mock_429, tmp_path):
    server = mock_429(120)
    assert server.base_url is not None
    began = time.monotonic()
    assert _hold_from_another_process(server.base_url, redis_url, tmp_path) == 120
    key = limiter_key(server.base_url, "mock-model")
    r = redis.Redis.from_url(redis_url)
    # What Redis keeps of the hold lives until the hold ends: 120 s from the 429, not 60.
    assert 115_000 < max(r.pttl(k) for k in r.keys(key + "*")) <= 120_000
    hold_key = key + ":hold"
    assert 115_000 < r.pttl(hold_key) <= 120_000
    client = _unlimited(make_settings, server.base_url, redis_url)
    assert client.try_admit(MESSAGES, 50) is None
    with pytest.raises(RateLimited) as info:
        client.complete(MESSAGES, max_tokens=50,
                        admission=client.admit(MESSAGES, 50, max_wait_s=2))
    left = 120 - (time.monotonic() - began)
    assert left - 1 < info.value.retry_after_s <= 120  # told the hold's end, whoever set it
    assert server.stats()["calls_total"] == 1  # the second worker sent nothing
    # Writes to the limit's own key (another admission, a refund) do not touch the hold.
    limited = redis_limiters(redis_url)(server.base_url, "mock-model")
    limited.push_back(Limits(rpm=600), 0.5, 0.0)
    limited.hold(1.0)  # a shorter hold set meanwhile does not shorten the longer one
    assert r.pttl(hold_key) > 110_000
    client.close()
    r.delete(*r.keys(key + "*"))


@pytest.mark.large
def test_a_hold_outlives_60_s_for_every_worker_waited_out(redis_url, make_settings, mock_429,
                                                          tmp_path):
    """The same with a real wait: 65 s of Retry-After, checked at its 61st second and at its
    end (about 66 s)."""
    server = mock_429(65)
    assert server.base_url is not None
    began = time.monotonic()  # before the 429: the hold ends at least 65 s after this
    assert _hold_from_another_process(server.base_url, redis_url, tmp_path) == 65
    answered = time.monotonic()  # after it: 61 s from here is past the hold's 60th second
    client = _unlimited(make_settings, server.base_url, redis_url)
    time.sleep(61 - (time.monotonic() - answered))  # the point of the test: a minute passing
    with pytest.raises(RateLimited) as info:
        client.admit(MESSAGES, 50, max_wait_s=0.5)
    assert 0 < info.value.retry_after_s <= 4
    server.configure(fault_rate=0.0)
    admission = client.admit(MESSAGES, 50, max_wait_s=10)  # waits for the hold's end
    assert time.monotonic() - began >= 65
    client.complete(MESSAGES, max_tokens=50, admission=admission)
    stats = server.stats()
    assert stats["calls_total"] == 2 and stats["retry_after_violations"] == []
    client.close()
