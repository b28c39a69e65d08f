"""Text and identity helpers shared by the writers.

Stored text is plain text: whatever the model wrote, `<b>` included, is meant to be shown as
written. Every platform here renders HTML, so each writer sends `as_html(text)`: the HTML
special characters escaped and line breaks made `<br>`. Each format then adds its own layer
(CDATA, XML escaping, GIFT backslashes) on top of that HTML.
"""

from __future__ import annotations

import hashlib
import html
import re

_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")
_WHITESPACE_RE = re.compile(r"\s+")


def as_html(text: str) -> str:
    """Plain text as an HTML fragment that displays it unchanged.

    `>` is escaped too (html.escape does), so the result never contains `]]>`. Quotes are left
    alone: they are only special inside attributes, and this goes into element content. Line
    breaks of any convention become `<br>`; runs of spaces collapse as HTML always does.
    """
    return _LINE_BREAK_RE.sub("<br>", html.escape(text, quote=False))


def one_line(text: str) -> str:
    """A title for a place that holds one line (category paths, deck names)."""
    return _WHITESPACE_RE.sub(" ", text).strip()


def question_name(chapter_id: str, number: int) -> str:
    """The name a platform lists a question under: stable across exports and sortable."""
    return f"{chapter_id}-{number:04d}"


def stable_id(*parts: object, low: int = 1 << 30, high: int = 1 << 31) -> int:
    """An integer in [low, high) derived from `parts` only, so every export gives the same
    one. Anki deck and note type ids live in this range by genanki's convention."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return low + int.from_bytes(digest[:8], "big") % (high - low)


def in_language(fragment: str, language: str) -> str:
    """An HTML fragment of a chapter written in `language`, as Moodle and Canvas show it: in
    English (every platform's default) as it is; in another language inside
    `<div lang="fa" dir="rtl">`, so that the platform reads it in its language and
    direction (dir="rtl" for a language written right to left, none otherwise)."""
    if language == "en":
        return fragment
    from examforge.languages import RIGHT_TO_LEFT

    direction = ' dir="rtl"' if language in RIGHT_TO_LEFT else ""
    return f'<div lang="{html.escape(language)}"{direction}>{fragment}</div>'
