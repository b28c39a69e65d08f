"""What the mock reads from a chat request: the chapter key, title, question count and model.

The user message is read with examforge's own prompt vocabulary (`examforge.prompt.Label`,
`read_fields`), so the mock follows the prompt whenever its lines change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from examforge.output import normalise
from examforge.prompt import AVOID_HEADER, Label, parse_difficulty, parse_types, read_fields
from examforge.sources import offered_ids
from mockllm.faults import MODEL_ID
from mockllm.solve import is_solve

# The key (usage log's `chapter`) of every blind-solve request.
SOLVE_KEY = "blind-solve"

UNKNOWN_CHAPTER = "unknown"
DEFAULT_QUESTION_COUNT = 5
# Looked up by value, not by member name, so a renamed member cannot break the mock.
_COUNT_LABEL = Label("Number of questions")


@dataclass(frozen=True)
class ChatPrompt:
    """What the mock extracted from a chat request."""

    key: str
    chapter_id: str
    title: str
    count: int
    model: str = MODEL_ID
    # The part of the chapter asked for ("101-150"), when its slices run at once: with the
    # chapter, who a Retry-After was promised to.
    part: str | None = None
    # What a Difficulty line asks for, one level per question in order ("2 easy, 1 hard":
    # easy, easy, hard), and the levels of a Bloom levels line: a model asked for them
    # labels its questions so.
    difficulties: tuple[str, ...] = ()
    bloom: tuple[str, ...] = ()
    # What an Item types line asks for, one type per question in order ("2 mcq, 1 short":
    # mcq, mcq, short), and how many of its true/false statements are to be true.
    types: tuple[str, ...] = ()
    true_count: int = 0
    # The questions the prompt asks not to repeat (its "Do not repeat" list), normalised.
    avoid: frozenset[str] = frozenset()
    # The ids of the course-material passages the prompt offers (examforge.sources): a
    # model asked to cite one does.
    passages: tuple[str, ...] = ()
    # A blind solve's user message (mockllm.solve), None for a generation request.
    solve_text: str | None = None
    # The tag of the prompt's Language line ("Persian (fa). Write every question ..."):
    # what the mock writes in (mockllm.corpora); English without one.
    language: str = "en"

    @property
    def requester(self) -> str:
        return f"{self.key}#{self.part}" if self.part else self.key


def message_text(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _last_user_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def _first_token(value: str | None) -> str | None:
    parts = value.split() if value else []
    return parts[0] if parts else None


def avoid_list(text: str) -> frozenset[str]:
    """The "- question" lines that follow the prompt's "Do not repeat" header."""
    _, found, rest = text.partition(AVOID_HEADER)
    if not found:
        return frozenset()
    listed = set()
    for line in rest.splitlines()[1:]:
        if not line.startswith("- "):
            break
        listed.add(normalise(line[2:]))
    return frozenset(listed)


def parse_prompt(body: dict[str, Any]) -> ChatPrompt:
    """Extract chapter key, title and question count from an OpenAI request body."""
    text = _last_user_text(body)
    model = body.get("model")
    if is_solve(text):
        return ChatPrompt(key=SOLVE_KEY, chapter_id=SOLVE_KEY, title=SOLVE_KEY, count=0,
                          model=model if isinstance(model, str) and model else MODEL_ID,
                          solve_text=text)
    fields = read_fields(text)
    exam = _first_token(fields.get(Label.exam))
    chapter = _first_token(fields.get(Label.chapter_id))
    count = _first_token(fields.get(_COUNT_LABEL))
    chapter_id = chapter or UNKNOWN_CHAPTER
    asked_types, true_count = parse_types(fields.get(Label.types, ""))
    return ChatPrompt(
        key=f"{exam}/{chapter}" if exam and chapter else UNKNOWN_CHAPTER,
        chapter_id=chapter_id,
        title=fields.get(Label.chapter_title) or chapter_id,
        count=int(count) if count and count.isdigit() else DEFAULT_QUESTION_COUNT,
        model=model if isinstance(model, str) and model else MODEL_ID,
        part=_first_token(fields.get(Label.question_numbers)),
        difficulties=tuple(level for level, n in parse_difficulty(
            fields.get(Label.difficulty, "")).items() for _ in range(min(n, 1000))),
        types=tuple(kind for kind, n in asked_types.items() for _ in range(min(n, 1000))),
        true_count=true_count,
        bloom=tuple(b.strip().lower() for b in fields.get(Label.bloom, "").split(",")
                    if b.strip()),
        avoid=avoid_list(text),
        passages=offered_ids(text),
        language=_language(fields.get(Label.language)),
    )


def _language(line: str | None) -> str:
    """The tag in a Language line's parentheses, if the mock has a corpus for it."""
    from mockllm.corpora import CORPORA

    match = re.match(r"[^(]*\(([A-Za-z-]+)\)", line or "")
    return match.group(1) if match and match.group(1) in CORPORA else "en"
