"""Read an exam's course material (its chapters' `sources`) before anything is written.

A file-based exam's sources are files of its folder in EXAMS_DIR (never outside it, symlinks
included); an exam made through the API has its sources in the database (uploaded with
PUT /exams/SLUG/sources/NAME), and no path of the server is ever read for it. Every refusal
is one SourceError naming the file, raised before enqueue writes or publishes anything.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from examforge.errors import SourceError
from examforge.settings import Settings
from examforge.sources import ChapterMaterial, read_exam_material, read_file_under
from examforge.syllabus import Syllabus
from producer.syllabi import file_syllabus

if TYPE_CHECKING:
    from storage import Store

log = logging.getLogger("examforge.grounding")

# A chapter whose material is this share or more beyond what its questions can cite (each
# question cites one passage) is warned about at enqueue, run and the dry run.
UNUSED_WARN_SHARE = 0.5


def uploaded_label(slug: str, name: str) -> str:
    return f"source {name} of exam {slug} (uploaded)"


def exam_material(settings: Settings, slug: str, syllabus: Syllabus, store: Store | None,
                  warn: Callable[[str], None] | None = None) -> dict[str, ChapterMaterial]:
    """{chapter id: its material} for every chapter (empty for one without sources). A chapter
    whose material its questions cannot nearly cite is warned about through `warn` (the CLI's
    stderr), else logged."""
    material = _exam_material(settings, slug, syllabus, store)
    for line in unused_material(syllabus, material):
        (warn or log.warning)(line)
    return material


def unused_material(syllabus: Syllabus, material: dict[str, ChapterMaterial]) -> list[str]:
    """A line for each chapter whose passages are far more than its questions can cite: each
    question cites one passage, so at most `questions` of them are ever used."""
    lines = []
    for chapter in syllabus.chapters:
        passages = len(material.get(chapter.id, ChapterMaterial()).passages)
        unused = (passages - chapter.questions) / passages if passages else 0.0
        if unused >= UNUSED_WARN_SHARE:
            lines.append(
                f"warning: chapter {chapter.id}: its sources make {passages:,} passages for "
                f"{chapter.questions} questions, each citing one: at least {unused:.0%} of the "
                "material will go unused (list fewer pages, name.pdf#pages=1-20, or ask for "
                "more questions)")
    return lines


def _exam_material(settings: Settings, slug: str, syllabus: Syllabus,
                   store: Store | None) -> dict[str, ChapterMaterial]:
    chapters = [(ch.id, ch.sources) for ch in syllabus.chapters]
    if not any(sources for _, sources in chapters):
        return {cid: ChapterMaterial() for cid, _ in chapters}
    if file_syllabus(settings, slug) is not None:
        root = settings.exams_dir
        folder = root / slug
        return read_exam_material(chapters, lambda name: read_file_under(folder, root, name),
                                  lambda name: str(folder / name), store)

    def uploaded(name: str) -> bytes:
        data = store.source_file(slug, name) if store is not None else None
        if data is None:
            raise SourceError(f"{uploaded_label(slug, name)}: not uploaded; send it with "
                              f"PUT /exams/{slug}/sources/{name}")
        return data

    return read_exam_material(chapters, uploaded, lambda name: uploaded_label(slug, name),
                              store)
