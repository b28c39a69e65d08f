"""Read an exam's course material (its chapters' `sources`) before anything is written.

A file-based exam's sources are files of its folder in EXAMS_DIR (never outside it, symlinks
included); an exam made through the API has its sources in the database (uploaded with
PUT /exams/SLUG/sources/NAME), and no path of the server is ever read for it. Every refusal
is one SourceError naming the file, raised before enqueue writes or publishes anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from examforge.errors import SourceError
from examforge.settings import Settings
from examforge.sources import ChapterMaterial, read_exam_material, read_file_under
from examforge.syllabus import Syllabus
from producer.syllabi import file_syllabus

if TYPE_CHECKING:
    from storage import Store


def uploaded_label(slug: str, name: str) -> str:
    return f"source {name} of exam {slug} (uploaded)"


def exam_material(settings: Settings, slug: str, syllabus: Syllabus,
                  store: Store | None) -> dict[str, ChapterMaterial]:
    """{chapter id: its material} for every chapter (empty for one without sources)."""
    chapters = [(ch.id, ch.sources) for ch in syllabus.chapters]
    if not any(sources for _, sources in chapters):
        return {cid: ChapterMaterial() for cid, _ in chapters}
    if file_syllabus(settings, slug) is not None:
        root = settings.exams_dir
        folder = root / slug
        return read_exam_material(chapters, lambda name: read_file_under(folder, root, name),
                                  lambda name: str(folder / name))

    def uploaded(name: str) -> bytes:
        data = store.source_file(slug, name) if store is not None else None
        if data is None:
            raise SourceError(f"{uploaded_label(slug, name)}: not uploaded; send it with "
                              f"PUT /exams/{slug}/sources/{name}")
        return data

    return read_exam_material(chapters, uploaded, lambda name: uploaded_label(slug, name))
