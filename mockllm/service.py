"""The mock's HTTP application: routes, control endpoints, chat completions, files and batches."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from mockllm.batches import BatchRunner
from mockllm.chat import ChatCall, ChatEngine, ChatError, Completion
from mockllm.config import MockConfig
from mockllm.faults import AUTH_FAILED, COMPLETION_OUTCOMES, ERROR_FAULTS, INVALID_REQUEST, MODEL_ID
from mockllm.files import ApiError, FileStore
from mockllm.http import (
    Connection,
    HttpError,
    Request,
    Response,
    error_payload,
    error_response,
    json_response,
    parse_multipart,
)
from mockllm.prompt import UNKNOWN_CHAPTER, parse_prompt
from mockllm.state import MockState

LISTEN_BACKLOG = 1024

Params = dict[str, str]
Handler = Callable[[Connection, Request, Params], Awaitable[bool]]
SimpleHandler = Callable[[Request, Params], Response]


def _compile(pattern: str) -> re.Pattern[str]:
    """``/files/{id}/content`` -> a regex with a named group per ``{name}``."""
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "$")


class MockService:
    """The mock's HTTP application plus its listening socket."""

    def __init__(self, config: MockConfig) -> None:
        self.state = MockState(config)
        self.engine = ChatEngine(self.state)
        self.files = FileStore()
        self.batches = BatchRunner(self.engine, self.files)
        self._connections: set[Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        simple = self._simple

        def api(handler: Callable[[Request, Params], Any]) -> Handler:
            """A JSON API endpoint: ``handler`` returns the reply's payload."""
            return simple(self._api(lambda request, params: json_response(200, handler(request, params))))

        # Paths are matched without their optional "/v1" prefix, so clients can
        # reach everything, control endpoints included, from the base URL.
        routes: list[tuple[str, str, Handler]] = [
            ("POST", "/chat/completions", self._chat_completions),
            # The key is checked here too, as OpenAI does: `producer doctor` relies on it.
            ("GET", "/models", simple(self._api(self._models))),
            ("GET", "/_stats", simple(self._stats)),
            ("GET", "/_usage", simple(self._usage)),
            ("POST", "/_reset", simple(self._reset)),
            ("POST", "/_config", simple(self._set_config)),
            ("GET", "/_config", simple(self._get_config)),
            ("POST", "/files", api(self._upload_file)),
            ("GET", "/files", api(lambda request, _: self.files.listing(request.query))),
            ("GET", "/files/{id}", api(lambda _, params: self.files.get(params["id"]).to_dict())),
            ("GET", "/files/{id}/content", simple(self._api(self._file_content))),
            ("DELETE", "/files/{id}", api(lambda _, params: self.files.delete(params["id"]))),
            ("POST", "/_batches/seed", simple(self._seed_batches)),
            ("POST", "/batches", self._create_batch),
            ("GET", "/batches", api(lambda request, _: self.batches.listing(request.query))),
            ("GET", "/batches/{id}", api(lambda _, params: self.batches.get(params["id"]).to_dict())),
            ("POST", "/batches/{id}/cancel", api(lambda _, params: self.batches.cancel(params["id"]).to_dict())),
        ]
        self._routes = [(method, _compile(path), handler) for method, path, handler in routes]

    async def warm_up(self) -> None:
        """Load the default model's tokenizer before the first request needs it."""
        await self.engine.warm_up(MODEL_ID)

    async def listen(self, host: str, port: int) -> int:
        """Start accepting connections; return the bound port."""
        self._server = await asyncio.start_server(self._serve_connection, host, port, backlog=LISTEN_BACKLOG)
        port_bound: int = self._server.sockets[0].getsockname()[1]
        return port_bound

    async def close(self) -> None:
        """Stop listening, stop running batches and close every open connection."""
        if self._server is not None:
            self._server.close()
        await self.batches.close()
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
            if handler is not None:
                self._handlers.discard(handler)
            connection.close()

    async def _dispatch(self, connection: Connection, request: Request) -> bool:
        path = request.path.removeprefix("/v1") if request.path.startswith("/v1/") else request.path
        path_known = False
        for method, pattern, handler in self._routes:
            match = pattern.match(path)
            if match is None:
                continue
            path_known = True
            if method == request.method:
                return await handler(connection, request, match.groupdict())
        if path_known:
            response = error_response(405, f"method {request.method} not allowed", "invalid_request_error")
        else:
            response = error_response(404, f"unknown path {request.path}", "invalid_request_error")
        return await connection.send(response, request.keep_alive) and request.keep_alive

    def _simple(self, handler: SimpleHandler) -> Handler:
        """Adapt a request -> response function to the connection-level handler shape."""

        async def run(connection: Connection, request: Request, params: Params) -> bool:
            return await connection.send(handler(request, params), request.keep_alive) and request.keep_alive

        return run

    def _api(self, handler: SimpleHandler) -> SimpleHandler:
        """An OpenAI API endpoint: the API key is checked, ApiError becomes its error reply."""

        def run(request: Request, params: Params) -> Response:
            if not self._authorized(request):
                return error_response(401, *ERROR_FAULTS["401"][1:])
            try:
                return handler(request, params)
            except ApiError as exc:
                return json_response(exc.status, exc.payload)

        return run

    # ---- control endpoints

    def _models(self, _request: Request, _params: Params) -> Response:
        return json_response(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

    def _stats(self, _request: Request, _params: Params) -> Response:
        return json_response(200, self.state.snapshot())

    def _usage(self, _request: Request, _params: Params) -> Response:
        return json_response(200, {"object": "list", "data": self.state.usage.to_list(),
                                   **self.state.usage.totals()})

    def _reset(self, _request: Request, _params: Params) -> Response:
        self.state.reset()
        return json_response(200, {"status": "reset"})

    def _get_config(self, _request: Request, _params: Params) -> Response:
        return json_response(200, self.state.config.to_dict())

    def _set_config(self, request: Request, _params: Params) -> Response:
        try:
            updates = request.json()
            if not isinstance(updates, dict):
                raise ValueError("config body must be a JSON object")
            config = self.state.update_config(updates)
        except ValueError as exc:
            return error_response(400, str(exc), "invalid_request_error")
        return json_response(200, config.to_dict())

    # ---- files and batches

    def _upload_file(self, request: Request, _params: Params) -> dict[str, Any]:
        try:
            fields = parse_multipart(request.body, request.headers.get("content-type", ""))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc
        filename, content = fields.get("file", (None, None))
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace").strip()
        self.files.check_upload(filename, purpose, content)  # a refused upload stays a 400
        config = self.state.config
        if purpose == "batch" and config.batch_upload_fail > 0:
            # A failure at the provider's storage: the client cannot know whether the file exists
            # (it does not), so recovery must not assume either.
            config.batch_upload_fail -= 1
            self.state.batch_uploads_failed += 1
            raise ApiError(500, ERROR_FAULTS["500"][1], error_type="server_error")
        return self.files.upload(filename, purpose, content).to_dict()

    def _file_content(self, _request: Request, params: Params) -> Response:
        return Response(200, self.files.get(params["id"]).content, content_type="application/octet-stream")

    async def _create_batch(self, connection: Connection, request: Request, _params: Params) -> bool:
        """``POST /v1/batches``. The batch exists (listed, running) before its reply is sent, so
        ``batch_create_delay_s`` and ``batch_create_lost`` leave a client that created a batch
        without knowing its id: its recovery must find the batch by listing."""
        config = self.state.config
        lost = False
        created: dict[str, Any] | None = None

        def create(request: Request, _params: Params) -> Response:
            nonlocal lost, created
            try:
                body = request.json()
            except ValueError:
                raise ApiError(400, "request body is not valid JSON") from None
            created = self.batches.create(body).to_dict()  # the object as created: 'validating'
            if config.batch_create_lost > 0:
                config.batch_create_lost -= 1
                lost = True
            return json_response(200, created)

        response = self._api(create)(request, _params)
        if created is not None and config.batch_create_delay_s > 0:
            if not await connection.wait_unless_closed(config.batch_create_delay_s):
                return False  # the client hung up: the batch runs on, unknown to it
        if lost:
            self.state.batch_creates_lost += 1
            connection.close()
            return False
        return await connection.send(response, request.keep_alive) and request.keep_alive

    def _seed_batches(self, request: Request, _params: Params) -> Response:
        """``POST /_batches/seed`` {"count": N}: N finished batches of another client, newest."""
        try:
            body = request.json()
            count = body.get("count") if isinstance(body, dict) else None
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError("count must be an integer >= 0")
        except ValueError as exc:
            return error_response(400, f"/_batches/seed: {exc}", "invalid_request_error")
        seeded = self.batches.seed(count)
        return json_response(200, {"object": "list", "data": [batch.to_dict() for batch in seeded]})

    # ---- chat completions

    def _authorized(self, request: Request) -> bool:
        expected = self.state.config.api_key
        return expected is None or request.headers.get("authorization", "") == f"Bearer {expected}"

    async def _chat_completions(self, connection: Connection, request: Request, _params: Params) -> bool:
        state = self.state
        try:
            body: Any = request.json()
        except ValueError:
            body = None
        prompt = parse_prompt(body) if isinstance(body, dict) else None
        key = prompt.key if prompt else UNKNOWN_CHAPTER
        model = prompt.model if prompt else MODEL_ID
        # Looked up on the instance at each call: the benchmark wraps these two hooks.
        state.begin_call(key, prompt.requester if prompt else key)
        try:
            return await self._chat(connection, request, body, key, model)
        finally:
            state.end_call(key)

    async def _send_error(
        self, connection: Connection, request: Request, key: str, model: str, exc: ChatError,
        call: ChatCall | None = None, headers: dict[str, str] | None = None,
    ) -> bool:
        self.state.record_outcome(key, exc.outcome)
        response = json_response(exc.status, exc.payload, {**(headers or {}), **exc.headers})
        delivered = await connection.send(response, request.keep_alive)
        self.engine.log(key, model, exc.status, exc.outcome, call=call, delivered=delivered)
        return delivered and request.keep_alive

    def _limit_headers(self, call: ChatCall) -> dict[str, str]:
        return {"x-request-id": call.request_id, **self.state.limiter.headers(self.state.config.ratelimit_headers)}

    async def _chat(self, connection: Connection, request: Request, body: Any, key: str, model: str) -> bool:
        state, engine = self.state, self.engine
        if not isinstance(body, dict):
            invalid = ChatError(400, INVALID_REQUEST, error_payload("request body must be a JSON object",
                                                                    "invalid_request_error"))
            return await self._send_error(connection, request, key, model, invalid)
        if not self._authorized(request):
            denied = ChatError(401, AUTH_FAILED, error_payload(*ERROR_FAULTS["401"][1:]))
            return await self._send_error(connection, request, key, model, denied)
        try:
            call = await engine.read(body)
        except ChatError as exc:
            return await self._send_error(connection, request, key, model, exc)
        try:
            engine.check_quota()
            engine.check_flex_capacity(call)
            engine.admit(call)
        except ChatError as exc:
            return await self._send_error(connection, request, key, model, exc, call, self._limit_headers(call))
        outcome = engine.decode(call, state.next_outcome(key))
        state.record_outcome(key, outcome)
        # Generated at admission, so a completion charged to TPM (when max_tokens is absent) is
        # charged before the next request is admitted, and billed even if the client leaves.
        completion = engine.complete(call, outcome) if outcome in COMPLETION_OUTCOMES else None
        config = state.config
        latency = state.latency(config.latency_s * (config.flex_latency_factor
                                                    if call.service_tier == "flex" else 1))
        delay = config.stall_s if outcome == "stall" else latency
        if not await connection.wait_unless_closed(delay):
            # The client hung up while the reply was being "generated": a provider bills it anyway.
            status = 200 if completion else ERROR_FAULTS[outcome][0] if outcome in ERROR_FAULTS else None
            engine.log(key, model, status, outcome, call=call, completion=completion, delivered=False)
            return False
        if outcome == "reset":
            connection.reset()
            engine.log(key, model, None, outcome, call=call, delivered=False)
            return False
        if completion is None:
            fault = engine.fault_error(call, outcome)
            response = json_response(fault.status, fault.payload, {**self._limit_headers(call), **fault.headers})
            delivered = await connection.send(response, request.keep_alive)
            engine.log(key, model, fault.status, outcome, call=call, delivered=delivered)
            return delivered and request.keep_alive
        response = json_response(200, completion.payload, self._limit_headers(call))
        if outcome == "trickle":
            delivered = await connection.trickle(
                response, request.keep_alive, config.trickle_pieces, config.trickle_interval_s)
        elif outcome == "cut":
            # Generated and billed; the client gets the headers and half the body.
            await connection.cut(response)
            delivered = False
        else:
            delivered = await connection.send(response, request.keep_alive)
        self._delivered(call, outcome, completion, delivered)
        return delivered and request.keep_alive

    def _delivered(self, call: ChatCall, outcome: str, completion: Completion, delivered: bool) -> None:
        if delivered:
            self.state.record_delivery(call.key, completion.content)
        self.engine.log(call.key, call.model, 200, outcome, call=call, completion=completion, delivered=delivered)
