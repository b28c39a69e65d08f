"""The mock's HTTP application: routes, control endpoints and chat completions."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from mockllm.config import MockConfig
from mockllm.faults import AUTH_FAILED, ERROR_FAULTS, INVALID_REQUEST, MODEL_ID
from mockllm.http import HttpError, Connection, Request, Response, error_response, json_response
from mockllm.prompt import UNKNOWN_CHAPTER, ChatPrompt, parse_prompt
from mockllm.replies import completion_payload, render_content, question_count, retry_after_seconds, Content
from mockllm.state import MockState

LISTEN_BACKLOG = 1024

Handler = Callable[[Connection, Request], Awaitable[bool]]


class MockService:
    """The mock's HTTP application plus its listening socket."""

    def __init__(self, config: MockConfig) -> None:
        self.state = MockState(config)
        self._connections: set[Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        # Paths are matched without their optional "/v1" prefix, so clients can
        # reach everything, control endpoints included, from the base URL.
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/chat/completions"): self._chat_completions,
            ("GET", "/models"): self._simple(self._models),
            ("GET", "/_stats"): self._simple(self._stats),
            ("POST", "/_reset"): self._simple(self._reset),
            ("POST", "/_config"): self._simple(self._set_config),
            ("GET", "/_config"): self._simple(self._get_config),
        }

    async def listen(self, host: str, port: int) -> int:
        """Start accepting connections; return the bound port."""
        self._server = await asyncio.start_server(self._serve_connection, host, port, backlog=LISTEN_BACKLOG)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        # Let handlers see their closed transport and return: a handler still
        # running when asyncio.run() cancels it makes Python 3.11 log a spurious
        # CancelledError traceback from StreamReaderProtocol.
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(reader, writer)
        handler = asyncio.current_task()
        self._connections.add(connection)
        if handler is not None:
            self._handlers.add(handler)
        try:
            while True:
                try:
                    request = await connection.read_request()
                except HttpError as exc:
                    await connection.send(error_response(exc.status, exc.message, "invalid_request_error"), False)
                    return
                if request is None or not await self._dispatch(connection, request):
                    return
        except ConnectionError:
            pass
        finally:
            self._connections.discard(connection)
            self._handlers.discard(handler)  # type: ignore[arg-type]
            connection.close()

    async def _dispatch(self, connection: Connection, request: Request) -> bool:
        path = request.path.removeprefix("/v1") if request.path.startswith("/v1/") else request.path
        handler = self._routes.get((request.method, path))
        if handler is not None:
            return await handler(connection, request)
        if any(route_path == path for _, route_path in self._routes):
            response = error_response(405, f"method {request.method} not allowed", "invalid_request_error")
        else:
            response = error_response(404, f"unknown path {request.path}", "invalid_request_error")
        return await connection.send(response, request.keep_alive) and request.keep_alive

    @staticmethod
    def _simple(handler: Callable[[Request], Response]) -> Handler:
        """Adapt a request -> response function to the connection-level handler shape."""

        async def run(connection: Connection, request: Request) -> bool:
            return await connection.send(handler(request), request.keep_alive) and request.keep_alive

        return run

    # ---- control endpoints

    def _models(self, _request: Request) -> Response:
        return json_response(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

    def _stats(self, _request: Request) -> Response:
        return json_response(200, self.state.snapshot())

    def _reset(self, _request: Request) -> Response:
        self.state.reset()
        return json_response(200, {"status": "reset"})

    def _get_config(self, _request: Request) -> Response:
        return json_response(200, self.state.config.to_dict())

    def _set_config(self, request: Request) -> Response:
        try:
            updates = request.json()
            if not isinstance(updates, dict):
                raise ValueError("config body must be a JSON object")
            config = self.state.update_config(updates)
        except ValueError as exc:
            return error_response(400, str(exc), "invalid_request_error")
        return json_response(200, config.to_dict())

    # ---- chat completions

    def _authorized(self, request: Request) -> bool:
        expected = self.state.config.api_key
        return expected is None or request.headers.get("authorization", "") == f"Bearer {expected}"

    async def _chat_completions(self, connection: Connection, request: Request) -> bool:
        state = self.state
        try:
            body = request.json()
        except ValueError:
            body = None
        prompt = parse_prompt(body) if isinstance(body, dict) else None
        key = prompt.key if prompt else UNKNOWN_CHAPTER
        state.begin_call(key)
        try:
            if prompt is None:
                state.record_outcome(key, INVALID_REQUEST)
                response = error_response(400, "request body must be a JSON object", "invalid_request_error")
            elif not self._authorized(request):
                state.record_outcome(key, AUTH_FAILED)
                response = error_response(401, *ERROR_FAULTS["401"][1:])
            else:
                outcome = state.next_outcome(key)
                state.record_outcome(key, outcome)
                return await self._answer(connection, request, prompt, outcome)
            return await connection.send(response, request.keep_alive) and request.keep_alive
        finally:
            state.end_call(key)

    async def _answer(self, connection: Connection, request: Request, prompt: ChatPrompt, outcome: str) -> bool:
        config = self.state.config
        delay = config.stall_s if outcome == "stall" else config.latency_s
        if not await connection.wait_unless_closed(delay):
            return False
        if outcome == "reset":
            connection.reset()
            return False
        if outcome in ERROR_FAULTS:
            response = self._fault_error(prompt.key, outcome)
            return await connection.send(response, request.keep_alive) and request.keep_alive
        content = self._content(prompt, outcome)
        payload = completion_payload(self.state.next_completion_id(), prompt, content, len(request.body))
        delivered = await connection.send(json_response(200, payload), request.keep_alive)
        if delivered:
            self.state.record_delivery(prompt.key, content.fresh)
        return delivered and request.keep_alive

    def _fault_error(self, key: str, outcome: str) -> Response:
        status, message, error_type, code = ERROR_FAULTS[outcome]
        response = error_response(status, message, error_type, code)
        if outcome == "429":
            seconds = retry_after_seconds(self.state.config)
            response.headers["Retry-After"] = str(seconds)
            self.state.promise_retry_after(key, seconds)
        return response

    def _content(self, prompt: ChatPrompt, outcome: str) -> Content:
        state = self.state
        questions = state.mint_questions(prompt, question_count(outcome, prompt, state.config))
        variant = state.next_wrong_schema_variant() if outcome == "wrong_schema" else 0
        return render_content(outcome, questions, state.first_served.get(prompt.key), variant)
