"""The mock against the official `openai` client: if the SDK reads it, so will real code."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from examforge.tokens import count_messages, count_text
from helpers import wait_for
from mockllm import MockConfig, MockServer
from mockllm.usage import UsageLog, UsageRecord
from mockllm_support import body, prompt

# The SDK is imported by the tests that use it, not here: this module is imported by each of
# pytest-xdist's workers when it collects the suite, and `openai` alone is 0.35 s of CPU.
if TYPE_CHECKING:
    import openai

MODEL = "gpt-test"
MESSAGES = body()["messages"]


@pytest.fixture
def server() -> Iterator[MockServer]:
    config = MockConfig(latency_s=0, api_key="sk-test", batch_validation_s=0.01, batch_request_s=0,
                        batch_finalizing_s=0.01)
    with MockServer(config) as mock:
        yield mock


@pytest.fixture
def client(server: MockServer) -> Iterator[openai.OpenAI]:
    import openai

    # max_retries=0: a retrying SDK would hide every 429 and 5xx the test wants to see.
    with openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=20) as sdk:
        yield sdk


def test_chat_completion_with_parsed_usage(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    assert completion.model == MODEL and completion.id.startswith("chatcmpl-")
    text = choice.message.content or ""
    assert len(json.loads(text)["questions"]) == 3
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == count_messages(MESSAGES, MODEL)
    assert completion.usage.completion_tokens == count_text(text, MODEL)
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_max_tokens_cut_is_a_length_finish(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)  # type: ignore[arg-type]
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 10


def test_raw_response_exposes_rate_limit_headers(server: MockServer, client: openai.OpenAI) -> None:
    server.configure(rpm=600, tpm=200_000)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert raw.headers["x-ratelimit-limit-requests"] == "600"
    assert raw.headers["x-ratelimit-limit-tokens"] == "200000"
    # One request of a 60-deep bucket (scaled to the minute: 590 of 600), refilled for 100 ms
    # at most; the bucket refills while the reply is built, so allow a little of that.
    assert 585 <= int(raw.headers["x-ratelimit-remaining-requests"]) <= 599
    reset = raw.headers["x-ratelimit-reset-requests"]
    assert reset.endswith("ms") and 50 <= int(reset.removesuffix("ms")) <= 100
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 200_000
    assert raw.parse().choices[0].finish_reason == "stop"


def test_a_rate_limit_raises_rate_limit_error(server: MockServer, client: openai.OpenAI) -> None:
    import openai

    server.configure(rpm=6, burst_fraction=0.01)  # one request, then one every 10 s
    client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as excinfo:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    error = excinfo.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded" and error.type == "requests"
    assert "Rate limit reached for gpt-test" in error.message
    assert 0 < int(error.response.headers["retry-after-ms"]) <= 10_000
    assert server.stats()["outcomes"] == {"ok": 1, "rate_limited": 1}


def test_an_exhausted_quota_raises_rate_limit_error_with_insufficient_quota(
    server: MockServer, client: openai.OpenAI
) -> None:
    import openai

    server.configure(quota_exhausted=True)
    with pytest.raises(openai.RateLimitError) as excinfo:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert excinfo.value.code == "insufficient_quota" and excinfo.value.type == "insufficient_quota"
    assert "retry-after" not in excinfo.value.response.headers


def test_flex_through_the_client_reports_its_tier_and_its_unbilled_429(server: MockServer,
                                                                       client: openai.OpenAI) -> None:
    import openai

    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="flex")  # type: ignore[arg-type]
    assert completion.service_tier == "flex"
    assert client.chat.completions.create(model=MODEL, messages=MESSAGES).service_tier == "default"  # type: ignore[arg-type]
    server.configure(flex_unavailable_rate=1.0)
    with pytest.raises(openai.RateLimitError) as excinfo:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="flex")  # type: ignore[arg-type]
    assert excinfo.value.code == "resource_unavailable" and "429 - Resource unavailable" in excinfo.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="fast")  # type: ignore[arg-type]
    assert bad.value.param == "service_tier"
    assert [r["billed"] for r in server.usage()] == [True, True, False, False]


def test_a_wrong_key_raises_authentication_error(server: MockServer) -> None:
    import openai

    with openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError):
            sdk.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]


def test_files_and_batches_round_trip(server: MockServer, client: openai.OpenAI) -> None:
    import openai

    requests = {
        f"q-{i}": {"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": MODEL, "max_tokens": 4000,
                            "messages": [{"role": "user", "content": prompt(chapter_id=f"ch-{i}", n=2)}]}}
        for i in range(6)
    }
    content = "".join(json.dumps(line) + "\n" for line in requests.values()).encode()
    uploaded = client.files.create(file=("requests.jsonl", content), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(content)
    assert client.files.retrieve(uploaded.id).filename == "requests.jsonl"
    assert client.files.content(uploaded.id).read() == content

    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"intent": "run-1"})
    assert batch.status == "validating" and batch.metadata == {"intent": "run-1"}
    done = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b, 20,
                    "the batch to complete", interval_s=0.02)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 6, 0)
    assert done.output_file_id and done.error_file_id is None
    lines = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in lines] != list(requests)  # order differs: match by custom_id
    by_id = {line["custom_id"]: line for line in lines}
    assert set(by_id) == set(requests)
    for custom_id, line in by_id.items():
        reply = line["response"]["body"]
        chapter = requests[custom_id]["body"]["messages"][0]["content"].split("Chapter id: ")[1].split()[0]
        assert all(isinstance(q["question"], str) for q in json.loads(reply["choices"][0]["message"]["content"])[
            "questions"])
        assert any(r["custom_id"] == custom_id and r["chapter"] == f"aws-saa/{chapter}" for r in server.usage())
    assert [b.id for b in client.batches.list(limit=10)] == [batch.id]
    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded.id, "file", True)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    # A create naming a deleted file is refused: no batch is made (a late create cannot run).
    with pytest.raises(openai.NotFoundError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert refused.value.body["param"] == "input_file_id"  # type: ignore[index]
    assert [b.id for b in client.batches.list(limit=10)] == [batch.id]
    with pytest.raises(openai.NotFoundError):
        client.files.delete(uploaded.id)


def test_cancelling_a_batch_with_the_client(server: MockServer, client: openai.OpenAI) -> None:
    import openai

    server.configure(batch_validation_s=2)
    uploaded = client.files.create(file=("r.jsonl", (json.dumps(
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body()}) + "\n").encode()),
        purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert client.batches.cancel(batch.id).status == "cancelling"
    started = time.monotonic()
    wait_for(lambda: client.batches.retrieve(batch.id).status == "cancelled", 10, "cancelled", interval_s=0.02)
    assert time.monotonic() - started < 1.5  # the cancel cut validation short
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def mock_usage(server: MockServer) -> UsageLog:
    """The mock's usage log, as its /_usage endpoint gives it."""
    log = UsageLog()
    for record in httpx.get(f"{server.base_url}/_usage").json()["data"]:
        log.add(UsageRecord.from_dict(record))
    return log


def _long_request(head: str, tail: str, model: str = "gpt-4o") -> dict[str, Any]:
    """A chat request whose user message is `head` (the shared part) then `tail`."""
    return {"model": model, "messages": [
        {"role": "system", "content": "You write exam questions."},
        {"role": "user", "content": f"{head}\nExam: aws-saa\nChapter id: ch-1\n{tail}\n"
                                    "Number of questions: 2"}]}


def test_a_repeated_long_prefix_comes_back_cached_like_openai(
        server: MockServer, client: openai.OpenAI) -> None:
    """Prompts of 1024 tokens or more that share a prefix seen recently: the shared part is
    reported cached in 128-token steps, per model, read by the official client's types."""
    from examforge.tokens import count_messages
    from mockllm.cache import INCREMENT, MIN_TOKENS, prompt_token_ids

    head = " ".join(f"fact{i}" for i in range(1500))  # well over 1024 tokens
    first = _long_request(head, "Variant one.")
    second = _long_request(head, "Variant two, a different ending.")
    usage = client.chat.completions.create(**first).usage
    assert usage is not None and usage.prompt_tokens > MIN_TOKENS
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0  # nothing seen yet
    usage = client.chat.completions.create(**second).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    # The identical prefix, in whole 128-token steps past the first 1024.
    a, b = (prompt_token_ids(r["messages"], "gpt-4o") for r in (first, second))
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert cached == MIN_TOKENS + (shared - MIN_TOKENS) // INCREMENT * INCREMENT
    assert 0 < cached < usage.prompt_tokens == count_messages(second["messages"], "gpt-4o")
    # The same prompt again: all of it up to its last whole step.
    again = client.chat.completions.create(**second).usage
    assert again is not None and again.prompt_tokens_details is not None
    assert again.prompt_tokens_details.cached_tokens >= cached
    # Another model has a cache of its own.
    other = client.chat.completions.create(**_long_request(head, "Variant two, a different ending.",
                                                           model="gpt-4.1")).usage
    assert other is not None and other.prompt_tokens_details is not None
    assert other.prompt_tokens_details.cached_tokens == 0
    # The mock's log and its bill price the cached tokens apart.
    log = mock_usage(server)
    records = [r for r in log.records if r.billed]
    assert [r.cached_tokens for r in records] == [0, cached, again.prompt_tokens_details.cached_tokens,
                                                  0]
    assert log.totals()["billed_cached_tokens"] == sum(r.cached_tokens for r in records)
    full, discounted = log.bill_usd(2.0, 8.0, 2.0), log.bill_usd(2.0, 8.0, 0.5)
    assert full - discounted == pytest.approx(sum(r.cached_tokens for r in records) * 1.5 / 1e6)


def test_the_prompt_cache_can_be_turned_off(server: MockServer, client: openai.OpenAI) -> None:
    httpx.post(f"{server.base_url}/_config", json={"prompt_cache": False}).raise_for_status()
    head = " ".join(f"fact{i}" for i in range(1500))
    for _ in range(2):
        usage = client.chat.completions.create(**_long_request(head, "Same.")).usage
        assert usage is not None and usage.prompt_tokens_details is None
