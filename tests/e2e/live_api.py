"""A real `python -m producer serve` for the page's browser test and the schemathesis run:
its own port, a token, its log in the test's directory, killed with the deployment."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import httpx

from harness import Deployment
from helpers import wait_for
from services import free_port

TOKEN = "tok-e2e-page"


@dataclass
class LiveApi:
    dep: Deployment
    proc: subprocess.Popen[bytes]
    url: str
    token: str = TOKEN

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=10)

    def log(self) -> str:
        """The tail of the server's log, for assertion messages."""
        port = self.url.rsplit(":", 1)[1]
        return (self.dep.workdir / f"serve-{port}.log").read_text(errors="replace")[-4000:]

    def put_exam(self, slug: str, chapters: list[tuple[str, int]], title: str = "Test exam") -> None:
        syllabus: dict[str, Any] = {"title": title, "chapters": [
            {"id": cid, "title": f"Chapter {cid}", "questions": n} for cid, n in chapters]}
        with self.client() as c:
            resp = c.put(f"/exams/{slug}", json=syllabus)
        assert resp.status_code in (200, 201), resp.text


def serve(dep: Deployment, *args: str, **env: str) -> LiveApi:
    """Start the server (extra CLI arguments such as --local) and wait until it answers."""
    port = free_port()
    with open(dep.workdir / f"serve-{port}.log", "wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "producer", "serve", "--host", "127.0.0.1", "--port",
             str(port), *args],
            cwd=dep.workdir, env={**dep.env, "API_TOKENS": TOKEN, **env}, stdout=log,
            stderr=subprocess.STDOUT)
    dep.procs.append(proc)
    api = LiveApi(dep, proc, f"http://127.0.0.1:{port}")

    def up() -> bool:
        assert proc.poll() is None, f"serve exited with {proc.returncode}: {api.log()}"
        try:
            return httpx.get(f"{api.url}/healthz", headers=api.headers, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, 60, f"python -m producer serve on port {port} to be healthy")
    return api
