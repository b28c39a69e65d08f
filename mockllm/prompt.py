"""What the mock reads from a chat request: the chapter key, title, question count and model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mockllm.faults import MODEL_ID

UNKNOWN_CHAPTER = "unknown"
DEFAULT_QUESTION_COUNT = 5

def _field_re(label: str, value: str) -> re.Pattern[str]:
    """Regex for a ``Label: value`` prompt line, tolerating list/markdown decoration."""
    return re.compile(rf"^[ \t>*_\-]*{label}[ \t]*:[ \t*_]*{value}", re.MULTILINE | re.IGNORECASE)


_EXAM_RE = _field_re("Exam", r"(\S+)")
_CHAPTER_ID_RE = _field_re(r"Chapter[ \t]+id", r"(\S+)")
_TITLE_RE = _field_re(r"Chapter[ \t]+title", r"(.*?)[ \t]*$")
_COUNT_RE = _field_re(r"Number[ \t]+of[ \t]+questions", r"(\d+)")


@dataclass(frozen=True)
class ChatPrompt:
    """What the mock extracted from a chat request."""

    key: str
    chapter_id: str
    title: str
    count: int
    model: str = MODEL_ID


def _message_text(content: Any) -> str:
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
            return _message_text(message.get("content"))
    return ""


def parse_prompt(body: dict[str, Any]) -> ChatPrompt:
    """Extract chapter key, title and question count from an OpenAI request body."""
    text = _last_user_text(body)
    exam = _EXAM_RE.search(text)
    chapter = _CHAPTER_ID_RE.search(text)
    title = _TITLE_RE.search(text)
    count = _COUNT_RE.search(text)
    chapter_id = chapter.group(1) if chapter else UNKNOWN_CHAPTER
    key = f"{exam.group(1)}/{chapter_id}" if exam and chapter else UNKNOWN_CHAPTER
    model = body.get("model")
    return ChatPrompt(
        key=key,
        chapter_id=chapter_id,
        title=(title.group(1) if title and title.group(1) else chapter_id),
        count=int(count.group(1)) if count else DEFAULT_QUESTION_COUNT,
        model=model if isinstance(model, str) and model else MODEL_ID,
    )
