"""The Files and Batch API client speaks OpenAI's protocol (so it works against OpenAI by
configuration alone), pages the batch list newest first back to a time, and maps errors
through the chat client's table."""

from __future__ import annotations

import json

import httpx
import pytest

from examforge.batch_api import BatchAPI, sent_maybe
from examforge.errors import AuthError, ErrorKind, RetryableProviderError


def _api(make_settings, handler) -> BatchAPI:
    settings = make_settings(llm_base_url="https://api.openai.com/v1", llm_api_key="sk-real")
    return BatchAPI(settings, transport=httpx.MockTransport(handler))


def test_upload_and_create_send_what_openai_documents(make_settings):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/files":
            return httpx.Response(200, json={"id": "file-1", "object": "file"})
        return httpx.Response(200, json={"id": "batch_1", "status": "validating"})

    api = _api(make_settings, handler)
    assert api.upload("examforge-s.jsonl", b'{"custom_id": "call-1"}\n') == "file-1"
    assert api.create("file-1", {"examforge_submission": "s"})["id"] == "batch_1"
    upload, create = seen
    assert upload.method == "POST" and str(upload.url) == "https://api.openai.com/v1/files"
    assert upload.headers["authorization"] == "Bearer sk-real"
    body = upload.read()
    assert b'name="purpose"\r\n\r\nbatch' in body and b'filename="examforge-s.jsonl"' in body
    assert str(create.url) == "https://api.openai.com/v1/batches"
    assert json.loads(create.read()) == {
        "input_file_id": "file-1", "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": {"examforge_submission": "s"}}


def test_the_list_is_paged_newest_first_back_to_a_time(make_settings):
    batches = [{"id": f"b{i}", "created_at": 1000 - i} for i in range(250)]  # newest first
    asked: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        asked.append(params)
        start = 0 if "after" not in params else next(
            i for i, b in enumerate(batches) if b["id"] == params["after"]) + 1
        page = batches[start:start + int(params["limit"])]
        return httpx.Response(200, json={"object": "list", "data": page,
                                         "first_id": page[0]["id"], "last_id": page[-1]["id"],
                                         "has_more": start + len(page) < len(batches)})

    api = _api(make_settings, handler)
    found = list(api.batches_since(1000 - 180))
    assert [b["id"] for b in found] == [f"b{i}" for i in range(181)]
    assert asked == [{"limit": "100"}, {"limit": "100", "after": "b99"}]


@pytest.mark.parametrize(("status", "body", "error", "kind", "maybe"), [
    (401, {"error": {"message": "Incorrect API key provided: sk-real", "type":
                     "invalid_request_error", "code": "invalid_api_key"}},
     AuthError, ErrorKind.auth, False),
    (500, {"error": {"message": "boom", "type": "server_error"}},
     RetryableProviderError, ErrorKind.server_error, True),
])
def test_errors_go_through_the_chat_table(make_settings, status, body, error, kind, maybe):
    api = _api(make_settings, lambda r: httpx.Response(status, json=body))
    with pytest.raises(error) as info:
        api.create("file-1", {})
    assert info.value.kind is kind and sent_maybe(info.value) is maybe
    assert "sk-real" not in str(info.value)


def test_a_timeout_may_have_created_the_batch(make_settings):
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    api = _api(make_settings, handler)
    with pytest.raises(RetryableProviderError) as info:
        api.create("file-1", {})
    assert info.value.kind is ErrorKind.timeout and sent_maybe(info.value)


def test_delete_file_is_openais_delete_and_a_missing_file_counts_as_deleted(make_settings):
    seen: list[httpx.Request] = []
    replies = iter([
        httpx.Response(200, json={"id": "file-1", "object": "file", "deleted": True}),
        httpx.Response(404, json={"error": {"message": "No such File object: file-1",
                                            "type": "invalid_request_error", "param": "id",
                                            "code": None}}),
        httpx.Response(503, json={"error": {"message": "overloaded", "type": "server_error"}}),
    ])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return next(replies)

    api = _api(make_settings, handler)
    assert api.delete_file("file-1") is True
    assert api.delete_file("file-1") is False  # deleted already: gone all the same
    with pytest.raises(RetryableProviderError):  # not known to be gone: the caller stops
        api.delete_file("file-1")
    assert [(r.method, str(r.url)) for r in seen] == [
        ("DELETE", "https://api.openai.com/v1/files/file-1")] * 3
