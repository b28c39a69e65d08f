"""Real `python -m producer serve` processes for the API's end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import httpx

from helpers import wait_for
from services import free_port

TOKEN = "e2e-token-1"


@dataclass
class ApiServer:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Any

    @classmethod
    def start(cls, dep: Any, *args: str, ready_path: str = "/healthz",
              **env: str) -> "ApiServer":
        port = free_port()
        log_path = dep.workdir / f"serve-{port}.log"
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "producer", "serve", "--port", str(port), *args],
            cwd=dep.workdir, env={**dep.env, "API_TOKENS": TOKEN, "API_SSE_POLL_S": "0.1",
                                  "API_SSE_HEARTBEAT_S": "0.5", **env},
            stdout=log, stderr=subprocess.STDOUT)
        dep.procs.append(proc)
        server = cls(proc, f"http://127.0.0.1:{port}", log_path)

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited {proc.returncode}: {server.log()}")
            try:
                return httpx.get(server.url + ready_path, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 30, f"serve on port {port}", interval_s=0.1)
        return server

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {TOKEN}"}, **kwargs)


def put_syllabus(client: httpx.Client, slug: str, chapters: list[tuple[str, int]]) -> None:
    body = {"title": f"Exam {slug}", "chapters": [
        {"id": cid, "title": f"Chapter {cid}", "questions": n} for cid, n in chapters]}
    r = client.put(f"/exams/{slug}", json=body)
    assert r.status_code in (200, 201), r.text


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of an open text/event-stream response, parsed, as they come; comments
    (heartbeats) as {"comment": text}."""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
        elif not line:
            if event:
                if "data" in event:
                    event["data"] = json.loads(event["data"])
                yield event
                event = {}
        else:
            name, _, value = line.partition(":")
            event[name] = value[1:] if value.startswith(" ") else value


def read_to_end(client: httpx.Client, run_id: int, last_event_id: str | None = None
                ) -> list[dict[str, Any]]:
    """Every event of the run's stream until the final one."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out = []
    with client.stream("GET", f"/runs/{run_id}/events", headers=headers) as r:
        assert r.status_code == 200, r.read()
        for e in events(r):
            if "comment" in e:
                continue
            out.append(e)
            if e["event"] != "progress":
                break
    return out
