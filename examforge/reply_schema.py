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


# A call that asks for item types other than mcq (examforge.item_types) is sent a union of
# the kinds it asks for, each told apart by its `type` (a discriminated union, written as
# `anyOf`: OpenAI's strict mode takes `anyOf` but not `oneOf` or `discriminator`). A call
# that asks for four-choice questions only is sent QuestionList as before: its prompt
# tokens and its cached prefix stay what they were.
class _Typed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class McqItem(_Typed):
    type: Literal["mcq"]
    question: str
    choices: list[str] = Field(min_length=4, max_length=4)
    answer_index: Literal[0, 1, 2, 3]
    explanation: str
    difficulty: str | None
    bloom: str | None
    source: str | None


class MultiItem(_Typed):
    type: Literal["multi"]
    question: str
    choices: list[str] = Field(min_length=4, max_length=6)
    correct: list[int]
    explanation: str
    difficulty: str | None
    bloom: str | None
    source: str | None


class TrueFalseItem(_Typed):
    type: Literal["truefalse"]
    question: str
    answer: bool
    explanation: str
    difficulty: str | None
    bloom: str | None
    source: str | None


class ShortItem(_Typed):
    type: Literal["short"]
    question: str
    accepted: list[str] = Field(min_length=1, max_length=5)
    explanation: str
    difficulty: str | None
    bloom: str | None
    source: str | None


class NumericItem(_Typed):
    type: Literal["numeric"]
    question: str
    value: float
    tolerance: float
    relative: bool
    unit: str | None
    explanation: str
    difficulty: str | None
    bloom: str | None
    source: str | None


TYPED_ITEMS: dict[str, type[BaseModel]] = {
    "mcq": McqItem, "multi": MultiItem, "truefalse": TrueFalseItem, "short": ShortItem,
    "numeric": NumericItem}


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


def _consts(node: Any) -> Any:
    """`const` written as a one-value `enum`, which every constrained decoder takes."""
    if isinstance(node, list):
        return [_consts(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {("enum" if k == "const" else k): ([v] if k == "const" else _consts(v))
            for k, v in node.items()}


@lru_cache(maxsize=32)
def _schema_text(types: tuple[str, ...] = ()) -> str:
    if not types or types == ("mcq",):
        raw = QuestionList.model_json_schema()
        return json.dumps(_inline(raw, raw.get("$defs", {})))
    items = []
    for kind in types:
        raw = TYPED_ITEMS[kind].model_json_schema()
        items.append(_consts(_inline(raw, raw.get("$defs", {}))))
    schema = {"type": "object", "properties": {"questions": {
        "type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}}},
        "required": ["questions"], "additionalProperties": False}
    return json.dumps(schema)


def reply_schema(types: tuple[str, ...] = ()) -> dict[str, Any]:
    """The question list's JSON schema (a fresh copy): four-choice questions, or the union
    of the item types given (examforge.item_types, in its order)."""
    schema: dict[str, Any] = json.loads(_schema_text(types))
    return schema


def response_format(kind: str, types: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The `response_format` field of a request for LLM_RESPONSE_FORMAT `kind`, for a call
    that asks for `types` (none: four-choice questions only)."""
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": SCHEMA_NAME, "schema": reply_schema(types), "strict": True}}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def schema_text(types: tuple[str, ...] = ()) -> str:
    """The schema as sent, for counting its tokens (providers add it to the prompt)."""
    return _schema_text(types)
