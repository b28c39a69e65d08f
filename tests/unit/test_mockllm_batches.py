"""The mock's Files and Batch APIs, over HTTP, shaped like OpenAI's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from helpers import wait_for
from mockllm import MockConfig, MockServer
from mockllm_support import BATCH_FAST, body

FAST = BATCH_FAST


@pytest.fixture
def server() -> Iterator[MockServer]:
    with MockServer(MockConfig(**FAST)) as mock:
        yield mock


@pytest.fixture
def client(server: MockServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url or "", timeout=30) as http:
        yield http


def _line(custom_id: str, chapter: str = "ch-1", url: str = "/v1/chat/completions", **extra: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body(n=2, chapter_id=chapter, **extra)}


def _jsonl(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def _upload(client: httpx.Client, content: bytes, purpose: str = "batch", name: str = "requests.jsonl") -> httpx.Response:
    return client.post("/files", files={"file": (name, content, "application/jsonl")}, data={"purpose": purpose})


def _create(client: httpx.Client, lines: list[Any], **params: Any) -> dict[str, Any]:
    file_id = _upload(client, _jsonl(lines)).json()["id"]
    response = client.post("/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h", **params})
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


def _finished(client: httpx.Client, batch_id: str, timeout_s: float = 20) -> dict[str, Any]:
    def terminal() -> dict[str, Any] | None:
        batch: dict[str, Any] = client.get(f"/batches/{batch_id}").json()
        return batch if batch["status"] in ("completed", "failed", "expired", "cancelled") else None

    done: dict[str, Any] = wait_for(terminal, timeout_s, f"batch {batch_id} to finish", interval_s=0.02)
    return done


def _file_lines(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = client.get(f"/files/{file_id}/content")
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines()]


# --------------------------------------------------------------------------- files


def test_files_round_trip(client: httpx.Client) -> None:
    content = _jsonl([_line("a"), _line("b")])
    uploaded = _upload(client, content)
    assert uploaded.status_code == 200
    file = uploaded.json()
    assert file["object"] == "file" and file["id"].startswith("file-")
    assert file["bytes"] == len(content) and file["purpose"] == "batch" and file["filename"] == "requests.jsonl"
    assert file["status"] == "processed" and isinstance(file["created_at"], int)
    assert client.get(f"/files/{file['id']}").json() == file
    assert client.get(f"/files/{file['id']}/content").content == content
    other = _upload(client, b"notes", purpose="user_data", name="notes.txt").json()
    listing = client.get("/files").json()
    assert listing["object"] == "list" and [f["id"] for f in listing["data"]] == [other["id"], file["id"]]
    assert [f["id"] for f in client.get("/files", params={"purpose": "batch"}).json()["data"]] == [file["id"]]
    assert [f["id"] for f in client.get("/files", params={"order": "asc"}).json()["data"]] == [file["id"], other["id"]]
    page = client.get("/files", params={"limit": 1}).json()
    assert [f["id"] for f in page["data"]] == [other["id"]] and page["has_more"] is True
    rest = client.get("/files", params={"limit": 1, "after": other["id"]}).json()
    assert [f["id"] for f in rest["data"]] == [file["id"]] and rest["has_more"] is False
    assert client.delete(f"/files/{file['id']}").json() == {"id": file["id"], "object": "file", "deleted": True}
    missing = client.get(f"/files/{file['id']}")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("files", "data", "param"),
    [
        ({"file": ("r.jsonl", b"{}", "application/jsonl")}, {}, "purpose"),
        ({"file": ("r.jsonl", b"{}", "application/jsonl")}, {"purpose": "nonsense"}, "purpose"),
        ({"file": ("r.csv", b"{}", "text/csv")}, {"purpose": "batch"}, "file"),
        ({"other": ("r.jsonl", b"{}", "application/jsonl")}, {"purpose": "batch"}, "file"),
    ],
)
def test_bad_uploads_are_refused(client: httpx.Client, files: dict[str, Any], data: dict[str, str], param: str) -> None:
    response = client.post("/files", files=files, data=data)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_files_and_batches_need_the_api_key(server: MockServer, client: httpx.Client) -> None:
    server.configure(api_key="sk-test")
    assert _upload(client, b"{}").status_code == 401
    assert client.get("/batches").status_code == 401
    assert client.get("/files", headers={"Authorization": "Bearer sk-test"}).status_code == 200


# --------------------------------------------------------------------------- batches


def test_a_batch_runs_every_request_and_results_are_matched_by_custom_id(
    server: MockServer, client: httpx.Client
) -> None:
    server.configure(batch_validation_s=0.2, batch_request_s=0.05)
    ids = [f"req-{i}" for i in range(8)]
    created = _create(client, [_line(cid, chapter=f"ch-{i % 2}") for i, cid in enumerate(ids)],
                      metadata={"run": "r-1", "intent": "abc"})
    assert created["object"] == "batch" and created["id"].startswith("batch_")
    assert created["status"] == "validating" and created["metadata"] == {"run": "r-1", "intent": "abc"}
    assert created["endpoint"] == "/v1/chat/completions" and created["completion_window"] == "24h"
    assert created["expires_at"] == created["created_at"] + 24 * 3600
    wait_for(lambda: client.get(f"/batches/{created['id']}").json()["status"] == "in_progress", 10,
             "in_progress", interval_s=0.02)
    batch = _finished(client, created["id"])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert batch["in_progress_at"] and batch["finalizing_at"] and batch["completed_at"]
    assert batch["error_file_id"] is None and batch["model"] == "gpt-test"
    output = _file_lines(client, batch["output_file_id"])
    assert sorted(line["custom_id"] for line in output) == sorted(ids)
    assert [line["custom_id"] for line in output] != ids  # not in input order
    log = {r["custom_id"]: r for r in server.usage()}
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200
        completion = response["body"]
        assert completion["object"] == "chat.completion"
        record = log[line["custom_id"]]
        assert record["batch"] is True and record["batch_id"] == batch["id"] and record["billed"]
        assert record["request_id"] == response["request_id"]
        assert record["completion_tokens"] == completion["usage"]["completion_tokens"]
    usage = batch["usage"]
    assert usage["input_tokens"] == sum(r["prompt_tokens"] for r in log.values())
    assert usage["output_tokens"] == sum(r["completion_tokens"] for r in log.values())
    stats = server.stats()
    assert stats["batch_calls_total"] == 8 and stats["calls_total"] == 8
    assert stats["calls_by_chapter"] == {"aws-saa/ch-0": 4, "aws-saa/ch-1": 4}
    assert stats["billed_batch_tokens"] == stats["billed_tokens"] > 0
    assert stats["questions_served_by_chapter"] == {"aws-saa/ch-0": 8, "aws-saa/ch-1": 8}
    output_file = client.get(f"/files/{batch['output_file_id']}").json()
    assert output_file["purpose"] == "batch_output"


def test_faults_in_a_batch_land_in_the_error_file(server: MockServer, client: httpx.Client) -> None:
    server.configure(script={"aws-saa/ch-1": ["500", "ok", "malformed", "reset", "429"]})
    batch = _finished(client, _create(client, [_line(f"r{i}") for i in range(5)])["id"])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    errors = _file_lines(client, batch["error_file_id"])
    assert sorted(line["response"]["status_code"] for line in errors) == [429, 500, 500]
    assert all(line["response"]["body"]["error"]["message"] for line in errors)
    output = _file_lines(client, batch["output_file_id"])
    assert len(output) == 2  # ok and malformed are both 200s: the content is the client's problem
    assert server.stats()["outcomes"] == {"500": 1, "ok": 1, "malformed": 1, "reset": 1, "429": 1}


def test_quota_applies_to_batches(server: MockServer, client: httpx.Client) -> None:
    server.configure(quota_exhausted=True)
    batch = _finished(client, _create(client, [_line("a"), _line("b")])["id"])
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    errors = _file_lines(client, batch["error_file_id"])
    assert {line["response"]["body"]["error"]["code"] for line in errors} == {"insufficient_quota"}
    assert batch["output_file_id"] is None


def test_a_file_that_does_not_validate_fails_the_batch(server: MockServer, client: httpx.Client) -> None:
    lines = [
        _line("ok-1"),
        "{not json",
        {"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"},
        _line("wrong-url", url="/v1/embeddings"),
        _line("ok-1"),
        {"custom_id": "get", "method": "GET", "url": "/v1/chat/completions", "body": {}},
        _line("other-model", model="gpt-other"),
    ]
    batch = _finished(client, _create(client, lines)["id"])
    assert batch["status"] == "failed" and batch["failed_at"]
    assert batch["output_file_id"] is None and batch["error_file_id"] is None
    errors = [(e["code"], e["line"]) for e in batch["errors"]["data"]]
    assert errors == [("invalid_json_line", 2), ("missing_required_parameter", 3), ("url_mismatch", 4),
                      ("duplicate_custom_id", 5), ("invalid_request", 6), ("model_mismatch", 7)]
    assert all(e["message"] for e in batch["errors"]["data"])
    assert server.stats()["calls_total"] == 0  # nothing ran


def test_empty_and_oversized_files_fail(client: httpx.Client) -> None:
    empty = _finished(client, _create(client, [])["id"])
    assert [e["code"] for e in empty["errors"]["data"]] == ["empty_file"]
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}})
    content = "".join(line.replace('"x"', f'"r{i}"') + "\n" for i in range(50_001)).encode()
    file_id = _upload(client, content).json()["id"]
    created = client.post("/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h"}).json()
    too_many = _finished(client, created["id"])
    assert too_many["status"] == "failed" and too_many["errors"]["data"][0]["code"] == "too_many_tasks"


def test_the_enqueued_token_limit_fails_a_batch_after_it_was_accepted(server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_enqueued_token_limit=3000)
    created = _create(client, [_line("a", max_tokens=2000), _line("b", max_tokens=2000)])
    assert created["status"] == "validating"  # accepted first, as OpenAI does (openai-python#1643)
    batch = _finished(client, created["id"])
    assert batch["status"] == "failed"
    [error] = batch["errors"]["data"]
    assert error["code"] == "token_limit_exceeded" and "Enqueued token limit reached" in error["message"]


@pytest.mark.parametrize(
    ("params", "status", "param"),
    [
        ({"endpoint": "/v1/embeddings"}, 400, "endpoint"),
        ({"endpoint": "/v1/nowhere"}, 400, "endpoint"),
        ({"completion_window": "1h"}, 400, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, 400, "metadata"),
        ({"metadata": {"k": "v" * 513}}, 400, "metadata"),
        ({"input_file_id": "file-missing"}, 404, "input_file_id"),
        ({"input_file_id": None}, 400, "input_file_id"),
    ],
)
def test_create_checks_its_parameters(client: httpx.Client, params: dict[str, Any], status: int, param: str) -> None:
    file_id = _upload(client, _jsonl([_line("a")])).json()["id"]
    request = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **params}
    response = client.post("/batches", json=request)
    assert response.status_code == status and response.json()["error"]["param"] == param


def test_a_batch_needs_a_file_uploaded_for_batch(client: httpx.Client) -> None:
    file_id = _upload(client, b"{}", purpose="user_data", name="x.jsonl").json()["id"]
    response = client.post("/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input_file_id"


def test_sixteen_metadata_pairs_are_accepted(client: httpx.Client) -> None:
    metadata = {f"k{i}": "v" * 512 for i in range(16)}
    assert _create(client, [_line("a")], metadata=metadata)["metadata"] == metadata


def test_a_batch_that_runs_past_its_window_expires(server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_request_s=0.05, batch_expire_after_s=0.5)
    batch = _finished(client, _create(client, [_line(f"r{i}") for i in range(40)])["id"])
    assert batch["status"] == "expired" and batch["expired_at"]
    done, failed = batch["request_counts"]["completed"], batch["request_counts"]["failed"]
    assert 0 < done < 40 and done + failed == 40 == batch["request_counts"]["total"]
    output = _file_lines(client, batch["output_file_id"])
    errors = _file_lines(client, batch["error_file_id"])
    assert len(output) == done and len(errors) == failed
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    assert all(line["response"] is None for line in errors)
    assert {line["custom_id"] for line in output + errors} == {f"r{i}" for i in range(40)}


def test_cancel_stops_a_running_batch(server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_request_s=0.05)
    created = _create(client, [_line(f"r{i}") for i in range(40)])
    wait_for(lambda: client.get(f"/batches/{created['id']}").json()["request_counts"]["completed"] >= 2, 10,
             "a few requests done", interval_s=0.02)
    cancelling = client.post(f"/batches/{created['id']}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
    batch = _finished(client, created["id"])
    assert batch["status"] == "cancelled" and batch["cancelled_at"]
    counts = batch["request_counts"]
    assert 0 < counts["completed"] < 40 and counts["completed"] + counts["failed"] == 40
    errors = _file_lines(client, batch["error_file_id"])
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert len(_file_lines(client, batch["output_file_id"])) == counts["completed"]
    again = client.post(f"/batches/{created['id']}/cancel")
    assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]


def test_cancel_during_validation_runs_nothing(server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_validation_s=5)
    created = _create(client, [_line("a")])
    assert client.post(f"/batches/{created['id']}/cancel").json()["status"] == "cancelling"
    batch = _finished(client, created["id"])
    assert batch["status"] == "cancelled" and batch["output_file_id"] is None
    assert server.stats()["calls_total"] == 0


def test_batches_are_listed_newest_first_with_a_cursor(client: httpx.Client) -> None:
    ids = [_create(client, [_line("a")])["id"] for _ in range(3)]
    listing = client.get("/batches").json()
    assert listing["object"] == "list" and [b["id"] for b in listing["data"]] == ids[::-1]
    page = client.get("/batches", params={"limit": 2}).json()
    assert [b["id"] for b in page["data"]] == ids[:0:-1] and page["has_more"] is True
    assert page["first_id"] == ids[2] and page["last_id"] == ids[1]
    rest = client.get("/batches", params={"limit": 2, "after": page["last_id"]}).json()
    assert [b["id"] for b in rest["data"]] == ids[:1] and rest["has_more"] is False
    assert client.get("/batches", params={"limit": 0}).status_code == 400
    assert client.get("/batches/batch_nope").status_code == 404
