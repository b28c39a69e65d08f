"""The mock model server in a process of its own, with MockServer's control methods.

The end-to-end tests' mock used to be a thread of the test process (MockServer). Whatever
else that process did (a CLI command run in it, the test's own polling, a garbage
collection) then shared one GIL with the server, and under a full suite's load a paid reply
could leave it past the harness's 3 s deadline: a call the test then counted as wasted.
Here each test's server is a process of its own, with its own state, and the test drives it
over its control endpoints (/_config, /_stats, /_usage, /_reset, /_batches/seed), the same
documents MockServer's methods return.

Each is forked from the tests' forkserver, which imported the server and loaded the tokenizer
once (forks.py, fork_warm.py): `python -m mockllm` would pay 0.35 s of CPU for that per test,
about 200 times a run; a fork pays a few milliseconds. The server code is the command's own
(mockllm.service.MockService, listening, stopped by SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
from multiprocessing.connection import Connection
from typing import Any

import httpx

# The tests' one forkserver (forks.py), started at the first mock or worker.
from forks import CONTEXT as _CONTEXT, ensure_server  # noqa: E402


def _serve(conn: Connection, latency_s: float) -> None:
    """The child: serve a fresh MockService on a free port as `mock-llm` does (stopped by
    SIGTERM), telling the parent the port instead of printing it."""
    from mockllm.config import MockConfig
    from mockllm.server import _serve_until_signalled
    from mockllm.service import MockService

    def listening(port: int) -> None:
        conn.send(port)
        conn.close()

    asyncio.run(_serve_until_signalled(MockService(MockConfig(latency_s=latency_s)),
                                       "127.0.0.1", 0, listening))


class MockProcess:
    """A mock server process of its own, started by `start()` and stopped by `stop()`."""

    def __init__(self, latency_s: float = 0.05) -> None:
        self.latency_s = latency_s
        self.base_url: str | None = None
        self._proc: Any = None
        self._control: httpx.Client | None = None

    def start(self) -> str:
        ensure_server()
        parent, child = _CONTEXT.Pipe(duplex=False)
        proc = _CONTEXT.Process(target=_serve, args=(child, self.latency_s), daemon=True,
                                name="mockllm")
        proc.start()
        child.close()
        self._proc = proc
        if not parent.poll(30):
            self.stop()
            raise RuntimeError("the mock server did not start within 30 s")
        try:
            port = parent.recv()
        except EOFError:
            self.stop()
            raise RuntimeError(f"the mock server exited at its start ({proc.exitcode})") from None
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._control = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        return self.base_url

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
            with contextlib.suppress(ValueError):
                self._proc.close()
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
