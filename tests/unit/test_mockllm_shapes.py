"""The mock's reply shapes of issue 16, over real HTTP and through the official `openai` client:
list content, bodies cut after their headers (billed), constrained decoding under a JSON
schema, and a server that refuses json_schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from examforge.reply_schema import QuestionList, response_format
from mockllm import MockServer
from mockllm.faults import SCHEMA_PREVENTED
from mockllm_support import body

# The SDK is imported by the tests that use it, not here: this module is imported by each of
# pytest-xdist's workers when it collects the suite, and `openai` alone is 0.35 s of CPU.
if TYPE_CHECKING:
    import openai

KEY = "aws-saa/ch-1"
MESSAGES = body()["messages"]
SCHEMA = response_format("json_schema")


@pytest.fixture
def sdk(server: MockServer) -> Iterator[openai.OpenAI]:
    import openai

    with openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=20) as c:
        yield c


def test_list_content_is_text_parts_that_join_into_the_reply(server: MockServer, client: httpx.Client,
                                                             sdk: openai.OpenAI) -> None:
    server.configure(script={KEY: ["list_content", "list_content"]})
    reply = client.post("/chat/completions", json=body(n=3)).json()
    parts = reply["choices"][0]["message"]["content"]
    assert [p["type"] for p in parts] == ["text", "text"]
    text = "".join(p["text"] for p in parts)
    assert len(json.loads(text)["questions"]) == 3
    assert reply["usage"]["completion_tokens"] > 0
    # The official client reads it without complaint and hands the parts on.
    completion = sdk.chat.completions.create(model="gpt-test", messages=MESSAGES)  # type: ignore[arg-type]
    raw: Any = completion.choices[0].message.content  # typed str; the SDK does not coerce it
    assert isinstance(raw, list) and json.loads("".join(p["text"] for p in raw))["questions"]
    assert server.stats()["billed_calls"] == 2


def test_a_cut_body_closes_after_half_of_it_and_is_billed(server: MockServer, client: httpx.Client,
                                                          sdk: openai.OpenAI) -> None:
    import openai

    server.configure(script={KEY: ["cut", "cut"]})
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/chat/completions", json=body(n=3))
    with pytest.raises(openai.APIConnectionError):
        sdk.chat.completions.create(model="gpt-test", messages=MESSAGES)  # type: ignore[arg-type]
    records = server.usage()
    assert [(r["status"], r["outcome"], r["billed"], r["delivered"]) for r in records] == [
        (200, "cut", True, False)] * 2
    assert all(r["completion_tokens"] > 0 for r in records)
    stats = server.stats()
    assert stats["billed_calls"] == stats["billed_undelivered_calls"] == 2
    assert stats["questions_served_by_chapter"] == {}


def test_under_a_schema_no_fault_breaks_the_json_or_the_schema(server: MockServer, client: httpx.Client) -> None:
    faults = sorted(SCHEMA_PREVENTED)
    server.configure(script={KEY: [*faults, "500", "truncated", "short", "refusal"]})
    for _ in faults:
        reply = client.post("/chat/completions", json=body(n=3, response_format=SCHEMA)).json()
        parsed = QuestionList.model_validate_json(reply["choices"][0]["message"]["content"])
        assert len(parsed.questions) == 3
        assert all(q.difficulty is None and q.bloom is None for q in parsed.questions)
    # What a schema cannot prevent still happens.
    assert client.post("/chat/completions", json=body(n=3, response_format=SCHEMA)).status_code == 500
    cut = client.post("/chat/completions", json=body(n=3, response_format=SCHEMA)).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    short = client.post("/chat/completions", json=body(n=4, response_format=SCHEMA)).json()
    assert len(json.loads(short["choices"][0]["message"]["content"])["questions"]) == 2
    refused = client.post("/chat/completions", json=body(n=3, response_format=SCHEMA)).json()
    message = refused["choices"][0]["message"]
    assert message["content"] is None and message["refusal"]
    assert server.stats()["schema_prevented"] == len(faults)


def test_without_a_schema_the_same_faults_still_break_replies(server: MockServer, client: httpx.Client) -> None:
    server.configure(script={KEY: ["malformed", "wrong_schema"]})
    for fmt in ({"type": "json_object"}, None):
        extra: dict[str, Any] = {"response_format": fmt} if fmt else {}
        text = client.post("/chat/completions", json=body(n=3, **extra)).json()["choices"][0]["message"]["content"]
        with pytest.raises(ValueError):
            QuestionList.model_validate_json(text)
    assert server.stats()["schema_prevented"] == 0


def test_the_official_clients_own_strict_schema_is_accepted_and_parsed(sdk: openai.OpenAI) -> None:
    # The SDK derives a strict schema from the pydantic model itself: the mock takes it as
    # OpenAI does, and its reply parses into the model.
    completion = sdk.chat.completions.parse(model="gpt-test", messages=MESSAGES,  # type: ignore[arg-type]
                                            response_format=QuestionList)
    parsed = completion.choices[0].message.parsed
    assert parsed is not None and len(parsed.questions) == 3


def test_a_refusal_under_a_schema_comes_apart_as_openai_sends_it(server: MockServer,
                                                                 sdk: openai.OpenAI) -> None:
    server.configure(script={KEY: ["refusal"]})
    completion = sdk.chat.completions.parse(model="gpt-test", messages=MESSAGES,  # type: ignore[arg-type]
                                            response_format=QuestionList)
    message = completion.choices[0].message
    assert message.refusal and message.parsed is None and message.content is None


@pytest.mark.parametrize(("schema", "problem"), [
    ({"type": "object", "properties": {"questions": {"type": "array"}}, "required": ["questions"]},
     "additionalProperties"),
    ({"type": "object", "properties": {"questions": {"type": "array"}, "x": {"type": "string"}},
      "required": ["questions"], "additionalProperties": False}, "Missing 'x'"),
])
def test_a_schema_strict_mode_refuses_is_a_400_naming_response_format(
        client: httpx.Client, schema: dict[str, Any], problem: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "q", "schema": schema, "strict": True}}
    response = client.post("/chat/completions", json=body(response_format=fmt))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and problem in error["message"]


def test_refuse_json_schema_is_a_400_naming_response_format(server: MockServer, sdk: openai.OpenAI) -> None:
    import openai

    server.configure(refuse_json_schema=True)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="gpt-test", messages=MESSAGES,  # type: ignore[call-overload]
                                    response_format=SCHEMA)
    assert info.value.param == "response_format" and "response_format" in info.value.message
    # json_object is still accepted, and nothing was billed for the refusal.
    sdk.chat.completions.create(model="gpt-test", messages=MESSAGES,  # type: ignore[arg-type]
                                response_format={"type": "json_object"})
    assert server.stats()["billed_calls"] == 1
