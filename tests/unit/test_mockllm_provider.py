"""The mock behaves like a real provider: usage, max_tokens, the usage log, rate limits, quota,
slow and huge bodies, paraphrases and answer positions, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest

from examforge.tokens import count_messages, count_text
from helpers import wait_for
from mockllm import MockConfig, MockServer
from mockllm_support import body, chat, content, jaccard, questions, shingles

KEY = "aws-saa/ch-1"


# --------------------------------------------------------------------------- usage and max_tokens


def test_usage_is_counted_like_a_provider(server: MockServer, client: httpx.Client) -> None:
    request = body(n=4, model="gpt-4")
    reply = client.post("/chat/completions", json=request).json()
    usage = reply["usage"]
    text = reply["choices"][0]["message"]["content"]
    assert usage == {
        "prompt_tokens": count_messages(request["messages"], "gpt-4"),
        "completion_tokens": count_text(text, "gpt-4"),
        "total_tokens": count_messages(request["messages"], "gpt-4") + count_text(text, "gpt-4"),
        # OpenAI's shape: a short prompt is never cached, and says so.
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    }


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_completion_longer_than_max_tokens_is_cut_with_finish_reason_length(
    server: MockServer, client: httpx.Client, field: str
) -> None:
    full = content(chat(client, n=4))
    reply = client.post("/chat/completions", json=body(n=4, **{field: 25})).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 25
    assert count_text(choice["message"]["content"], "gpt-test") <= 25
    assert full.startswith('{"questions": [') and choice["message"]["content"].startswith('{"questions": [')
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])
    stats = server.stats()
    assert stats["cut_at_max_tokens"] == 1
    assert stats["questions_served_by_chapter"] == {KEY: 4}  # the cut reply served nothing usable


def test_a_completion_within_max_tokens_is_untouched(client: httpx.Client) -> None:
    reply = client.post("/chat/completions", json=body(n=2, max_tokens=4000)).json()
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert len(json.loads(reply["choices"][0]["message"]["content"])["questions"]) == 2


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "10"}, "max_tokens"),
     ({"max_completion_tokens": -1}, "max_completion_tokens"), ({"messages": []}, "messages"),
     ({"messages": "hi"}, "messages")],
)
def test_invalid_parameters_are_400s_like_openai(
    server: MockServer, client: httpx.Client, extra: dict[str, Any], param: str
) -> None:
    response = client.post("/chat/completions", json={**body(), **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert server.stats()["outcomes"] == {"invalid_request": 1}


def test_omit_usage_sends_replies_without_usage_but_still_bills(server: MockServer, client: httpx.Client) -> None:
    server.configure(omit_usage=True)
    reply = chat(client).json()
    assert "usage" not in reply and reply["choices"][0]["finish_reason"] == "stop"
    record = server.usage()[-1]
    assert record["billed"] and record["completion_tokens"] == count_text(
        reply["choices"][0]["message"]["content"], "gpt-test")


def test_usage_factor_reports_and_bills_more_than_the_prompt_and_max_tokens(
    server: MockServer, client: httpx.Client
) -> None:
    request = body(n=4, model="gpt-4", max_tokens=30)
    server.configure(usage_factor=3)
    reply = client.post("/chat/completions", json=request).json()
    prompt = count_messages(request["messages"], "gpt-4")
    assert reply["usage"]["prompt_tokens"] == 3 * prompt
    assert reply["usage"]["completion_tokens"] == 90  # cut at 30, reported as 3x: past max_tokens
    record = server.usage()[-1]
    assert record["billed"] and (record["prompt_tokens"], record["completion_tokens"]) == (3 * prompt, 90)


# --------------------------------------------------------------------------- the usage log


def test_usage_log_records_every_request_and_totals_what_was_billed(
    server: MockServer, client: httpx.Client
) -> None:
    server.configure(script={KEY: ["ok", "500", "malformed"]})
    replies = [chat(client, n=2) for _ in range(3)]
    client.post("/chat/completions", content=b"{oops", headers={"Content-Type": "application/json"})
    log = server.usage()
    assert [(r["status"], r["outcome"], r["billed"], r["delivered"]) for r in log] == [
        (200, "ok", True, True), (500, "500", False, True), (200, "malformed", True, True),
        (400, "invalid_request", False, True)]
    ok, failed, malformed, _ = log
    assert ok["prompt_tokens"] == replies[0].json()["usage"]["prompt_tokens"]
    assert ok["completion_tokens"] == replies[0].json()["usage"]["completion_tokens"]
    assert failed["completion_tokens"] == 0 and failed["prompt_tokens"] > 0  # counted, not billed
    assert all(r["chapter"] == KEY and r["model"] == "gpt-test" for r in log[:3])
    assert all(r["batch"] is False and r["batch_id"] is None for r in log)
    assert all(abs(r["time"] - time.time()) < 60 for r in log)
    billed = [ok, malformed]
    stats = server.stats()
    assert stats["billed_calls"] == 2
    assert stats["billed_prompt_tokens"] == sum(r["prompt_tokens"] for r in billed)
    assert stats["billed_completion_tokens"] == sum(r["completion_tokens"] for r in billed)
    assert stats["billed_tokens"] == stats["billed_prompt_tokens"] + stats["billed_completion_tokens"]
    assert stats["billed_tokens_by_chapter"] == {KEY: stats["billed_tokens"]}
    over_http = client.get("/_usage").json()
    assert over_http["data"] == log and over_http["billed_tokens"] == stats["billed_tokens"]
    server.reset()
    assert server.usage() == [] and server.stats()["billed_tokens"] == 0


def test_a_reply_the_client_hung_up_on_is_billed_but_not_delivered(server: MockServer) -> None:
    server.configure(latency_s=1.0)
    with httpx.Client(base_url=server.base_url or "", timeout=0.2) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            chat(impatient, n=3)
    record = wait_for(lambda: server.usage(), 5, "the abandoned request in the usage log")[0]
    assert record["status"] == 200 and record["billed"] and not record["delivered"]
    assert record["completion_tokens"] > 0
    stats = server.stats()
    assert stats["billed_undelivered_calls"] == 1 and stats["billed_calls"] == 1
    assert stats["questions_served_by_chapter"] == {}


def test_a_reset_connection_is_logged_without_status_or_bill(server: MockServer, client: httpx.Client) -> None:
    server.configure(script={KEY: ["reset"]})
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        chat(client)
    [record] = server.usage()
    assert record["status"] is None and not record["billed"] and not record["delivered"]


# --------------------------------------------------------------------------- rate limits


def test_every_chat_reply_carries_rate_limit_headers(server: MockServer, client: httpx.Client) -> None:
    server.configure(rpm=600, tpm=100_000)
    server.configure(script={KEY: ["ok", "503"]})
    for response in (chat(client), chat(client)):
        headers = response.headers
        assert headers["x-ratelimit-limit-requests"] == "600"
        assert headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(headers["x-ratelimit-remaining-requests"]) < 600
        assert int(headers["x-ratelimit-remaining-tokens"]) < 100_000
        assert headers["x-ratelimit-reset-requests"].endswith(("ms", "s"))
        assert headers["x-ratelimit-reset-tokens"].endswith(("ms", "s"))
        assert headers["x-request-id"].startswith("req_")


def test_no_limit_configured_means_no_rate_limit_headers(client: httpx.Client) -> None:
    assert not [name for name in chat(client).headers if name.startswith("x-ratelimit")]


def test_rpm_refusal_is_openais_429(server: MockServer, client: httpx.Client) -> None:
    server.configure(rpm=6, burst_fraction=0.01)  # a bucket of one request, one every 10 s
    assert chat(client).status_code == 200
    refused = chat(client)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded" and error["param"] is None
    assert error["message"].startswith(
        "Rate limit reached for gpt-test in organization org-mock on requests per min (RPM): Limit 6, Used 6, "
        "Requested 1. Please try again in ")
    wait_ms = int(refused.headers["retry-after-ms"])
    assert 5000 <= wait_ms <= 10_000
    assert refused.headers["retry-after"] == str(-(-wait_ms // 1000))  # whole seconds, rounded up
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    stats = server.stats()
    assert stats["outcomes"] == {"ok": 1, "rate_limited": 1}  # not the injected "429" fault
    assert stats["rate_limited_by_type"] == {"requests": 1}
    assert stats["admitted_total"] == 1
    [_, record] = server.usage()
    assert record["status"] == 429 and record["outcome"] == "rate_limited" and not record["billed"]


def test_an_early_retry_after_a_rate_limit_is_recorded(server: MockServer, client: httpx.Client) -> None:
    server.configure(rpm=6, burst_fraction=0.01)
    chat(client)
    assert chat(client).status_code == 429
    assert chat(client).status_code == 429  # at once: long before retry-after-ms
    [violation] = server.stats()["retry_after_violations"]
    assert violation["chapter"] == KEY and violation["early_by_s"] > 0.5


def test_tpm_charges_max_tokens_at_admission(server: MockServer, client: httpx.Client) -> None:
    prompt_tokens = count_messages(body()["messages"], "gpt-test")
    server.configure(tpm=6000, burst_fraction=1.0)  # 6000 tokens deep, refilled at 100 a second
    per_request = prompt_tokens + 1900
    admitted = [chat(client, max_tokens=1900).status_code for _ in range(4)]
    assert admitted == [200, 200, 200, 429]  # 3 x ~1930 fit in 6000, the fourth does not
    refused = chat(client, max_tokens=1900).json()["error"]
    assert refused["type"] == "tokens" and refused["code"] == "rate_limit_exceeded"
    assert f"Requested {per_request}." in refused["message"]
    assert server.stats()["rate_limited_by_type"] == {"tokens": 2}


def test_without_max_tokens_the_real_completion_is_charged(server: MockServer, client: httpx.Client) -> None:
    server.configure(tpm=6000, burst_fraction=1.0)  # 6000 tokens deep, 100 a second
    first = chat(client, n=10)
    spent = first.json()["usage"]["total_tokens"]
    remaining = int(first.headers["x-ratelimit-remaining-tokens"])
    assert 6000 - spent - 3 <= remaining <= 6000 - spent + 3  # refilled a little meanwhile


def test_the_completion_is_charged_before_the_next_request_is_admitted(server: MockServer) -> None:
    server.configure(latency_s=0.3, tpm=6000, burst_fraction=0.1)  # 600 tokens deep

    async def two_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url or "", timeout=10) as http:
            return list(await asyncio.gather(*(http.post("/chat/completions", json=body(n=8)) for _ in range(2))))

    statuses = sorted(r.status_code for r in asyncio.run(two_at_once()))
    # The first reply's ~1000 completion tokens were charged at its admission, while it was
    # still being "generated", so the second request found the bucket in debt (for ~4 s).
    assert statuses == [200, 429]


def test_a_request_larger_than_the_minute_is_refused_without_retry_after(
    server: MockServer, client: httpx.Client
) -> None:
    server.configure(tpm=1000)
    response = chat(client, max_tokens=5000)
    assert response.status_code == 429 and "retry-after" not in response.headers
    assert response.json()["error"]["message"].startswith("Request too large for gpt-test")
    assert server.stats()["outcomes"] == {"request_too_large": 1}


async def _hammer(base_url: str, seconds: float, workers: int = 8,
                  pause_s: float = 0.015) -> list[int]:
    """`workers` clients, each asking again `pause_s` after its last answer: some 400
    requests a second, forty times what a limit of 600 a minute admits. (Without the pause
    they asked some 1,500 a second, as fast as this process could make and answer them: 2.7 s
    of CPU for the same answers, since the bucket admits what it admits either way.)"""
    statuses: list[int] = []
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        async def worker() -> None:
            while time.monotonic() < deadline:
                statuses.append((await http.post("/chat/completions", json=body(n=1))).status_code)
                await asyncio.sleep(pause_s)

        await asyncio.gather(*(worker() for _ in range(workers)))
    return statuses


def test_600_rpm_admits_ten_a_second_with_a_small_burst(server: MockServer) -> None:
    server.configure(rpm=600)
    started = time.monotonic()
    statuses = asyncio.run(_hammer(server.base_url or "", seconds=2.5))
    elapsed = time.monotonic() - started
    stats = server.stats()
    admitted = statuses.count(200)
    # The client asked far faster than allowed: refusals kept coming beside the admissions.
    # (Its 8 clients each wait for an answer before asking again, so a loaded machine slows
    # them: 68 refusals for 84 admissions in one CI-like run, 34 for 83 in another, still
    # well over the 10 a second; the bounds below are what the limiter is held to.)
    assert statuses.count(429) >= 10
    assert admitted == stats["admitted_total"]
    assert admitted <= 60 + 10 * elapsed + 1  # never more than the burst + 10/s
    assert admitted >= 60 + 10 * (elapsed - 1.0)  # and the limiter is not stricter than that
    assert stats["max_admitted_in_1s"] <= 60 + 10 + 1
    # Once the burst is spent (it refilled a little while it was being spent), admissions come
    # one every 0.1 s, not in clumps.
    after_burst = stats["admitted_at"][62:]
    gaps = sorted(b - a for a, b in zip(after_burst, after_burst[1:]))
    # (A stalled event loop on a loaded machine lets two tokens accumulate and admits two
    # requests close together, as a token bucket should: only the median gap is checked.)
    assert len(gaps) > 5 and 0.07 <= gaps[len(gaps) // 2] <= 0.2
    assert stats["outcomes"]["rate_limited"] == statuses.count(429)


@pytest.mark.parametrize("mode", ["absent", "azure"])
def test_ratelimit_header_modes_like_gateways_and_azure(server: MockServer, client: httpx.Client, mode: str) -> None:
    server.configure(rpm=6, tpm=100_000, burst_fraction=0.01, ratelimit_headers=mode)
    ok, refused = chat(client), chat(client)
    assert refused.status_code == 429
    limit_headers = {k: v for k, v in ok.headers.items() if k.startswith("x-ratelimit")}
    if mode == "absent":
        assert limit_headers == {} and "retry-after-ms" not in refused.headers
        assert 5 <= int(refused.headers["retry-after"]) <= 10
    else:
        assert limit_headers["x-ratelimit-limit-tokens"] == "-1"
        assert limit_headers["x-ratelimit-remaining-requests"] == "-1"
        assert limit_headers["x-ratelimit-reset-tokens"] == "0"
        assert "retry-after" not in refused.headers and "retry-after-ms" not in refused.headers


def test_changing_a_limit_refills_the_buckets(server: MockServer, client: httpx.Client) -> None:
    server.configure(rpm=6, burst_fraction=0.01)
    chat(client)
    assert chat(client).status_code == 429
    server.configure(rpm=6000)
    assert chat(client).status_code == 200
    server.configure(rpm=None)
    assert all(chat(client).status_code == 200 for _ in range(5))


# --------------------------------------------------------------------------- quota


def test_exhausted_quota_is_a_429_that_waiting_cannot_fix(server: MockServer, client: httpx.Client) -> None:
    server.configure(quota_exhausted=True, rpm=600)
    response = chat(client)
    assert response.status_code == 429
    assert "retry-after" not in response.headers and "retry-after-ms" not in response.headers
    error = response.json()["error"]
    assert error["type"] == "insufficient_quota" and error["code"] == "insufficient_quota"
    assert error["message"].startswith("You exceeded your current quota, please check your plan and billing details.")
    stats = server.stats()
    assert stats["outcomes"] == {"insufficient_quota": 1}
    assert stats["admitted_total"] == 0  # refused before the rate limiter
    assert server.usage()[0]["billed"] is False


def test_the_quota_runs_out_after_quota_tokens(server: MockServer, client: httpx.Client) -> None:
    quota = 3 * chat(client, n=2).json()["usage"]["total_tokens"]
    server.reset()
    server.configure(quota_tokens=quota)
    statuses = [chat(client, n=2).status_code for _ in range(6)]
    paid = statuses.count(200)
    assert 2 <= paid <= 4 and statuses == [200] * paid + [429] * (6 - paid)
    billed = [r["prompt_tokens"] + r["completion_tokens"] for r in server.usage() if r["billed"]]
    # Every admitted call found the quota unspent; the last one overshot it, as real billing does.
    assert sum(billed[:-1]) < quota <= sum(billed)
    stats = server.stats()
    assert stats["billed_tokens"] == sum(billed)
    assert stats["outcomes"] == {"ok": paid, "insufficient_quota": 6 - paid}


# --------------------------------------------------------------------------- trickle and oversized


def _raw_request(port: int, payload: dict[str, Any], read_timeout_s: float) -> tuple[float, float, bytes]:
    """Send one request on a raw socket; (seconds to the headers, to the whole body, the body)."""
    data = json.dumps(payload).encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout_s) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head_s = time.monotonic() - started
        head, _, rest = received.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length")))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            rest += chunk
        return head_s, time.monotonic() - started, rest


def test_trickle_sends_headers_then_the_body_slowly(server: MockServer) -> None:
    server.configure(trickle_pieces=6, trickle_interval_s=0.3, script={KEY: ["trickle"]})
    head_s, total_s, raw = _raw_request(server.port, body(n=2), read_timeout_s=1.0)
    # The headers at once; then every read within the 1 s timeout, yet the body takes 1.8 s.
    assert head_s < 0.5 and total_s - head_s >= 1.7
    reply = json.loads(raw)
    assert len(json.loads(reply["choices"][0]["message"]["content"])["questions"]) == 2
    stats = server.stats()
    assert stats["outcomes"] == {"trickle": 1} and stats["questions_served_by_chapter"] == {KEY: 2}
    assert server.usage()[0]["delivered"] is True


def test_a_client_deadline_on_a_trickle_still_pays(server: MockServer) -> None:
    server.configure(trickle_pieces=20, trickle_interval_s=0.2, script={KEY: ["trickle"]})
    with httpx.Client(base_url=server.base_url or "", timeout=httpx.Timeout(5.0)) as http:
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException):
            # httpx's timeout is per read: only an overall deadline stops a trickle.
            with http.stream("POST", "/chat/completions", json=body(n=2)) as response:
                assert response.status_code == 200 and time.monotonic() - started < 1.0
                for _ in response.iter_bytes():
                    if time.monotonic() - started > 1.5:
                        raise httpx.ReadTimeout("overall deadline")
    record = wait_for(lambda: server.usage(), 6, "the trickled request in the usage log")[0]
    assert record["billed"] and not record["delivered"]


def test_oversized_is_a_valid_completion_of_the_configured_size(server: MockServer, client: httpx.Client) -> None:
    size = 2 * 1024 * 1024
    server.configure(oversized_bytes=size, script={KEY: ["oversized"]})
    response = chat(client)
    assert response.status_code == 200 and len(response.content) == size
    reply = response.json()
    assert reply["object"] == "chat.completion"
    text = reply["choices"][0]["message"]["content"]
    assert len(text) > size - 1000
    assert reply["usage"]["completion_tokens"] > size // 20
    record = server.usage()[0]
    assert record["outcome"] == "oversized" and record["billed"]
    assert record["completion_tokens"] == reply["usage"]["completion_tokens"]


def test_slow_and_huge_fault_defaults() -> None:
    config = MockConfig()
    assert (config.trickle_pieces, config.trickle_interval_s) == (60, 1.0)
    assert config.oversized_bytes == 16 * 1024 * 1024


def test_new_faults_are_drawn_at_random_when_listed(server: MockServer, client: httpx.Client) -> None:
    server.configure(fault_rate=1.0, faults=["trickle", "oversized"], trickle_pieces=2, trickle_interval_s=0.01,
                     oversized_bytes=4096, seed=5)
    for _ in range(8):
        assert chat(client).status_code == 200
    assert set(server.stats()["outcomes"]) == {"trickle", "oversized"}


# --------------------------------------------------------------------------- paraphrases and answers


def test_reword_rate_serves_that_share_of_paraphrases(server: MockServer, client: httpx.Client) -> None:
    server.configure(reword_rate=0.2)
    replies = [questions(chat(client, n=5)) for _ in range(10)]
    served = [question["question"] for reply in replies for question in reply]
    stats = server.stats()
    rewordings = stats["rewordings"]
    # None in the first reply (nothing served yet to paraphrase), then one in five.
    assert len(rewordings) == stats["rewordings_by_chapter"][KEY] == 9
    assert stats["questions_served_by_chapter"][KEY] == 50 - 9
    assert len(set(served)) == 50  # no exact duplicate: only a near-duplicate detector can tell
    first_reply = {q["question"] for q in replies[0]}
    for rewording in rewordings:
        assert rewording["chapter"] == KEY and rewording["question"] in served
        assert rewording["original"] in served and rewording["original"] != rewording["question"]
        assert isinstance(rewording["of_serial"], int)
        assert jaccard(shingles(rewording["question"]), shingles(rewording["original"])) > 0.1
    assert not first_reply & {r["question"] for r in rewordings}


def _chat_avoiding(client: httpx.Client, listed: list[str], n: int = 10) -> httpx.Response:
    request = body(n=n)
    request["messages"][-1]["content"] += "\nDo not repeat these existing questions:\n" + \
        "\n".join(f"- {text}" for text in listed)
    return client.post("/chat/completions", json=request)


def test_rewordings_favour_the_first_questions_and_spare_those_the_prompt_lists(
        server: MockServer, client: httpx.Client) -> None:
    server.configure(reword_rate=0.3, avoid_compliance=1.0)
    first = questions(chat(client, n=10))
    for _ in range(20):
        chat(client, n=10)
    unlisted = server.stats()["rewordings"]
    # Weight 1/serial: the first ten of 200 questions hold over half of the draws.
    assert sum(r["of_serial"] <= 10 for r in unlisted) > len(unlisted) / 2
    server.reset()
    listed = [q["question"] for q in first]  # serials 1-10, as stored by a client
    for _ in range(20):
        assert _chat_avoiding(client, listed).status_code == 200
    stats = server.stats()
    assert stats["rewordings"] and all(r["of_serial"] > 10 for r in stats["rewordings"])
    # The ten listed hold some 45% of the weight among the 400 served by then.
    assert stats["rewordings_avoided_by_chapter"][KEY] > 0.3 * len(stats["rewordings"])


def test_a_paraphrase_keeps_the_answer_of_its_original(server: MockServer, client: httpx.Client) -> None:
    server.configure(reword_rate=0.5)
    served: dict[str, dict[str, Any]] = {}
    for _ in range(6):
        for question in questions(chat(client, n=4)):
            served[question["question"]] = question
    for rewording in server.stats()["rewordings"]:
        paraphrase, original = served[rewording["question"]], served[rewording["original"]]
        assert paraphrase["choices"][paraphrase["answer_index"]] == original["choices"][original["answer_index"]]


def test_rewording_does_not_change_the_seeded_fault_draws() -> None:
    runs = []
    for rate in (0.0, 0.5):
        with MockServer(MockConfig(latency_s=0, fault_rate=0.5, faults=["500", "empty"], seed=4,
                                   reword_rate=rate)) as mock:
            with httpx.Client(base_url=mock.base_url or "", timeout=5) as http:
                runs.append([chat(http).status_code for _ in range(20)])
    assert runs[0] == runs[1]


def test_answer_position_puts_every_answer_there(server: MockServer, client: httpx.Client) -> None:
    spread = {q["answer_index"] for q in questions(chat(client, n=8))}
    assert spread == {0, 1, 2, 3}
    server.configure(answer_position=0)
    assert {q["answer_index"] for q in questions(chat(client, n=8))} == {0}
    with pytest.raises(ValueError):
        server.configure(answer_position=4)
