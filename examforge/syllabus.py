"""Load and validate an exam syllabus: `EXAMS_DIR/SLUG/syllabus.json` (or `.yaml`/`.yml`).

Everything a person typed is checked here, before anything touches the database or the broker,
and every failure is one line naming the file and the field.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Literal, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from examforge.errors import SyllabusError, UnknownExam
from examforge.languages import DEFAULT_LANGUAGE, check_tag, known_tags

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)
# Anything but tab/newline below 0x20, DEL and the C1 block: invisible, and a way to smuggle
# terminal escapes into logs and tables.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Titles go into one `Key: value` line of the prompt each; a line break there could forge the
# lines after it ("Number of questions: 999"), so titles are single-line. Prompts may wrap.
_LINE_BREAK_RE = re.compile(r"[\n\r\x85\u2028\u2029]")
MAX_SYLLABUS_BYTES = 1_000_000
MAX_DEPTH = 8
# Measured at 20,000 and 50,000 chapters on both databases (bench/syllabus_size.py, README's
# "Hostile or odd input"): enqueue, status, the reconciler and the API's page data all work
# at 50,000, so the cap is there. The 1 MB cap binds first (20,000 short chapters are 938 KB).
MAX_CHAPTERS = 50_000
# The longest texts a syllabus may hold (characters), so that one field cannot fill a prompt.
MAX_TITLE_CHARS = 300
MAX_CHAPTER_TITLE_CHARS = 500
MAX_PROMPT_CHARS = 4000
SYLLABUS_NAMES = ("syllabus.json", "syllabus.yaml", "syllabus.yml")


def check_name(value: str, what: str) -> str:
    """Allow-list a slug or chapter id: it becomes part of paths and task ids."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r} must match {NAME_PATTERN}")
    return value


def _clean_text(value: str, *, single_line: bool = False) -> str:
    if _CONTROL_RE.search(value):
        raise ValueError("contains control characters")
    if single_line and _LINE_BREAK_RE.search(value):
        raise ValueError("must be a single line")
    value = value.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


class Difficulty(str, Enum):
    """How hard a chapter's questions are meant to be (its `difficulty` field)."""

    easy = "easy"
    medium = "medium"
    hard = "hard"


class Bloom(str, Enum):
    """The levels of Bloom's taxonomy (revised, 2001), lowest first: a chapter's `bloom`."""

    remember = "remember"
    understand = "understand"
    apply = "apply"
    analyze = "analyze"
    evaluate = "evaluate"
    create = "create"


DIFFICULTIES = tuple(d.value for d in Difficulty)
BLOOM_LEVELS = tuple(b.value for b in Bloom)
# A mix's shares must add up to 1 within this (0.33 + 0.33 + 0.34 is fine, 0.3 + 0.3 is not).
_SHARES_TOLERANCE = 0.011


def _check_difficulty(value: Any) -> Any:
    """One level, or {level: share} with shares > 0 adding up to 1; the messages name what
    is wrong in the user's own terms (pydantic's union errors would list both branches)."""
    levels = ", ".join(DIFFICULTIES)
    if isinstance(value, str):
        if value not in DIFFICULTIES:
            raise ValueError(f"{value!r} is not one of {levels}")
        return value
    if not isinstance(value, dict):
        raise ValueError(f"must be one of {levels}, or an object of shares such as "
                         '{"easy": 0.3, "medium": 0.5, "hard": 0.2}')
    if not value:
        raise ValueError("a mix needs at least one level")
    for level, share in value.items():
        if level not in DIFFICULTIES:
            raise ValueError(f"{level!r} is not one of {levels}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) \
                or not math.isfinite(share) or not 0 < share <= 1:
            raise ValueError(f"the share of {level} must be a number above 0 and at most 1, "
                             f"is {share!r}")
    total = sum(value.values())
    if abs(total - 1) > _SHARES_TOLERANCE:
        raise ValueError(f"the shares must add up to 1, they add up to {total:g}")
    # Normalised (so a mix of 0.33 + 0.33 + 0.34 counts exactly) and in the levels' order.
    return {level: value[level] / total for level in DIFFICULTIES if level in value}


def _check_bloom(value: Any) -> Any:
    levels = ", ".join(BLOOM_LEVELS)
    if isinstance(value, str):
        value = [value]  # one level needs no list
    if not isinstance(value, list) or not value:
        raise ValueError(f"must be a non-empty list of Bloom levels: {levels}")
    for level in value:
        if level not in BLOOM_LEVELS:
            raise ValueError(f"{level!r} is not a Bloom level ({levels})")
    if len(set(value)) != len(value):
        raise ValueError("a level is listed twice")
    return [b for b in BLOOM_LEVELS if b in value]  # lowest first, whatever order was typed


def _check_types(value: Any) -> Any:
    """{type: count}: known item types (examforge.item_types), whole counts of 0 or more,
    in the types' own order; that they add up to `questions` is checked by the chapter."""
    from examforge.item_types import ITEM_TYPES
    kinds = ", ".join(ITEM_TYPES)
    if not isinstance(value, dict) or not value:
        raise ValueError(f"must be an object of counts per item type ({kinds}), such as "
                         '{"mcq": 20, "truefalse": 10}')
    for kind, count in value.items():
        if kind not in ITEM_TYPES:
            raise ValueError(f"{kind!r} is not an item type ({kinds})")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"the count of {kind} must be a whole number, 0 or more, "
                             f"is {count!r}")
    return {kind: value[kind] for kind in ITEM_TYPES if value.get(kind)}


class Chapter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str
    title: str = Field(max_length=MAX_CHAPTER_TITLE_CHARS)
    questions: int
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    # Optional: how hard (one of DIFFICULTIES, or {level: share}) and which Bloom levels the
    # questions target. They go into the prompt and are stored with each question.
    difficulty: Union[str, dict[str, float], None] = None
    bloom: list[str] | None = None
    # Optional: how many questions of each item type (examforge.item_types), adding up to
    # `questions`; absent: all `mcq`. Recorded on the chapter's slices at enqueue.
    types: dict[str, int] | None = None
    # Optional: files of the exam's folder the questions are written from (examforge.sources:
    # `notes/ch1.md`, `guide.pdf#pages=3-9`); checked here by name only, read at enqueue.
    sources: list[str] | None = None
    # Optional: the BCP 47 tag of the language its questions are written in
    # (examforge.languages), when not the exam's; a Syllabus sets it to the exam's otherwise.
    language: str | None = Field(None, description=(
        "The BCP 47 tag of the language the chapter's questions are written in, when not the "
        f"exam's: one of {', '.join(known_tags())}."))

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, v: Any) -> Any:
        return None if v is None else check_tag(v)

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        from examforge.sources import MAX_SOURCES_PER_CHAPTER, parse_entry
        if not v:
            raise ValueError("must list at least one file (or be left out)")
        if len(v) > MAX_SOURCES_PER_CHAPTER:
            raise ValueError(f"at most {MAX_SOURCES_PER_CHAPTER} sources a chapter")
        if len(set(v)) != len(v):
            raise ValueError("a source is listed twice")
        for entry in v:
            parse_entry(entry)
        return v

    @field_validator("difficulty", mode="before")
    @classmethod
    def _difficulty(cls, v: Any) -> Any:
        return None if v is None else _check_difficulty(v)

    @field_validator("bloom", mode="before")
    @classmethod
    def _bloom(cls, v: Any) -> Any:
        return None if v is None else _check_bloom(v)

    @field_validator("types", mode="before")
    @classmethod
    def _types(cls, v: Any) -> Any:
        return None if v is None else _check_types(v)

    @model_validator(mode="after")
    def _types_add_up(self) -> "Chapter":
        if self.types is not None and sum(self.types.values()) != self.questions:
            raise ValueError(f"types: the counts add up to {sum(self.types.values())}, "
                             f"not to questions ({self.questions})")
        return self

    @property
    def item_types(self) -> dict[str, int] | None:
        """The counts per item type, None for all mcq (no types, or only mcq)."""
        if self.types is None or set(self.types) <= {"mcq"}:
            return None
        return dict(self.types)

    @property
    def difficulty_shares(self) -> dict[str, float] | None:
        """The difficulty as shares ({"hard": 1.0} for one level), None when unset."""
        if self.difficulty is None:
            return None
        if isinstance(self.difficulty, str):
            return {self.difficulty: 1.0}
        return dict(self.difficulty)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return check_name(v, "chapter id")

    @field_validator("title")
    @classmethod
    def _title(cls, v: str) -> str:
        return _clean_text(v, single_line=True)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | None) -> str | None:
        return None if v is None else _clean_text(v)

    @property
    def spec_hash(self) -> str:
        """What the questions were generated from: a change means old questions may not fit.
        The language counts when it is not the default, so that the chapters recorded before
        there was one (all English) keep their hash."""
        spec: list[str | None] = [self.title, self.prompt]
        if (self.language or DEFAULT_LANGUAGE) != DEFAULT_LANGUAGE:
            spec.append(self.language)
        if self.item_types is not None:
            # Which kinds of item were asked for; all mcq is what it always was.
            spec.append(json.dumps(self.item_types))
        blob = json.dumps(spec, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Syllabus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    title: str = Field(max_length=MAX_TITLE_CHARS)
    chapters: list[Chapter] = Field(min_length=1, max_length=MAX_CHAPTERS)
    # The exam's blind-solve policy (storage.models.VerifyPolicy), recorded on the exam at
    # every enqueue or run of this syllabus unless `--verify` (or a run's `verify`) says
    # otherwise; absent: the exam keeps its own (a new exam: VERIFY, else off).
    verify: Literal["off", "flag", "replace"] | None = None
    # The BCP 47 tag of the language the exam is written in (examforge.languages), recorded
    # on the exam at every enqueue; a chapter's own `language` overrides it for the chapter.
    language: str = Field(DEFAULT_LANGUAGE, description=(
        "The BCP 47 tag of the language the exam is written in: one of "
        f"{', '.join(known_tags())} (default {DEFAULT_LANGUAGE})."))

    @field_validator("title")
    @classmethod
    def _title(cls, v: str) -> str:
        return _clean_text(v, single_line=True)

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, v: Any) -> Any:
        return check_tag(v)

    @model_validator(mode="after")
    def _chapter_languages(self) -> "Syllabus":
        """Every chapter with its language: its own, else the exam's (what is recorded on
        its slices, what its prompts say and what its spec_hash counts)."""
        if any(ch.language is None for ch in self.chapters):
            # The model is frozen: the validated list is replaced, never mutated in place.
            object.__setattr__(self, "chapters", [
                ch if ch.language is not None
                else ch.model_copy(update={"language": self.language})
                for ch in self.chapters])
        return self

    @field_validator("chapters")
    @classmethod
    def _unique_ids(cls, chapters: list[Chapter]) -> list[Chapter]:
        seen: set[str] = set()
        for i, chapter in enumerate(chapters):
            if chapter.id in seen:
                raise ValueError(f"duplicate chapter id {chapter.id!r} at chapters[{i}]")
            seen.add(chapter.id)
        return chapters

    def chapter(self, chapter_id: str) -> Chapter:
        for chapter in self.chapters:
            if chapter.id == chapter_id:
                return chapter
        raise KeyError(chapter_id)


def find_syllabus(exams_dir: Path, slug: str) -> Path:
    """The syllabus file of `slug`, refusing names and symlinks that leave `exams_dir`."""
    try:
        check_name(slug, "exam slug")
    except ValueError as exc:
        raise UnknownExam(str(exc)) from None
    root = exams_dir.resolve()
    folder = exams_dir / slug
    for name in SYLLABUS_NAMES:
        path = folder / name
        if path.exists() or path.is_symlink():
            resolved = path.resolve()
            if not resolved.is_relative_to(root):
                raise SyllabusError(f"{path}: resolves to {resolved}, outside EXAMS_DIR {root}")
            return path
    raise UnknownExam(f"unknown exam {slug!r}: no {folder / SYLLABUS_NAMES[0]}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, plus duplicate keys refused (PyYAML silently keeps the last one) and aliases
    refused (`*ref` shares a node, so a few kilobytes can expand into billions of values: the
    "billion laughs"; a syllabus has no use for them)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"alias *{event.anchor} is not allowed", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: SafeConstructor reports it below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _parse(path: Path | str, text: str, suffix: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(
                text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant
            )
        except json.JSONDecodeError as exc:
            raise SyllabusError(
                f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        except RecursionError:
            raise SyllabusError(f"{path}: nested too deeply") from None
        except ValueError as exc:
            raise SyllabusError(f"{path}: {exc}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except RecursionError:
        raise SyllabusError(f"{path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid YAML"
        first_line = _CONTROL_RE.sub("?", first_line)  # a %-escaped tag can carry anything
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SyllabusError(f"{path}: malformed YAML{where}: {first_line}") from None


def _field(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and not part.isprintable():
            part = repr(part)  # an unknown key is user text: keep the message one clean line
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(error: Any) -> str:
    """pydantic's text of one error, without the "Value error, " it puts before a validator's."""
    msg = str(error["msg"])
    return msg.removeprefix("Value error, ") if error["type"] == "value_error" else msg


def _validation_message(exc: ValidationError) -> str:
    """The first error, but an unknown key first of all, with the field it may be a typo of:
    `"questons"` otherwise reads as `questions: Field required`, which hides the cause."""
    errors = exc.errors()
    unknown = next((e for e in errors if e["type"] == "extra_forbidden"), None)
    if unknown is None:
        return f"{_field(errors[0]['loc'])}: {_message(errors[0])}"
    *parent, key = unknown["loc"]
    model = Syllabus if not parent else Chapter if len(parent) == 2 else None
    shown = f'"{key}"' if isinstance(key, str) and key.isprintable() else repr(key)
    message = (f"{_field(tuple(parent))}: " if parent else "") + f"unknown field {shown}"
    if model is not None and isinstance(key, str):
        close = difflib.get_close_matches(key, list(model.model_fields), n=1)
        if close:
            message += f' (did you mean "{close[0]}"?)'
    return message


def load_syllabus(path: Path, *, max_questions: int) -> Syllabus:
    """Read, parse and validate one syllabus file; every failure is a SyllabusError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SyllabusError(f"{path}: file not found") from None
    except OSError as exc:
        raise SyllabusError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_syllabus(raw, path, max_questions=max_questions, suffix=path.suffix)


def parse_syllabus(raw: bytes, source: Path | str, *, max_questions: int,
                   suffix: str = ".json") -> Syllabus:
    """Parse and validate a syllabus's bytes, from a file or an HTTP request body (`source`
    names it in every message, as the file's path does): one code path, so the API's
    errors are the file's, word for word. Every failure is a SyllabusError."""
    if len(raw) > MAX_SYLLABUS_BYTES:
        raise SyllabusError(f"{source}: {len(raw)} bytes, larger than {MAX_SYLLABUS_BYTES}")
    try:
        # utf-8-sig: a BOM written by an editor is dropped, not treated as content.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SyllabusError(f"{source}: not UTF-8 (byte {exc.start})") from None
    data = _parse(source, text, suffix)
    if _depth(data) > MAX_DEPTH:
        raise SyllabusError(f"{source}: nested deeper than {MAX_DEPTH} levels")
    if not isinstance(data, dict):
        raise SyllabusError(f"{source}: top level must be an object with title and chapters")
    try:
        syllabus = Syllabus.model_validate(data)
    except ValidationError as exc:
        raise SyllabusError(f"{source}: {_validation_message(exc)}") from None
    for i, chapter in enumerate(syllabus.chapters):
        if not 1 <= chapter.questions <= max_questions:
            raise SyllabusError(
                f"{source}: chapters[{i}].questions: {chapter.questions} is outside "
                f"1..{max_questions}"
            )
    return syllabus


def slice_ranges(first: int, last: int, size: int) -> Iterator[tuple[int, int]]:
    """(first number, count) of the slices covering numbers first..last, `size` at most each:
    how a chapter is cut into units of work (storage.models.Slice)."""
    for start in range(first, last + 1, size):
        yield start, min(size, last - start + 1)
