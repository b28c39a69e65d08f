"""Where an exam's syllabus comes from: its file in EXAMS_DIR, else the database.

An exam is file-based (EXAMS_DIR/SLUG/syllabus.json, .yaml or .yml) or API-based (sent with
PUT /exams/SLUG and stored in the database, so every replica and worker reads the same
one). The file wins whenever it exists, on the CLI and in the API alike, and the API refuses
to store a syllabus for an exam that has a file (409): one exam never has two syllabi.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from examforge.errors import UnknownExam
from examforge.settings import Settings
from examforge.syllabus import Syllabus, find_syllabus, load_syllabus, parse_syllabus

if TYPE_CHECKING:
    from storage import Store


def stored_source(slug: str) -> str:
    """What messages call a syllabus stored through the API."""
    return f"syllabus of {slug} (stored by PUT /exams/{slug})"


def file_syllabus(settings: Settings, slug: str) -> Path | None:
    """The exam's syllabus file, or None if it has none (an unsafe slug or a symlink out of
    EXAMS_DIR raises, as find_syllabus does)."""
    try:
        return find_syllabus(settings.exams_dir, slug)
    except UnknownExam:
        return None


def from_store(settings: Settings, store: Store, slug: str) -> Syllabus | None:
    body = store.stored_syllabus(slug)
    if body is None:
        return None
    return parse_syllabus(body.encode(), stored_source(slug),
                          max_questions=settings.max_questions_per_chapter)


def resolve(settings: Settings, slug: str, store: Store | None = None,
            open_store: Callable[[], Store | None] | None = None) -> Syllabus:
    """The exam's syllabus: its file, else the one stored in the database (`store`, or the
    one `open_store()` returns, called only when there is no file). Raises UnknownExam
    naming the file looked for when neither exists."""
    try:
        path = find_syllabus(settings.exams_dir, slug)
    except UnknownExam:
        if store is None and open_store is not None:
            store = open_store()
        found = from_store(settings, store, slug) if store is not None else None
        if found is None:
            raise
        return found
    return load_syllabus(path, max_questions=settings.max_questions_per_chapter)
