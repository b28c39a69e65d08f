"""`producer import`: bring in questions that were already paid for.

The file is JSON Lines, one question a line: `chapter_id` and the question's fields
(`question`, `choices`, `answer_index`, `explanation`), as the naive script's checkpoint file
writes them; `export`'s JSONL is accepted too (its other fields, such as `exam`, `number`,
`model` and `created_at`, are ignored: questions are numbered after what the chapter holds).
Every line is validated as model output is (`examforge.output.check_item`). The first bad
line, or a line for a chapter the exam does not have, refuses the whole file before anything
is written: the error names the file, the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from examforge.errors import BadImportLine, UnknownExam, UserError
from examforge.output import ItemInvalid, check_item
from examforge.output import Question
from runner.pipeline import near_dup_checker
from examforge.settings import Settings
from examforge.syllabus import find_syllabus, load_syllabus
from producer.words import plural
from storage import Store
from storage.imports import ImportResult


@dataclass(frozen=True)
class ImportLine:
    line_no: int
    chapter_id: str
    question: Question


@dataclass(frozen=True)
class ImportFile:
    path: Path
    lines: tuple[ImportLine, ...]

    def by_chapter(self) -> dict[str, list[Question]]:
        """The questions of each chapter, in file order (chapters in first-seen order)."""
        out: dict[str, list[Question]] = {}
        for line in self.lines:
            out.setdefault(line.chapter_id, []).append(line.question)
        return out


def _bad(path: Path, line_no: int, field: str, reason: str) -> BadImportLine:
    return BadImportLine(f"{path}:{line_no}: {field}: {reason}; nothing was imported")


def read_file(path: Path) -> ImportFile:
    """Parse and validate every line of `path` (blank lines are skipped); raises
    BadImportLine for the first bad one, UserError when the file cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines: list[ImportLine] = []
    for line_no, data in enumerate(raw.split(b"\n"), 1):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _bad(path, line_no, "line", f"not UTF-8 (byte {exc.start + 1})") from None
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except (ValueError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "unreadable"
            raise _bad(path, line_no, "line", f"not JSON ({reason})") from None
        if not isinstance(item, dict):
            raise _bad(path, line_no, "line", "not a JSON object")
        chapter_id = item.get("chapter_id")
        if "chapter_id" not in item:
            raise _bad(path, line_no, "chapter_id", "missing")
        if not isinstance(chapter_id, str) or not chapter_id:
            raise _bad(path, line_no, "chapter_id", "must be a non-empty string")
        try:
            question = check_item(item)
        except ItemInvalid as exc:
            raise _bad(path, line_no, exc.field, exc.reason) from None
        lines.append(ImportLine(line_no, chapter_id, question))
    return ImportFile(path, tuple(lines))


def check_chapters(file: ImportFile, slug: str, chapter_ids: Iterable[str], where: str) -> None:
    """Refuse the file at its first line whose chapter `chapter_ids` (from `where`) lacks."""
    known = set(chapter_ids)
    for line in file.lines:
        if line.chapter_id not in known:
            raise _bad(file.path, line.line_no, "chapter_id",
                       f"{line.chapter_id!r} is not a chapter of {slug} ({where})")


def import_file(settings: Settings, store: Store, slug: str, path: Path) -> ImportResult:
    """Validate `path`, then store its questions as exam `slug`'s (see Store.import_questions).

    The exam must be in the database, or its syllabus in EXAMS_DIR: then it is recorded as
    `enqueue` records it (nothing is published), once the whole file is known to be good."""
    file = read_file(path)
    chapters = store.chapter_ids(slug)
    syllabus = None
    if chapters is None:
        try:
            syllabus = load_syllabus(find_syllabus(settings.exams_dir, slug),
                                     max_questions=settings.max_questions_per_chapter)
        except UnknownExam:
            raise UnknownExam(f"unknown exam {slug!r}: not in the database and no syllabus in "
                              f"{settings.exams_dir / slug}") from None
        chapters = [c.id for c in syllabus.chapters]
        check_chapters(file, slug, chapters, "its syllabus")
    else:
        check_chapters(file, slug, chapters,
                       "in the database; run enqueue first to record a changed syllabus")
    if syllabus is not None:
        store.sync_exam(slug, syllabus, default_budget_usd=settings.budget_usd,
                        slice_questions=settings.slice_questions,
                        default_verify=settings.verify)
    return store.import_questions(slug, file.by_chapter(), source=str(path),
                                  near_dup=near_dup_checker(settings))


def report_lines(result: ImportResult) -> list[str]:
    """What `producer import` prints: one line per chapter written to, then the totals."""
    lines = []
    for c in result.chapters:
        if not c.slices:
            continue
        parts = []
        for s in c.slices:
            numbers = f"{s.first}" if s.count == 1 else f"{s.first}-{s.first + s.count - 1}"
            parts.append(f"slice {s.slice_no} numbers {numbers}" + (" (now done)" if s.done else ""))
        lines.append(f"imported  {result.exam}/{c.chapter_id}: {plural(c.imported, 'question')}, "
                     + ", ".join(parts))
    lines.append(f"imported {result.imported}, skipped {result.already_stored} already stored, "
                 f"{result.repeated} repeated in the file, "
                 f"{plural(result.near_duplicates, 'near-duplicate')}, "
                 f"{result.past_target} past the target")
    return lines
