"""The mock's batch faults: what a client's recovery after a crash must survive.

A create whose reply is delayed or lost after the batch exists, an upload that fails, and
other clients' batches that push a client's own past the first page of ``GET /v1/batches``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from helpers import wait_for
from mockllm import MockConfig, MockServer
from mockllm_support import BATCH_FAST, body

FAST = BATCH_FAST
MARK = {"submission": "sub-1"}


@pytest.fixture
def server() -> Iterator[MockServer]:
    with MockServer(MockConfig(**FAST)) as mock:
        yield mock


@pytest.fixture
def client(server: MockServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url or "", timeout=30) as http:
        yield http


def _jsonl(custom_ids: list[str]) -> bytes:
    lines = [{"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": body(n=2)} for c in custom_ids]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _upload(client: httpx.Client, purpose: str = "batch", name: str = "requests.jsonl") -> httpx.Response:
    return client.post("/files", files={"file": (name, _jsonl(["a", "b"]), "application/jsonl")},
                       data={"purpose": purpose})


def _create_params(client: httpx.Client) -> dict[str, Any]:
    uploaded = _upload(client)
    assert uploaded.status_code == 200, uploaded.text
    return {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h", "metadata": MARK}


def _mine(client: httpx.Client) -> list[dict[str, Any]]:
    """Every batch listed with this test's metadata, paging through the whole list."""
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 100}
    while True:
        page = client.get("/batches", params=params).json()
        found += [b for b in page["data"] if b["metadata"] == MARK]
        if not page["has_more"]:
            return found
        params["after"] = page["last_id"]


def _finished(client: httpx.Client, batch_id: str) -> dict[str, Any]:
    def terminal() -> dict[str, Any] | None:
        batch: dict[str, Any] = client.get(f"/batches/{batch_id}").json()
        return batch if batch["status"] in ("completed", "failed", "expired", "cancelled") else None

    done: dict[str, Any] = wait_for(terminal, 20, f"batch {batch_id} to finish", interval_s=0.02)
    return done


def _paid_batch_lines(server: MockServer, batch_id: str) -> int:
    return sum(1 for r in server.usage() if r["batch_id"] == batch_id and r["billed"])


# --------------------------------------------------------------------------- create: delayed


def test_a_delayed_create_reply_comes_late_but_the_batch_runs_at_once(server: MockServer,
                                                                       client: httpx.Client) -> None:
    server.configure(batch_create_delay_s=1.0)
    params = _create_params(client)
    started = time.monotonic()
    reply = client.post("/batches", json=params)
    waited = time.monotonic() - started
    assert reply.status_code == 200 and waited >= 1.0
    created = reply.json()
    # The reply is the object as created; the batch meanwhile ran to the end.
    assert created["status"] == "validating" and created["metadata"] == MARK
    assert _finished(client, created["id"])["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


def test_a_client_that_gives_up_on_a_delayed_create_never_hears_of_its_batch(
        server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_create_delay_s=5.0)
    params = _create_params(client)
    with pytest.raises(httpx.ReadTimeout):
        client.post("/batches", json=params, timeout=0.3)
    # Listed and running although its creator has no id: only the metadata finds it.
    [batch] = wait_for(lambda: _mine(client) or None, 5, "the batch to be listed")
    assert _finished(client, batch["id"])["status"] == "completed"
    assert _paid_batch_lines(server, batch["id"]) == 2


# --------------------------------------------------------------------------- create: lost


def test_a_lost_create_reply_drops_the_connection_after_the_batch_exists(server: MockServer,
                                                                          client: httpx.Client) -> None:
    server.configure(batch_create_lost=1)
    params = _create_params(client)
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/batches", json=params)
    assert server.config.batch_create_lost == 0  # consumed
    assert server.stats()["batch_creates_lost"] == 1
    [lost] = _mine(client)
    assert _finished(client, lost["id"])["status"] == "completed"
    # The next create is answered: a resubmission now makes a second batch of the same lines.
    second = client.post("/batches", json=params)
    assert second.status_code == 200
    assert {b["id"] for b in _mine(client)} == {lost["id"], second.json()["id"]}


def test_a_refused_create_does_not_consume_a_lost_reply(server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_create_lost=1)
    refused = client.post("/batches", json={"input_file_id": "file-nope", "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h"})
    assert refused.status_code == 404
    assert server.config.batch_create_lost == 1
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/batches", json=_create_params(client))


# --------------------------------------------------------------------------- upload


def test_a_failed_upload_is_a_500_and_stores_nothing(server: MockServer, client: httpx.Client) -> None:
    server.configure(batch_upload_fail=2)
    # Other purposes, and uploads refused anyway, do not consume a failure.
    assert _upload(client, purpose="assistants", name="notes.jsonl").status_code == 200
    assert _upload(client, name="requests.txt").status_code == 400
    for _ in range(2):
        failed = _upload(client)
        assert failed.status_code == 500
        assert failed.json()["error"]["type"] == "server_error"
    assert client.get("/files", params={"purpose": "batch"}).json()["data"] == []
    assert server.stats()["batch_uploads_failed"] == 2
    assert _upload(client).status_code == 200
    assert len(client.get("/files", params={"purpose": "batch"}).json()["data"]) == 1


# --------------------------------------------------------------------------- other clients' batches


def test_seeded_batches_push_a_clients_own_past_the_first_page(server: MockServer, client: httpx.Client) -> None:
    own = client.post("/batches", json=_create_params(client)).json()
    seeded = client.post("/_batches/seed", json={"count": 150})
    assert seeded.status_code == 200 and len(seeded.json()["data"]) == 150
    first = client.get("/batches", params={"limit": 100}).json()
    assert len(first["data"]) == 100 and first["has_more"] is True
    assert all(b["metadata"] == {"owner": "someone-else"} for b in first["data"])
    assert first["first_id"] == seeded.json()["data"][-1]["id"]  # the newest is the last seeded
    second = client.get("/batches", params={"limit": 100, "after": first["last_id"]}).json()
    assert len(second["data"]) == 51 and second["has_more"] is False
    assert second["data"][-1]["id"] == own["id"]
    other = first["data"][0]
    assert other["status"] == "completed" and other["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert other["created_at"] >= own["created_at"] and other["completed_at"]
    assert other["usage"]["total_tokens"] == other["usage"]["input_tokens"] + other["usage"]["output_tokens"] > 0
    [line] = [json.loads(x) for x in client.get(f"/files/{other['output_file_id']}/content").text.splitlines()]
    assert line["response"]["status_code"] == 200 and line["error"] is None
    # Another client's calls are not in this client's usage log.
    _finished(client, own["id"])
    assert {r["batch_id"] for r in server.usage()} == {own["id"]}


def test_seed_batches_in_process_and_its_bad_counts(server: MockServer, client: httpx.Client) -> None:
    batches = server.seed_batches(3)
    assert [b["id"] for b in batches] == [b["id"] for b in client.get("/batches").json()["data"]][::-1]
    with pytest.raises(ValueError):
        server.seed_batches(-1)
    for bad in ({"count": -1}, {"count": "3"}, {}, [3]):
        refused = client.post("/_batches/seed", json=bad)
        assert refused.status_code == 400 and "count" in refused.json()["error"]["message"]


@pytest.mark.parametrize("field, value", [("batch_create_delay_s", -1), ("batch_create_lost", -1),
                                          ("batch_upload_fail", 1.5)])
def test_batch_fault_settings_are_validated(server: MockServer, field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        server.configure(**{field: value})
