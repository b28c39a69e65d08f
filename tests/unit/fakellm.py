"""An in-process fake provider for unit tests: an httpx.MockTransport with scripted replies."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import Counter
from typing import Callable

import httpx

_COUNT_RE = re.compile(r"^Number of questions: (\d+)$", re.M)
_CHAPTER_RE = re.compile(r"^Chapter id: (\S+)$", re.M)


def question(i: int, chapter: str = "c") -> dict[str, object]:
    return {"question": f"[{chapter}] Question number {i}?", "choices": ["a", "b", "c", "d"],
            "answer_index": i % 4, "explanation": f"because {i}"}


def reply(content: str, *, finish_reason: str = "stop", prompt_tokens: int = 100,
          completion_tokens: int = 50, status: int = 200,
          headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers, json={
        "id": "x", "object": "chat.completion", "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}})


class FakeLLM:
    """Answers each call with valid questions unless a scripted response is queued.

    `script` is a list of callables (request, wanted) -> Response, consumed in order.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.calls_by_chapter: Counter[str] = Counter()
        self.requests: list[dict[str, object]] = []
        self.script: list[Callable[[httpx.Request, int], httpx.Response]] = []
        self._serial = itertools.count(1)
        self._lock = threading.Lock()
        self.on_call: Callable[[], None] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        user = body["messages"][-1]["content"]
        wanted = int(_COUNT_RE.search(user).group(1))  # type: ignore[union-attr]
        chapter = _CHAPTER_RE.search(user).group(1)  # type: ignore[union-attr]
        with self._lock:
            self.calls += 1
            self.calls_by_chapter[chapter] += 1
            self.requests.append(body)
            scripted = self.script.pop(0) if self.script else None
        if self.on_call:
            self.on_call()
        if scripted is not None:
            return scripted(request, wanted)
        return self.valid(wanted, chapter)

    def valid(self, wanted: int, chapter: str = "c") -> httpx.Response:
        items = [question(next(self._serial), chapter) for _ in range(wanted)]
        return reply(json.dumps({"questions": items}))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)
