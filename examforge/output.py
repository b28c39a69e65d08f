"""Model output is untrusted: parse and validate it before anything is stored."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass

from pydantic_core import from_json

from examforge import item_types
from examforge.errors import OutputInvalid, Rejection
from examforge.languages import DEFAULT_LANGUAGE, LANGUAGES, language as language_of

_FENCE_RE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
# The opening fence of a reply cut before its closing one.
_OPEN_FENCE_RE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?")
_REFUSAL_RE = re.compile(r"^\s*(i'?m sorry|i am sorry|i can(no|')t|sorry,|as an ai)", re.IGNORECASE)
# NUL (PostgreSQL text refuses it), lone surrogates (not encodable as UTF-8: every driver
# refuses them) and the other C0/C1 controls but tab, newline and carriage return (terminal
# escapes smuggled into logs and tables). JSON's \u escapes let a reply carry any of them.
_BAD_CHAR_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass(frozen=True)
class Question:
    question: str
    choices: tuple[str, str, str, str]
    answer_index: int
    explanation: str
    # What the model said of it, when the prompt asked (examforge.levels): a difficulty and a
    # Bloom level, None when not asked, missing or not one the chapter allows.
    difficulty: str | None = None
    bloom: str | None = None
    # The passage id it cites ("p3"), when the prompt offered course material; the pipeline
    # replaces it with the passage's reference before it is stored (runner.pipeline).
    source: str | None = None
    passage: int | None = None
    # Its kind (examforge.item_types) and, for a kind other than mcq, its answer fields as
    # stored (canonical JSON; `choices` then holds a multi's choices or nothing, and
    # `answer_index` is item_types.NO_INDEX).
    type: str = "mcq"
    answer: str | None = None


class _FormatChars(dict):  # type: ignore[type-arg]
    """A str.translate table deleting every format character (Unicode category Cf: zero-width
    spaces and joiners, soft hyphens, BOMs, bidi marks), filled as characters are met: each
    is looked up once in the unicodedata that NFKC uses (a table of all 1.1 million code
    points costs 0.1-0.3 s to build). `re` cannot name a category, and the `regex` package's
    Cf class follows a newer Unicode than this Python's NFKC, so the two steps would disagree
    on newly assigned characters. At most _CACHED characters are kept (a text made of all of
    Unicode must not grow every worker by 100 MB)."""

    def __missing__(self, cp: int) -> int | None:
        value = None if unicodedata.category(chr(cp)) == "Cf" else cp
        if len(self) < _CACHED:
            self[cp] = value
        return value


_CACHED = 65_536
_FORMAT_CHARS = _FormatChars()


def canonical(text: str) -> str:
    """One normal form for a text, case kept (examforge.neardup reads identifiers by their
    capitals): NFKC (full-width and compatibility forms, NFC against NFD), format characters
    removed (invisible: a zero-width space inside "AWS" is still "AWS" to a reader), and
    whitespace collapsed to single spaces. What the exact hash and the near-duplicate
    signatures are computed from; changing it changes stored hashes and signatures (a
    migration recomputes them: storage/migrations/versions/0013_normal_form.py)."""
    if not text.isascii():  # ASCII is its own NFKC and holds no format character
        # Removed first: "e", a zero-width space and a combining acute compose once it is gone.
        text = unicodedata.normalize("NFKC", text.translate(_FORMAT_CHARS))
    return " ".join(text.split())


def normalise(text: str) -> str:
    """The form in which two questions count as the same: `canonical`, lower-cased."""
    return canonical(text).lower()


def text_hash(text: str) -> str:
    """The key under which the database keeps a chapter's questions unique (by `normalise`)."""
    return hashlib.md5(normalise(text).encode()).hexdigest()


def _strip_fences(content: str) -> str:
    match = _FENCE_RE.match(content)
    return match.group(1) if match else content


class ItemInvalid(ValueError):
    """Raised by `check_item` for a question object that fails validation: `field` names the
    field (or "item" for the object itself) and `reason` says what is wrong with it;
    `rejection` is what a reply's item is counted as (each item type's own form)."""

    def __init__(self, field: str, reason: str,
                 rejection: Rejection = Rejection.wrong_schema) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.rejection = rejection


def check_item(item: object) -> Question:
    """Validate one question object, as model output and imported files both are; raises
    ItemInvalid naming the first field that fails. Other keys of the object are ignored."""
    if not isinstance(item, dict):
        raise ItemInvalid("item", "not a JSON object")
    kind = item.get("type", item_types.MCQ)
    if kind is None:
        kind = item_types.MCQ
    if kind != item_types.MCQ:
        return _check_typed(item, kind)
    question, choices = item.get("question"), item.get("choices")
    answer, explanation = item.get("answer_index"), item.get("explanation", "")
    if "question" not in item:
        raise ItemInvalid("question", "missing")
    if not isinstance(question, str) or not question.strip():
        raise ItemInvalid("question", "must be a non-empty string")
    if "choices" not in item:
        raise ItemInvalid("choices", "missing")
    if not isinstance(choices, list) or len(choices) != 4:
        raise ItemInvalid("choices", "must be a list of 4 strings")
    for i, c in enumerate(choices):
        if not isinstance(c, str) or not c.strip():
            raise ItemInvalid("choices", f"choice {i} must be a non-empty string")
    if len({normalise(c) for c in choices}) != 4:
        raise ItemInvalid("choices", "two choices are the same")
    if "answer_index" not in item:
        raise ItemInvalid("answer_index", "missing")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer <= 3:
        raise ItemInvalid("answer_index", "must be an integer from 0 to 3")
    if not isinstance(explanation, str):
        raise ItemInvalid("explanation", "must be a string")
    for name, texts in (("question", (question,)), ("choices", choices),
                        ("explanation", (explanation,))):
        if any(_BAD_CHAR_RE.search(text) for text in texts):
            raise ItemInvalid(name, "contains a control character or a lone surrogate")
    return Question(
        question.strip(), tuple(c.strip() for c in choices), answer, explanation.strip(),  # type: ignore[arg-type]
        difficulty=_label(item.get("difficulty")), bloom=_label(item.get("bloom")),
        source=_cited(item.get("source")),
    )


def _check_typed(item: dict[str, object], kind: object) -> Question:
    """check_item for an item of a type other than mcq (examforge.item_types)."""
    if kind not in item_types.ITEM_TYPES:
        raise ItemInvalid("type", f"{kind!r} is not one of {', '.join(item_types.ITEM_TYPES)}",
                          Rejection.unknown_type)
    assert isinstance(kind, str)
    question, explanation = item.get("question"), item.get("explanation", "")
    if not isinstance(question, str) or not question.strip():
        raise ItemInvalid("question", "must be a non-empty string")
    if not isinstance(explanation, str):
        raise ItemInvalid("explanation", "must be a string")
    try:
        choices, answer = item_types.check_answer(kind, item, normalise)
    except item_types.TypeInvalid as exc:
        raise ItemInvalid(exc.field, exc.detail, exc.reason) from None
    texts = [question, explanation, *choices, *answer.get("accepted", ()),
             answer.get("unit") or ""]
    if any(_BAD_CHAR_RE.search(text) for text in texts):
        raise ItemInvalid("question", "contains a control character or a lone surrogate")
    return Question(
        question.strip(), choices, item_types.NO_INDEX,  # type: ignore[arg-type]
        explanation.strip(), difficulty=_label(item.get("difficulty")),
        bloom=_label(item.get("bloom")), source=_cited(item.get("source")),
        type=kind, answer=item_types.dump(answer))


def _cited(value: object) -> str | None:
    """A passage id the model cited ("p3", "[P3]" reads as "p3"), or None."""
    if not isinstance(value, str) or len(value) > 32:
        return None
    value = value.strip().strip("[]").strip().lower()
    return value or None


def _label(value: object) -> str | None:
    """A level the model named ("Hard " reads as "hard"), or None: a label is advice, never a
    reason to refuse a question (examforge.levels decides what is stored)."""
    if not isinstance(value, str) or len(value) > 32:
        return None
    return value.strip().lower() or None


def positional_reason(q: Question, language: str = DEFAULT_LANGUAGE) -> str | None:
    """Why `q` cannot be stored in an exam in `language`, or None: a choice refers to the
    others by position or letter, in that language or in English ("all of the above", "هیچ
    کدام", "ничего из вышеперечисленного", "both A and B"); or, in a language other than
    English, the explanation names a choice by its letter ("گزینه الف"), which the reorder
    of the choices (examforge.balance) would make false. The prompt asks for neither."""
    checked = [language_of(language)]
    if language != DEFAULT_LANGUAGE:
        checked.append(LANGUAGES[DEFAULT_LANGUAGE])
    for i, choice in enumerate(q.choices):
        for lang in checked:
            found = lang.positional(choice)
            if found:
                return f"choice {i} refers to the others ({found!r})"
    if language != DEFAULT_LANGUAGE:
        found = language_of(language).letter_reference(q.explanation)
        if found:
            return f"the explanation names a choice by its letter ({found!r})"
    return None


def _parse_item(item: object) -> Question | Rejection:
    try:
        return check_item(item)
    except ItemInvalid as exc:
        return exc.rejection


@dataclass(frozen=True)
class Parsed:
    """Valid questions (at most `wanted` when given, none already known) and what was
    rejected, by kind."""

    questions: list[Question]
    rejected: dict[Rejection, int]
    # The reply was cut at max_tokens (finish_reason "length"): `questions` are the complete
    # ones it held before the cut.
    truncated: bool = False


def _recovered(content: str) -> list[object] | None:
    """The complete question objects of a reply cut at max_tokens, or None when none can be
    told apart. pydantic_core's partial mode (maintained with pydantic, already installed)
    parses the JSON up to the cut and drops an incomplete trailing string; what it cannot say
    is whether the last object of the array was complete, so that one counts only when its
    closing brace arrived, and every object of a cut reply must carry its explanation (a cut
    explanation would otherwise read as none)."""
    body = _OPEN_FENCE_RE.sub("", content, count=1)
    body = body.rstrip().removesuffix("```").rstrip()
    try:
        data = from_json(body, allow_partial=True)
    except ValueError:
        return None
    items = data.get("questions") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    if items and not body.rstrip(", \t\r\n").endswith("}"):
        items = items[:-1]
    return [item for item in items if isinstance(item, dict) and "explanation" in item]


def parse_questions(
    content: str | None, finish_reason: str | None, wanted: int | None, known: set[str],
    *, language: str = DEFAULT_LANGUAGE,
) -> Parsed:
    """Validate one reply. Raises OutputInvalid when it holds nothing usable at all.

    A reply with some invalid items keeps the valid ones; with `wanted`, extras beyond it are
    dropped (None: every valid question is returned, and the commit takes what the slice
    lacks); questions whose normalised text is in `known` (already stored, or earlier in this
    reply) are rejected as duplicates; those whose choices refer to the others by position
    or letter in `language` (the chapter's) or English are rejected as positional
    (`positional_reason`). A reply cut at max_tokens keeps the complete questions it holds
    (`Parsed.truncated`), and is truncated output when it holds none.
    """
    truncated = finish_reason == "length"
    if content is None or not content.strip():
        raise OutputInvalid(Rejection.truncated if truncated else Rejection.empty, "no content")
    if truncated:
        items = _recovered(content)
        if not items:
            raise OutputInvalid(Rejection.truncated,
                                "finish_reason is length; no complete question before the cut")
    else:
        body = _strip_fences(content)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # JSONDecodeError, and e.g. a 5000-digit number
            # The detail is stored with the call: it must not carry what the database refuses.
            if _REFUSAL_RE.match(content):
                raise OutputInvalid(Rejection.refusal, _BAD_CHAR_RE.sub("?", content.strip()[:80])) from None
            raise OutputInvalid(Rejection.malformed_json,
                                _BAD_CHAR_RE.sub("?", body.strip()[:80])) from None
        items = data.get("questions") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise OutputInvalid(Rejection.wrong_schema, "no questions list")
    rejected: dict[Rejection, int] = {}
    out: list[Question] = []
    seen = set(known)
    for item in items:
        q = _parse_item(item)
        if isinstance(q, Rejection):
            rejected[q] = rejected.get(q, 0) + 1
            continue
        if positional_reason(q, language) is not None:
            rejected[Rejection.positional] = rejected.get(Rejection.positional, 0) + 1
            continue
        key = normalise(q.question)
        if key in seen:
            rejected[Rejection.duplicate] = rejected.get(Rejection.duplicate, 0) + 1
            continue
        seen.add(key)
        if wanted is None or len(out) < wanted:
            out.append(q)
    if not out:
        if truncated and not rejected:
            raise OutputInvalid(Rejection.truncated,
                                "finish_reason is length; no complete question before the cut")
        kind = max(rejected, key=lambda k: rejected[k]) if rejected else Rejection.too_few
        raise OutputInvalid(kind, "no valid question in reply")
    return Parsed(out, rejected, truncated)
