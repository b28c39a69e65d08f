"""The API app in-process (FastAPI's TestClient) on SQLite, working in --local mode against
the in-process mock: `from api_support import api`."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from fastapi.testclient import TestClient

TOKEN = "unit-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYLLABUS = {"title": "Demo", "chapters": [{"id": "a", "title": "A", "questions": 6},
                                          {"id": "b", "title": "B", "questions": 4}]}


@contextlib.contextmanager
def api(make_settings: Any, mock_llm: Any = None, *, no_auth: bool = False,
        **overrides: Any) -> Iterator[TestClient]:
    from producer.api import create_app

    settings = make_settings(**{
        "api_tokens": TOKEN, "api_sse_poll_s": 0.05, "api_sse_heartbeat_s": 0.2,
        "llm_base_url": mock_llm.base_url if mock_llm else "http://mock.invalid/v1",
        **overrides})
    app = create_app(settings, local=True, no_auth=no_auth)
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers.update(AUTH)
        yield client


def wait_run(client: TestClient, run_id: int, timeout_s: float = 30) -> dict[str, Any]:
    from helpers import wait_for

    def ended() -> dict[str, Any] | None:
        view = client.get(f"/runs/{run_id}").json()
        return view if view["state"] not in ("queued", "running") else None

    return wait_for(ended, timeout_s, f"run {run_id} to end", interval_s=0.05)
