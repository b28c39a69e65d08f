"""Request builders and text measures shared by the mock server's tests."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import httpx

WORD = re.compile(r"[a-z0-9']+")


def prompt(slug: str = "aws-saa", chapter_id: str = "ch-1", title: str = "EC2 basics", n: int = 3) -> str:
    return (
        "You write exam questions.\n"
        f"Exam: {slug}\n"
        f"Chapter id: {chapter_id}\n"
        f"Chapter title: {title}\n"
        f"Number of questions: {n}\n"
        "Answer with JSON only."
    )


def body(n: int = 3, chapter_id: str = "ch-1", slug: str = "aws-saa", model: str = "gpt-test",
         **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": prompt(slug=slug, chapter_id=chapter_id, n=n)},
        ],
        **extra,
    }


def chat(client: httpx.Client, **kwargs: Any) -> httpx.Response:
    return client.post("/chat/completions", json=body(**kwargs))


def content(response: httpx.Response) -> str:
    text: str = response.json()["choices"][0]["message"]["content"]
    return text


def questions(response: httpx.Response) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(content(response))["questions"]
    return found


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def shingles(text: str, k: int = 3) -> set[tuple[str, ...]]:
    tokens = words(text)
    return {tuple(tokens[i : i + k]) for i in range(max(1, len(tokens) - k + 1))}


def jaccard(a: set[Any], b: set[Any]) -> float:
    # The union's size from the intersection's, without making the union: the same quotient of
    # the same two integers, in half the time (the rewording test takes 720,000 of them).
    common = len(a & b)
    union = len(a) + len(b) - common
    return common / union if union else 1.0


def pairwise_jaccards(texts: list[str], k: int = 3) -> list[float]:
    sets = [shingles(t, k) for t in texts]
    return [jaccard(a, b) for a, b in itertools.combinations(sets, 2)]


# The mock with batches that finish in a few hundredths of a second (the batch tests' server).
BATCH_FAST = {"latency_s": 0, "batch_validation_s": 0.01, "batch_request_s": 0,
              "batch_finalizing_s": 0.01}
