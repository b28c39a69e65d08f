"""The mock served: ``MockServer`` in this process, its event loop in a daemon thread, and
``serve``, the ``mock-llm`` command's foreground server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from mockllm.config import MockConfig
from mockllm.service import MockService

T = TypeVar("T")


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


class MockServer:
    """In-process mock LLM server running its event loop in a daemon thread.

    >>> with MockServer(MockConfig(latency_s=0)) as server:
    ...     base_url = server.base_url  # "http://127.0.0.1:PORT/v1"
    """

    def __init__(self, config: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.base_url: str | None = None
        self._service = MockService(copy.deepcopy(config) if config else MockConfig())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Start serving and return the OpenAI base URL ``http://HOST:PORT/v1``."""
        if self._thread is not None:
            raise RuntimeError("MockServer already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run(ready, failure)), name="mockllm", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("mock LLM server did not start within 10 s")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        self.base_url = f"http://{_client_host(self.host)}:{self.port}/v1"
        return self.base_url

    async def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        try:
            await self._service.warm_up()
            self.port = await self._service.listen(self.host, self.port)
        except BaseException as exc:  # handed to the starting thread, which re-raises it
            failure.append(exc)
            ready.set()
            return
        ready.set()
        await self._stop_event.wait()
        await self._service.close()

    def stop(self) -> None:
        """Stop serving and join the server thread (idempotent)."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop_event is not None:
            with contextlib.suppress(RuntimeError):  # loop already gone
                self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def _on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the server loop, since the state is not thread-safe."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return fn(*args)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(timeout=10)

    def stats(self) -> dict[str, Any]:
        """Same document as ``GET /_stats``."""
        return self._on_loop(self._service.state.snapshot)

    def usage(self) -> list[dict[str, Any]]:
        """The usage log, same records as ``GET /_usage``: one per chat request, oldest first."""
        return self._on_loop(self._service.state.usage.to_list)

    def reset(self) -> None:
        """Same as ``POST /_reset``: zero stats, usage log and buckets, clear scripts, re-seed."""
        self._on_loop(self._service.state.reset)

    def seed_batches(self, count: int) -> list[dict[str, Any]]:
        """Same as ``POST /_batches/seed``: ``count`` finished batches of another client
        (metadata ``{"owner": "someone-else"}``), created now, so they list first."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("count must be an integer >= 0")
        return self._on_loop(lambda: [batch.to_dict() for batch in self._service.batches.seed(count)])

    def configure(self, **fields: Any) -> MockConfig:
        """Same as ``POST /_config``; raises ValueError on unknown fields or bad values.

        ``script`` replaces the whole script; passing ``seed`` (even unchanged)
        restarts the fault draws from that seed.
        """
        return copy.deepcopy(self._on_loop(self._service.state.update_config, fields))

    @property
    def config(self) -> MockConfig:
        """A copy of the current config."""
        return self._on_loop(lambda: copy.deepcopy(self._service.state.config))

    def __enter__(self) -> MockServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def serve(host: str, port: int, config: MockConfig) -> int:
    """The ``mock-llm`` command: serve in the foreground until SIGTERM/SIGINT, then exit 0;
    1 (one line) if the address cannot be bound."""
    try:
        asyncio.run(_serve_until_signalled(MockService(config), host, port))
    except KeyboardInterrupt:  # a signal that beat the handler installation
        pass
    except OSError as exc:
        sys.stderr.write(f"mock-llm: cannot listen on {host}:{port}: {exc}\n")
        return 1
    return 0


async def _serve_until_signalled(service: MockService, host: str, port: int,
                                 listening: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT. `listening(port)` is told the bound port (default: the
    command's line on stdout; the tests' forked mocks send it to their parent)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    await service.warm_up()
    bound_port = await service.listen(host, port)
    if listening is not None:
        listening(bound_port)
    else:
        print(f"mock-llm listening on http://{host}:{bound_port}/v1", flush=True)
    await stop.wait()
    await service.close()
