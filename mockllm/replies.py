"""Reply bodies: the content of each outcome and the OpenAI envelope around it."""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from mockllm.config import MockConfig
from mockllm.faults import OK
from mockllm.prompt import ChatPrompt

MALFORMED_CONTENT = 'Sure! Here are your questions: {"questions": ['
REFUSAL_CONTENT = "I'm sorry, but I can't help with that."


def make_question(chapter_id: str, title: str, serial: int) -> dict[str, Any]:
    """Build one well-formed question; ``serial`` makes its text unique within the chapter."""
    answer_index = serial % 4
    return {
        "question": f"[{chapter_id} #{serial}] Which statement about {title} is correct? (variant {serial})",
        "choices": [f"Statement {letter} about {title} (variant {serial})" for letter in "ABCD"],
        "answer_index": answer_index,
        "explanation": f"Statement {'ABCD'[answer_index]} is the correct one for variant {serial}.",
    }


def _dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False)


def question_count(outcome: str, prompt: ChatPrompt, config: MockConfig) -> int:
    count = prompt.count
    if config.questions_per_reply is not None:
        count = min(count, config.questions_per_reply)
    if outcome == "short":
        # Halving the capped count keeps "short" strictly shorter than a normal reply.
        return max(0, count // 2)
    return count


@dataclass
class Content:
    text: str
    finish_reason: str
    # Well-formed, never-served-before questions a correct client may keep.
    fresh: list[dict[str, Any]]


def render_content(
    outcome: str, questions: list[dict[str, Any]], earlier: dict[str, Any] | None, variant: int
) -> Content:
    """Turn freshly minted questions into the reply content for ``outcome``."""
    if outcome in (OK, "stall", "short"):
        return Content(_dumps({"questions": questions}), "stop", questions)
    if outcome == "fenced":
        return Content(f"```json\n{_dumps({'questions': questions})}\n```", "stop", questions)
    if outcome == "malformed":
        return Content(MALFORMED_CONTENT, "stop", [])
    if outcome == "truncated":
        full = _dumps({"questions": questions})
        return Content(full[: len(full) // 2], "length", [])
    if outcome == "wrong_schema":
        # Alternate between the two schema mistakes models actually make.
        if variant % 2 == 0:
            return Content(_dumps({"items": questions}), "stop", [])
        stripped = [{k: v for k, v in q.items() if k != "answer_index"} for q in questions]
        return Content(_dumps({"questions": stripped}), "stop", [])
    if outcome in ("bad_choices", "bad_index"):
        broken = copy.deepcopy(questions) or [make_question("broken", "nothing", 0)]
        if outcome == "bad_choices":
            broken[0]["choices"] = broken[0]["choices"][:3]
        else:
            broken[0]["answer_index"] = 7
        return Content(_dumps({"questions": broken}), "stop", questions[1:])
    if outcome == "refusal":
        return Content(REFUSAL_CONTENT, "stop", [])
    if outcome == "empty":
        return Content("", "stop", [])
    if outcome == "duplicate":
        return _render_duplicate(questions, earlier)
    raise ValueError(f"not an output outcome: {outcome}")


def _render_duplicate(questions: list[dict[str, Any]], earlier: dict[str, Any] | None) -> Content:
    if earlier is not None:
        reply = [copy.deepcopy(earlier), *questions[1:]]
        return Content(_dumps({"questions": reply}), "stop", questions[1:])
    # Nothing served to this chapter yet: repeat a question within the reply.
    kept = questions[: max(len(questions) - 1, 1)]
    reply = [*kept, copy.deepcopy(kept[0])] if kept else []
    return Content(_dumps({"questions": reply}), "stop", kept)


def _tokens(chars: int) -> int:
    # ~4 characters per token is the usual rule of thumb; never report 0.
    return max(1, chars // 4)


def completion_payload(completion_id: str, prompt: ChatPrompt, content: Content, request_chars: int) -> dict[str, Any]:
    """Standard ``chat.completion`` object with rough usage figures."""
    prompt_tokens = _tokens(request_chars)
    completion_tokens = _tokens(len(content.text))
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": prompt.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content.text},
                "finish_reason": content.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error_payload(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI-style error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def retry_after_seconds(config: MockConfig) -> int:
    """Value of the Retry-After header: ``retry_after_s`` rounded up, at least 1."""
    return max(1, math.ceil(config.retry_after_s))
