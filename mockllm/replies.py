"""Reply bodies: the content of each outcome and the OpenAI envelope around it.

Usage is counted the way providers count it, with examforge's tiktoken-based counter:
``prompt_tokens`` from the request's messages, ``completion_tokens`` from the content
actually sent. A completion longer than the request's ``max_tokens`` (or
``max_completion_tokens``) is cut at that many tokens with ``finish_reason: "length"``.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

from examforge.tokens import count_text, encoding_for
from mockllm.faults import OK

MALFORMED_CONTENT = 'Sure! Here are your questions: {"questions": ['
REFUSAL_CONTENT = "I'm sorry, but I can't help with that."
# What a model stuck in a loop writes; ASCII, so one character is one byte of the body.
OVERSIZED_UNIT = "The correct answer is B because B is the correct answer. "


@dataclass
class Item:
    """A question in a reply: new (``of_serial`` None) or a paraphrase of an earlier serial."""

    question: dict[str, Any]
    serial: int
    of_serial: int | None = None


@dataclass
class Content:
    text: str
    finish_reason: str
    # Well-formed, never-served-before questions a correct client may keep.
    fresh: list[Item] = field(default_factory=list)
    # Well-formed paraphrases of questions served before (near-duplicates).
    rewordings: list[Item] = field(default_factory=list)


def _dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False)


def _split(items: list[Item]) -> tuple[list[Item], list[Item]]:
    return [i for i in items if i.of_serial is None], [i for i in items if i.of_serial is not None]


def _valid(text: str, items: list[Item]) -> Content:
    fresh, rewordings = _split(items)
    return Content(text, "stop", fresh, rewordings)


def render_content(outcome: str, items: list[Item], earlier: dict[str, Any] | None, variant: int) -> Content:
    """Turn the reply's questions into the reply content for ``outcome``."""
    questions = [item.question for item in items]
    if outcome in (OK, "stall", "short", "trickle", "cut", "list_content"):
        return _valid(_dumps({"questions": questions}), items)
    if outcome == "fenced":
        return _valid(f"```json\n{_dumps({'questions': questions})}\n```", items)
    if outcome == "malformed":
        return Content(MALFORMED_CONTENT, "stop")
    if outcome == "truncated":
        full = _dumps({"questions": questions})
        return Content(full[: len(full) // 2], "length")
    if outcome == "wrong_schema":
        # Alternate between the two schema mistakes models actually make.
        if variant % 2 == 0:
            return Content(_dumps({"items": questions}), "stop")
        stripped = [{k: v for k, v in q.items() if k != "answer_index"} for q in questions]
        return Content(_dumps({"questions": stripped}), "stop")
    if outcome in ("bad_choices", "bad_index"):
        broken = copy.deepcopy(questions) or [_placeholder_question()]
        if outcome == "bad_choices":
            broken[0]["choices"] = broken[0]["choices"][:3]
        else:
            broken[0]["answer_index"] = 7
        fresh, rewordings = _split(items[1:])
        return Content(_dumps({"questions": broken}), "stop", fresh, rewordings)
    if outcome == "refusal":
        return Content(REFUSAL_CONTENT, "stop")
    if outcome == "empty":
        return Content("", "stop")
    if outcome == "duplicate":
        return _render_duplicate(items, earlier)
    raise ValueError(f"not an output outcome: {outcome}")


def _placeholder_question() -> dict[str, Any]:
    return {"question": "Which option is correct?", "choices": ["A", "B", "C", "D"], "answer_index": 0,
            "explanation": "A is correct."}


def _render_duplicate(items: list[Item], earlier: dict[str, Any] | None) -> Content:
    if earlier is not None:
        reply = [copy.deepcopy(earlier), *(item.question for item in items[1:])]
        fresh, rewordings = _split(items[1:])
        return Content(_dumps({"questions": reply}), "stop", fresh, rewordings)
    # Nothing served to this chapter yet: repeat a question within the reply.
    kept = items[: max(len(items) - 1, 1)]
    reply = [item.question for item in kept]
    if kept:
        reply.append(copy.deepcopy(kept[0].question))
    fresh, rewordings = _split(kept)
    return Content(_dumps({"questions": reply}), "stop", fresh, rewordings)


def cut_at_max_tokens(content: Content, model: str, max_tokens: int | None) -> tuple[Content, int, bool]:
    """Apply ``max_tokens`` as a provider does; return (content, completion tokens, whether cut)."""
    tokens = count_text(content.text, model)
    if max_tokens is None or tokens <= max_tokens:
        return content, tokens, False
    encoding: Any = encoding_for(model)  # tiktoken's Encoding; the Protocol declares only encode
    ids = encoding.encode(content.text, disallowed_special=())
    text = encoding.decode(ids[:max_tokens])
    return Content(text, "length"), max_tokens, True


def usage_payload(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_payload(
    completion_id: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    omit_usage: bool = False,
    service_tier: str = "default",
) -> dict[str, Any]:
    """Standard ``chat.completion`` object, with the ``service_tier`` that served it (OpenAI
    sends it on every reply: the tier used, not the one asked for)."""
    payload: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "service_tier": service_tier,
    }
    if not omit_usage:
        payload["usage"] = usage_payload(prompt_tokens, completion_tokens)
    return payload


def oversized_payload(
    completion_id: str, model: str, prompt_tokens: int, body_bytes: int, omit_usage: bool,
    service_tier: str = "default",
) -> tuple[dict[str, Any], int]:
    """A valid chat completion of exactly ``body_bytes`` bytes (as JSON) whose content is a loop.

    Its completion tokens are counted per repeated unit (counting 16 MiB with tiktoken would
    block the event loop for seconds); the figure is what the body reports and what is billed.
    """
    unit_tokens = count_text(OVERSIZED_UNIT, model)
    # Size the usage figures first: their digits are part of the body.
    estimate = body_bytes // len(OVERSIZED_UNIT) * unit_tokens
    skeleton = completion_payload(completion_id, model, "", "length", prompt_tokens, estimate, omit_usage,
                                  service_tier)
    overhead = len(json.dumps(skeleton, ensure_ascii=False).encode())
    chars = max(0, body_bytes - overhead)
    text = (OVERSIZED_UNIT * (chars // len(OVERSIZED_UNIT) + 1))[:chars]
    return completion_payload(completion_id, model, text, "length", prompt_tokens, estimate, omit_usage,
                              service_tier), estimate
