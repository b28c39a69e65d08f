"""The mock model server in a process of its own, with MockServer's control methods.

The end-to-end tests' mock used to be a thread of the test process (MockServer). Whatever
else that process did (a CLI command run in it, the test's own polling, a garbage
collection) then shared one GIL with the server, and under a full suite's load a paid reply
could leave it past the harness's 3 s deadline: a call the test then counted as wasted.
Here the server is `python -m mockllm`, as a user runs it, and the test drives it over its
control endpoints (/_config, /_stats, /_usage, /_reset, /_batches/seed), the same documents
MockServer's methods return.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


class MockProcess:
    """`python -m mockllm --port 0`, started by `start()` and stopped by `stop()`."""

    def __init__(self, latency_s: float = 0.05) -> None:
        self.latency_s = latency_s
        self.base_url: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._control: httpx.Client | None = None
        self._lines: list[str] = []

    def start(self) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mockllm", "--host", "127.0.0.1", "--port", "0",
             "--latency-s", str(self.latency_s)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self._proc = proc
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once it listens; "" if it exited
        if "listening on " not in first:
            proc.kill()
            rest = proc.stdout.read()
            raise RuntimeError(f"mock-llm did not start: {first}{rest}")
        # Drained from now on, so that its log can never fill the pipe and stall the server.
        threading.Thread(target=self._drain, args=(proc,), daemon=True).start()
        self.base_url = first.split("listening on ", 1)[1].strip()
        self._control = httpx.Client(base_url=self.base_url.removesuffix("/v1"), timeout=10)
        return self.base_url

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.append(line)

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        assert self._control is not None, "the mock is not running"
        reply = self._control.request(method, path, json=body)
        if reply.status_code == 400:
            raise ValueError(reply.json()["error"]["message"])
        reply.raise_for_status()
        return reply.json()

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/_stats")

    def usage(self) -> list[dict[str, Any]]:
        return self._call("GET", "/_usage")["data"]

    def reset(self) -> None:
        self._call("POST", "/_reset")

    def seed_batches(self, count: int) -> list[dict[str, Any]]:
        return self._call("POST", "/_batches/seed", {"count": count})["data"]

    def configure(self, **fields: Any) -> dict[str, Any]:
        return self._call("POST", "/_config", fields)

    @property
    def config(self) -> dict[str, Any]:
        return self._call("GET", "/_config")

    def __enter__(self) -> "MockProcess":
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
