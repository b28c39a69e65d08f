"""The JSON schema of a reply, sent as `response_format: json_schema` (LLM_RESPONSE_FORMAT).

The schema is generated from pydantic models of the reply, in the form OpenAI's strict mode
requires (every object closed with `additionalProperties: false`, every property listed in
`required`, an optional field as a nullable one) and that constrained decoders elsewhere
(vLLM, Ollama, llama.cpp) also take: references are inlined, since some of them do not
resolve `$ref`. A schema is a guarantee of shape, not of sense: every reply is still
validated by `examforge.output.parse_questions`, which keeps the valid questions of a reply
with some invalid ones (validating with these models would refuse the whole reply).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_NAME = "exam_questions"


class QuestionItem(BaseModel):
    """One question, as the system prompt describes it."""

    model_config = ConfigDict(extra="forbid")

    question: str
    choices: list[str] = Field(min_length=4, max_length=4)
    answer_index: Literal[0, 1, 2, 3]
    explanation: str
    # Asked only when the chapter has levels (examforge.levels); null otherwise. Free text:
    # the chapter's levels are checked when the question is stored.
    difficulty: str | None
    bloom: str | None
    # The id of the course-material passage it is based on ("p3"), when the prompt offers
    # passages (examforge.sources); null otherwise.
    source: str | None


class QuestionList(BaseModel):
    """A reply: the questions object the system prompt asks for."""

    model_config = ConfigDict(extra="forbid")

    questions: list[QuestionItem]


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Schema `node` with every `$ref` to `#/$defs/...` replaced by its definition, and
    titles and descriptions dropped (providers show the schema to the model: prompt tokens).
    Key order is kept: a constrained decoder writes properties in the schema's order, and
    the question must come before its answer."""
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _inline(defs[ref.removeprefix("#/$defs/")], defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$defs", "title", "description"):
            continue
        if key == "properties":  # names of properties, not schema keywords
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _inline(value, defs)
    return out


@lru_cache(maxsize=1)
def _schema_text() -> str:
    raw = QuestionList.model_json_schema()
    return json.dumps(_inline(raw, raw.get("$defs", {})))


def reply_schema() -> dict[str, Any]:
    """The question list's JSON schema (a fresh copy)."""
    schema: dict[str, Any] = json.loads(_schema_text())
    return schema


def response_format(kind: str) -> dict[str, Any] | None:
    """The `response_format` field of a request for LLM_RESPONSE_FORMAT `kind`."""
    if kind == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": reply_schema(), "strict": True}}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def schema_text() -> str:
    """The schema as sent, for counting its tokens (providers add it to the prompt)."""
    return _schema_text()
