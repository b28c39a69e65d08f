"""The Batch API, in memory: a JSONL file of chat requests run in the background.

A batch moves ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``, or ends
``failed`` (its file did not validate), ``expired`` (not finished within
``batch_expire_after_s``) or, after a cancel, ``cancelling`` -> ``cancelled``. Validation
reports OpenAI's error codes with the line they refer to: ``invalid_json_line``,
``missing_required_parameter``, ``invalid_request`` (a method other than POST),
``url_mismatch``, ``model_mismatch``, ``duplicate_custom_id``, ``empty_file``,
``too_many_tasks`` (more than 50,000 requests) and ``token_limit_exceeded`` (over
``batch_enqueued_token_limit``, the enqueued-token limit that makes a batch OpenAI accepted
fail afterwards). Every request goes through the same chat logic as a synchronous call
(script, faults, quota, usage log marked with the batch) except the rate limits; requests are
run, and their results written, in a shuffled order, so a client must match them by
``custom_id``. Requests not run when a batch expires or is cancelled are written to the
error file with ``batch_expired`` / ``batch_cancelled`` and counted as failed.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from examforge.tokens import count_messages
from mockllm.chat import ChatEngine, ChatError
from mockllm.faults import ERROR_FAULTS
from mockllm.files import ApiError, FileStore, list_page, parse_limit
from mockllm.http import error_payload
from mockllm.prompt import parse_prompt

CHAT_ENDPOINT = "/v1/chat/completions"
OPENAI_BATCH_ENDPOINTS = (
    "/v1/responses", CHAT_ENDPOINT, "/v1/embeddings", "/v1/completions", "/v1/moderations",
)
COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
MAX_REQUESTS = 50_000
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_REPORTED_ERRORS = 100
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
# The one request each seeded batch (another client's) ran.
SEED_MODEL = "gpt-4o-mini"
SEED_PROMPT_TOKENS = 11
SEED_COMPLETION_TOKENS = 3
_EXPIRED = ("batch_expired", "This request could not be executed before the completion window expired.")
_CANCELLED = ("batch_cancelled", "This request was not executed because the batch was cancelled.")


class BatchStatus(str, Enum):
    validating = "validating"
    failed = "failed"
    in_progress = "in_progress"
    finalizing = "finalizing"
    completed = "completed"
    expired = "expired"
    cancelling = "cancelling"
    cancelled = "cancelled"


TERMINAL = frozenset({BatchStatus.failed, BatchStatus.completed, BatchStatus.expired, BatchStatus.cancelled})


@dataclass
class _Task:
    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass
class Batch:
    id: str
    input_file_id: str
    endpoint: str
    metadata: dict[str, str] | None
    created_at: int
    created_mono: float
    status: BatchStatus = BatchStatus.validating
    timestamps: dict[str, int] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cancel_requested: bool = False

    def stamp(self, status: BatchStatus) -> None:
        self.status = status
        name = {BatchStatus.in_progress: "in_progress_at", BatchStatus.finalizing: "finalizing_at"}.get(
            status, f"{status.value}_at")
        self.timestamps[name] = int(time.time())

    def to_dict(self) -> dict[str, Any]:
        ts = self.timestamps
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": COMPLETION_WINDOW,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": ts.get("in_progress_at"),
            "expires_at": self.created_at + COMPLETION_WINDOW_S,
            "finalizing_at": ts.get("finalizing_at"),
            "completed_at": ts.get("completed_at"),
            "failed_at": ts.get("failed_at"),
            "expired_at": ts.get("expired_at"),
            "cancelling_at": ts.get("cancelling_at"),
            "cancelled_at": ts.get("cancelled_at"),
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.output_tokens,
            },
            "metadata": self.metadata,
        }


def _line_error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _validate_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ApiError(400, "Invalid type for 'metadata': expected an object.", "metadata", "invalid_type")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ApiError(400, f"Invalid 'metadata': too many properties. Expected an object with at most "
                       f"{MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} properties "
                       "instead.", "metadata", "object_above_max_properties")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise ApiError(400, f"Invalid 'metadata': key '{key[:20]}...' is longer than {MAX_METADATA_KEY} "
                           "characters.", "metadata")
        if not isinstance(value, str):
            raise ApiError(400, f"Invalid type for 'metadata.{key}': expected a string.", "metadata",
                           "invalid_type")
        if len(value) > MAX_METADATA_VALUE:
            raise ApiError(400, f"Invalid 'metadata.{key}': string too long. Expected a string with maximum "
                           f"length {MAX_METADATA_VALUE}.", "metadata", "string_above_max_length")
    return dict(metadata)


def parse_input(content: bytes, endpoint: str) -> tuple[list[_Task], list[dict[str, Any]]]:
    """The requests of a batch input file, and the validation errors OpenAI would report."""
    tasks: list[_Task] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()
    lines = content.decode("utf-8", "replace").splitlines()
    if not any(line.strip() for line in lines):
        return [], [_line_error("empty_file", "The batch input file is empty.")]
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            errors.append(_line_error("invalid_json_line", "This line is not parseable as valid JSON.", number))
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            errors.append(_line_error("invalid_json_line", "This line is not parseable as valid JSON.", number))
            continue
        if not isinstance(obj, dict):
            errors.append(_line_error("invalid_json_line", "This line is not parseable as valid JSON.", number))
            continue
        missing = [name for name in ("custom_id", "method", "url", "body") if name not in obj]
        if missing:
            errors.append(_line_error("missing_required_parameter",
                                      f"Missing required parameter: '{missing[0]}'.", number, missing[0]))
            continue
        custom_id, body = obj["custom_id"], obj["body"]
        if not isinstance(custom_id, str) or not custom_id:
            errors.append(_line_error("invalid_request", "'custom_id' must be a non-empty string.", number,
                                      "custom_id"))
            continue
        if obj["method"] != "POST":
            errors.append(_line_error("invalid_request", "The only supported method is 'POST'.", number, "method"))
            continue
        if obj["url"] != endpoint:
            errors.append(_line_error(
                "url_mismatch", f"The provided URL '{obj['url']}' does not match the batch endpoint '{endpoint}'.",
                number, "url"))
            continue
        if not isinstance(body, dict):
            errors.append(_line_error("invalid_request", "'body' must be an object.", number, "body"))
            continue
        if custom_id in seen:
            errors.append(_line_error(
                "duplicate_custom_id", f"The custom_id '{custom_id}' is duplicated; each request in a batch "
                "needs a unique custom_id.", number, "custom_id"))
            continue
        seen.add(custom_id)
        model = body.get("model")
        if isinstance(model, str):
            if models and model not in models:
                errors.append(_line_error(
                    "model_mismatch", "Every request in a batch must use the same model; this line uses "
                    f"'{model}'.", number, "body.model"))
                continue
            models.add(model)
        tasks.append(_Task(number, custom_id, body))
    if len(tasks) + len(errors) > MAX_REQUESTS:
        errors.insert(0, _line_error(
            "too_many_tasks", f"The batch contains {len(tasks) + len(errors)} requests; the limit is "
            f"{MAX_REQUESTS:,} per batch."))
    return tasks, errors


def _enqueued_tokens(tasks: list[_Task]) -> int:
    """Prompt plus max_tokens of every request, as OpenAI's enqueued-token limit counts them."""
    total = 0
    for task in tasks:
        messages = task.body.get("messages")
        model = task.body.get("model") if isinstance(task.body.get("model"), str) else "mock-model"
        if isinstance(messages, list):
            total += count_messages([m for m in messages if isinstance(m, dict)], str(model))
        limit = task.body.get("max_completion_tokens") or task.body.get("max_tokens")
        if isinstance(limit, int):
            total += limit
    return total


class BatchRunner:
    """Creates, runs, lists and cancels batches on the event loop."""

    def __init__(self, engine: ChatEngine, files: FileStore) -> None:
        self.engine = engine
        self.files = files
        self._batches: dict[str, Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._order_rng = random.Random("batch-order")

    @property
    def _config(self) -> Any:
        return self.engine.state.config

    # ---- API

    def create(self, body: Any) -> Batch:
        """``POST /v1/batches``: checks the parameters now, the file's lines while validating."""
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not body.get(name):
                raise ApiError(400, f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
        endpoint = body["endpoint"]
        if endpoint not in OPENAI_BATCH_ENDPOINTS:
            raise ApiError(400, f"Invalid value for 'endpoint': '{endpoint}' is not one of "
                           f"{', '.join(OPENAI_BATCH_ENDPOINTS)}.", "endpoint")
        if endpoint != CHAT_ENDPOINT:
            raise ApiError(400, f"The mock runs only {CHAT_ENDPOINT} batches, not {endpoint}.", "endpoint")
        if body["completion_window"] != COMPLETION_WINDOW:
            raise ApiError(400, f"Invalid value for 'completion_window': only '{COMPLETION_WINDOW}' is supported.",
                           "completion_window")
        metadata = _validate_metadata(body.get("metadata"))
        stored = self.files.find(body["input_file_id"])
        if stored is None:
            # A file never uploaded, or deleted since: refused like OpenAI, nothing created
            # (a create sent late, after its input file was deleted, cannot run).
            raise ApiError(404, f"No such File object: {body['input_file_id']}", "input_file_id")
        if stored.purpose != "batch":
            raise ApiError(400, f"The input file {stored.id} was uploaded with purpose '{stored.purpose}', "
                           "not 'batch'.", "input_file_id")
        batch = Batch(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            input_file_id=stored.id,
            endpoint=endpoint,
            metadata=metadata,
            created_at=int(time.time()),
            created_mono=time.monotonic(),
        )
        self._batches[batch.id] = batch
        task = asyncio.get_running_loop().create_task(self._run(batch, stored.content))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return batch

    def seed(self, count: int) -> list[Batch]:
        """``count`` finished batches of another client of the same organisation, created now.

        Real accounts hold other programs' batches, and ``GET /v1/batches`` cannot filter by
        metadata: these push a client's own batches past the first page, so its recovery has to
        page. Each ran one request, with real input and output files; none is in the usage log
        (it is not this client's call).
        """
        now = int(time.time())
        seeded = []
        for _ in range(count):
            batch_id = f"batch_{uuid.uuid4().hex[:24]}"
            request = {"model": SEED_MODEL, "messages": [{"role": "user", "content": "Say hello."}]}
            line = {"custom_id": "request-1", "method": "POST", "url": CHAT_ENDPOINT, "body": request}
            stored = self.files.upload("batchinput.jsonl", "batch", (json.dumps(line) + "\n").encode())
            reply = {"id": f"chatcmpl-seed{uuid.uuid4().hex[:20]}", "object": "chat.completion", "created": now,
                     "model": SEED_MODEL, "service_tier": "default",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": SEED_PROMPT_TOKENS, "completion_tokens": SEED_COMPLETION_TOKENS,
                               "total_tokens": SEED_PROMPT_TOKENS + SEED_COMPLETION_TOKENS,
                               "prompt_tokens_details": {"cached_tokens": 0}}}
            output = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": "request-1",
                      "response": {"status_code": 200, "request_id": f"req_seed{uuid.uuid4().hex[:20]}",
                                   "body": reply}, "error": None}
            batch = Batch(id=batch_id, input_file_id=stored.id, endpoint=CHAT_ENDPOINT,
                          metadata={"owner": "someone-else"}, created_at=now, created_mono=time.monotonic(),
                          total=1, completed=1, model=SEED_MODEL, input_tokens=SEED_PROMPT_TOKENS,
                          output_tokens=SEED_COMPLETION_TOKENS)
            batch.output_file_id = self.files.write_output(
                f"{batch_id}_output.jsonl", (json.dumps(output) + "\n").encode()).id
            for status in (BatchStatus.in_progress, BatchStatus.finalizing, BatchStatus.completed):
                batch.stamp(status)
            self._batches[batch_id] = batch
            seeded.append(batch)
        return seeded

    def get(self, batch_id: str) -> Batch:
        batch = self._batches.get(batch_id)
        if batch is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", "batch_id")
        return batch

    def listing(self, query: dict[str, str]) -> dict[str, Any]:
        """``GET /v1/batches`` with ``limit`` and ``after``, newest first."""
        limit = parse_limit(query.get("limit"), DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        batches = [b.to_dict() for b in reversed(list(self._batches.values()))]
        return list_page(batches, limit, query.get("after"))

    def cancel(self, batch_id: str) -> Batch:
        """``POST /v1/batches/{id}/cancel``: ``cancelling`` now, ``cancelled`` once the run stops."""
        batch = self.get(batch_id)
        if batch.status in TERMINAL or batch.status == BatchStatus.finalizing:
            raise ApiError(409, f"Cannot cancel a batch with status '{batch.status.value}'.")
        if batch.status != BatchStatus.cancelling:
            batch.cancel_requested = True
            batch.stamp(BatchStatus.cancelling)
        return batch

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)

    # ---- the run

    def _expired(self, batch: Batch) -> bool:
        limit = self._config.batch_expire_after_s
        return limit is not None and time.monotonic() - batch.created_mono >= limit

    async def _sleep_unless_stopped(self, batch: Batch, seconds: float) -> bool:
        """Sleep in small steps; False as soon as the batch is cancelled or has expired."""
        deadline = time.monotonic() + seconds
        while True:
            if batch.cancel_requested or self._expired(batch):
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            await asyncio.sleep(min(remaining, 0.05))

    async def _run(self, batch: Batch, content: bytes) -> None:
        config = self._config
        tasks, errors = parse_input(content, batch.endpoint)
        if not await self._sleep_unless_stopped(batch, config.batch_validation_s):
            # Stopped before any request ran: no files, nothing counted.
            batch.stamp(BatchStatus.cancelled if batch.cancel_requested else BatchStatus.expired)
            return
        limit = config.batch_enqueued_token_limit
        if not errors and limit is not None and (enqueued := _enqueued_tokens(tasks)) > limit:
            errors = [_line_error(
                "token_limit_exceeded", f"Enqueued token limit reached for {tasks[0].body.get('model')} in "
                f"organization org-mock. Limit: {limit:,} enqueued tokens, this batch: {enqueued:,}. Please try "
                "again once some in_progress batches have been completed.")]
        if errors:
            batch.errors = errors[:MAX_REPORTED_ERRORS]
            batch.stamp(BatchStatus.failed)
            return
        batch.total = len(tasks)
        batch.model = next((t.body["model"] for t in tasks if isinstance(t.body.get("model"), str)), None)
        batch.stamp(BatchStatus.in_progress)
        order = self._shuffled(tasks)
        outputs: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for index, task in enumerate(order):
            if batch.cancel_requested or self._expired(batch):
                self._stop_early(batch, order[index:], outputs, failures)
                return
            line, ok = await self._execute(batch, task)
            (outputs if ok else failures).append(line)
            if ok:
                batch.completed += 1
            else:
                batch.failed += 1
        batch.stamp(BatchStatus.finalizing)  # cancel() refuses a finalizing batch: every request ran
        await asyncio.sleep(config.batch_finalizing_s)
        self._write_files(batch, outputs, failures)
        batch.stamp(BatchStatus.completed)

    def _shuffled(self, tasks: list[_Task]) -> list[_Task]:
        order = list(tasks)
        self._order_rng.shuffle(order)
        if len(order) > 1 and order == tasks:
            order = order[1:] + order[:1]  # never the input order: results must be matched by custom_id
        return order

    def _stop_early(self, batch: Batch, left: list[_Task], outputs: list[dict[str, Any]],
                    failures: list[dict[str, Any]]) -> None:
        cancelled = batch.cancel_requested
        code, message = _CANCELLED if cancelled else _EXPIRED
        for task in left:
            failures.append({"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": task.custom_id,
                             "response": None, "error": {"code": code, "message": message}})
        batch.failed += len(left)
        batch.total = batch.completed + batch.failed
        self._write_files(batch, outputs, failures)
        batch.stamp(BatchStatus.cancelled if cancelled else BatchStatus.expired)

    def _write_files(self, batch: Batch, outputs: list[dict[str, Any]], failures: list[dict[str, Any]]) -> None:
        def jsonl(lines: list[dict[str, Any]]) -> bytes:
            return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()

        if outputs:
            batch.output_file_id = self.files.write_output(f"{batch.id}_output.jsonl", jsonl(outputs)).id
        if failures:
            batch.error_file_id = self.files.write_output(f"{batch.id}_error.jsonl", jsonl(failures)).id
        config = self._config
        if config.batch_output_lost > 0 and (outputs or failures):
            config.batch_output_lost -= 1
            for file_id in (batch.output_file_id, batch.error_file_id):
                if file_id is not None:
                    self.files.delete(file_id)

    async def _execute(self, batch: Batch, task: _Task) -> tuple[dict[str, Any], bool]:
        """One request of a batch through the chat logic: (its output line, whether it succeeded)."""
        engine, state = self.engine, self.engine.state
        line_id = f"batch_req_{uuid.uuid4().hex[:24]}"

        def line(status: int, body: dict[str, Any], request_id: str) -> dict[str, Any]:
            return {"id": line_id, "custom_id": task.custom_id,
                    "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None}

        try:
            call = await engine.read(task.body, batch.id, task.custom_id)
        except ChatError as exc:
            prompt = parse_prompt(task.body)
            state.begin_batch_call(prompt.key)
            state.record_outcome(prompt.key, exc.outcome)
            engine.log(prompt.key, prompt.model, exc.status, exc.outcome, delivered=True, batch_id=batch.id,
                       custom_id=task.custom_id)
            return line(exc.status, exc.payload, engine.next_request_id()), False
        key = call.key
        state.begin_batch_call(key)
        try:
            engine.check_quota()
        except ChatError as exc:
            state.record_outcome(key, exc.outcome)
            engine.log(key, call.model, exc.status, exc.outcome, call=call, delivered=True)
            return line(exc.status, exc.payload, call.request_id), False
        # A cut body is a connection's fault: a batch's output file holds the whole reply.
        outcome = engine.decode(call, state.next_outcome(key))
        state.record_outcome(key, outcome)
        await asyncio.sleep(state.config.batch_request_s)
        if outcome in ERROR_FAULTS or outcome in ("reset", "stall"):
            # A connection fault inside the provider's batch runner surfaces as a server error.
            if outcome in ERROR_FAULTS:
                status, message, error_type, code = ERROR_FAULTS[outcome]
                payload = error_payload(message, error_type, code)
            else:
                status, payload = 500, error_payload("The server had an error while processing your request.",
                                                     "server_error")
            engine.log(key, call.model, status, outcome, call=call, delivered=True)
            return line(status, payload, call.request_id), False
        completion = engine.complete(call, outcome)
        state.record_delivery(key, completion.content)
        engine.log(key, call.model, 200, outcome, call=call, completion=completion, delivered=True)
        batch.input_tokens += call.prompt_tokens
        batch.output_tokens += completion.completion_tokens
        payload = completion.payload
        if state.config.batch_usage_dropped > 0:
            state.config.batch_usage_dropped -= 1
            payload = {k: v for k, v in payload.items() if k != "usage"}
        return line(200, payload, call.request_id), True

