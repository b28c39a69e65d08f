"""A chapter's course material: its `sources` read, checked and cut into passages.

A chapter may list `sources` in the syllabus: files of the exam's folder, by a relative name
(`notes/ch1.md`, `guide.pdf`, `guide.pdf#pages=3-9`). Markdown and plain text, HTML and PDF
(through pypdf) are read. Each file's text is cut into sections (a Markdown or HTML heading,
a PDF page) and each section into passages of about PASSAGE_CHARS characters, at paragraph
boundaries (a paragraph longer than PASSAGE_MAX_CHARS is cut at a sentence or a space). The
chapter's passages are numbered 1..N in the order its sources list them: a question cites
one by that number (`p3`), and stores where it is (file, page or heading).

Which passages a slice of the chapter is shown is `slice_passages`: the passages are laid
over the chapter's question numbers, so each slice gets the share of the material that falls
on its own numbers (a chapter's questions span its material, not its first pages), and
`fit` keeps an evenly spread subset of them within the prompt's token allowance.

Everything here is pure: the caller reads the bytes (a file under EXAMS_DIR, or a source
uploaded through the API and kept in the database) and every refusal is a SourceError of
one line naming the file.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from examforge.errors import SourceError
from examforge.output import Question

# A passage: paragraphs gathered up to about this many characters (about 300 tokens of
# English); a paragraph longer than the most is cut at a sentence end or a space.
PASSAGE_CHARS = 1200
PASSAGE_MAX_CHARS = 2000
# Caps, per file (README, "Grounding in course material"): a larger file, or a PDF of more
# pages, is refused before its text is extracted.
MAX_SOURCE_BYTES = 10_000_000
MAX_PDF_PAGES = 500
MAX_SOURCES_PER_CHAPTER = 20
# A source sent through the API: each at most this many bytes (the API's body cap), and at
# most this many per exam.
MAX_UPLOAD_BYTES = 1_000_000
MAX_UPLOADS_PER_EXAM = 100
MAX_NAME_CHARS = 200

TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".text")
HTML_SUFFIXES = (".html", ".htm")
PDF_SUFFIXES = (".pdf",)
SUFFIXES = TEXT_SUFFIXES + HTML_SUFFIXES + PDF_SUFFIXES

_SEGMENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_PAGES_RE = re.compile(r"pages=(\d{1,5})(?:-(\d{1,5}))?")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_HEADING_RE = re.compile(r"^[ ]{0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+")


def check_name(name: str) -> str:
    """A source's name as a syllabus or an API client may give it: a relative path of plain
    segments (no absolute path, no `..`, no backslash, no hidden file), with a supported
    suffix. The same rule for files in EXAMS_DIR and for uploads, so that a name can never
    make anything read outside the exam's folder."""
    if not isinstance(name, str) or not name:
        raise ValueError("a source must be a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"source name longer than {MAX_NAME_CHARS} characters")
    if name.startswith("/") or "\\" in name or ":" in name.split("/")[0]:
        raise ValueError(f"source {name!r} must be a relative path inside the exam's folder")
    for segment in name.split("/"):
        if segment in ("", ".", "..") or not _SEGMENT_RE.fullmatch(segment):
            raise ValueError(f"source {name!r}: {segment!r} is not an allowed path segment "
                             "(letters, digits, . _ + -; no .., no hidden files)")
    if not name.lower().endswith(SUFFIXES):
        raise ValueError(f"source {name!r}: not a supported type ({', '.join(SUFFIXES)})")
    return name


@dataclass(frozen=True)
class SourceSpec:
    """One entry of a chapter's `sources`: a file and, for a PDF, the pages to read."""

    entry: str  # as written ("guide.pdf#pages=3-9")
    name: str  # the file ("guide.pdf")
    pages: tuple[int, int] | None = None  # first and last, 1-based, inclusive


def parse_entry(entry: str) -> SourceSpec:
    """`name` or `name#pages=A-B` (a PDF's pages A to B, or `#pages=A` for one page)."""
    if not isinstance(entry, str):
        raise ValueError("a source must be a string")
    name, hash_, fragment = entry.partition("#")
    check_name(name)
    if not hash_:
        return SourceSpec(entry, name)
    match = _PAGES_RE.fullmatch(fragment)
    if not match:
        raise ValueError(f"source {entry!r}: the part after # must be pages=A-B")
    if not name.lower().endswith(PDF_SUFFIXES):
        raise ValueError(f"source {entry!r}: pages can only be given for a PDF")
    first = int(match.group(1))
    last = int(match.group(2) or first)
    if not 1 <= first <= last:
        raise ValueError(f"source {entry!r}: pages must be 1 or more, first <= last")
    return SourceSpec(entry, name, (first, last))


@dataclass(frozen=True)
class Passage:
    """One passage of a chapter's material; `seq` is its number in the chapter (1..N)."""

    seq: int
    source: str  # the file's name, as the syllabus gives it (without #pages)
    where: str | None  # "page 4", or the heading it is under; None for plain text
    text: str

    @property
    def pid(self) -> str:
        return passage_id(self.seq)

    @property
    def reference(self) -> str:
        """What a question citing it stores and exports: "guide.pdf, page 4, passage p3"."""
        return reference(self.source, self.where, self.seq)


def passage_id(seq: int) -> str:
    return f"p{seq}"


def reference(source: str, where: str | None, seq: int) -> str:
    return ", ".join(filter(None, [source, where, f"passage {passage_id(seq)}"]))


@dataclass(frozen=True)
class ChapterMaterial:
    """A chapter's sources as read: each entry's file hash (what a changed file is detected
    by) and the passages cut from them."""

    hashes: dict[str, str] = field(default_factory=dict)
    passages: tuple[Passage, ...] = ()

    @property
    def hashes_json(self) -> str | None:
        """The slice column's value (storage.models.Slice.sources); None without sources."""
        import json
        return json.dumps(self.hashes, sort_keys=True) if self.hashes else None


# --- text of each kind of file ----------------------------------------------------------

Section = tuple[str | None, str]  # (where, text)


def _decode(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{label}: not UTF-8 text (byte {exc.start})") from None


def markdown_sections(text: str) -> list[Section]:
    """Sections by ATX heading (`## Title`); the text before the first heading has none."""
    sections: list[Section] = []
    where: str | None = None
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING_RE.match(line)
        if match:
            sections.append((where, "\n".join(lines)))
            where, lines = match.group(2).strip(), []
        else:
            lines.append(line)
    sections.append((where, "\n".join(lines)))
    return [(w, t) for w, t in sections if t.strip()]


class _HTMLText(HTMLParser):
    _SKIP = {"script", "style", "head", "template", "noscript"}
    _BLOCK = {"p", "div", "li", "ul", "ol", "br", "tr", "table", "section", "article",
              "blockquote", "pre", "dd", "dt", "hr"}
    _HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.where: str | None = None
        self.parts: list[str] = []
        self.heading: list[str] | None = None
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in self._SKIP:
            self.skipping += 1
        elif tag in self._HEADINGS:
            self.sections.append((self.where, "".join(self.parts)))
            self.parts, self.heading = [], []
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self._HEADINGS and self.heading is not None:
            self.where = " ".join("".join(self.heading).split()) or None
            self.heading = None
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        (self.heading if self.heading is not None else self.parts).append(data)

    def done(self) -> list[Section]:
        self.close()
        self.sections.append((self.where, "".join(self.parts)))
        return [(w, t) for w, t in self.sections if t.strip()]


def html_sections(text: str) -> list[Section]:
    parser = _HTMLText()
    parser.feed(text)
    return parser.done()


def pdf_sections(data: bytes, label: str, pages: tuple[int, int] | None) -> list[Section]:
    """One section per page ("page N", the page's number in the file), extracted in a child
    process under a work budget (examforge.pdf_extract: CPU a page and a file, memory, and
    characters of text). Refused: an encrypted or unreadable PDF, more pages than
    MAX_PDF_PAGES, pages the file lacks, a file over the budget, and a PDF with no extractable
    text (scanned pages are images)."""
    from examforge.pdf_extract import extract

    answer = extract(data, pages, MAX_PDF_PAGES)
    if "error" in answer:
        raise SourceError(f"{label}: {_one_line(str(answer['error']))}")
    count = int(answer["count"])
    if count > MAX_PDF_PAGES:
        raise SourceError(f"{label}: {count} pages, more than the {MAX_PDF_PAGES} allowed")
    if pages is not None and pages[1] > count:
        raise SourceError(f"{label}: pages {pages[0]}-{pages[1]} asked, the PDF has {count}")
    sections: list[Section] = [(where, text) for where, text in answer["sections"]]
    if not sections:
        raise SourceError(f"{label}: no extractable text in the PDF (scanned pages are "
                          "images; run OCR on it first, or give the text as notes)")
    return sections


def _one_line(text: str) -> str:
    return " ".join(_CONTROL_RE.sub(" ", text).split())[:200]


def sections_of(spec: SourceSpec, data: bytes, label: str) -> list[Section]:
    """The text of one source entry, by section. `label` names the file in messages."""
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(f"{label}: {len(data)} bytes, larger than the {MAX_SOURCE_BYTES} "
                          "allowed")
    suffix = Path(spec.name).suffix.lower()
    if suffix in PDF_SUFFIXES:
        sections = pdf_sections(data, label, spec.pages)
    elif suffix in HTML_SUFFIXES:
        sections = html_sections(_decode(data, label))
    elif suffix in (".md", ".markdown"):
        sections = markdown_sections(_decode(data, label))
    else:
        text = _decode(data, label)
        sections = [(None, text)] if text.strip() else []
    if not sections:
        raise SourceError(f"{label}: no text in it")
    from examforge.pdf_extract import MAX_SOURCE_CHARS

    chars = sum(len(text) for _, text in sections)
    if chars > MAX_SOURCE_CHARS:
        raise SourceError(f"{label}: {chars:,} characters of text, more than the "
                          f"{MAX_SOURCE_CHARS:,} allowed; split it")
    return sections


# --- passages ---------------------------------------------------------------------------

def _paragraphs(text: str) -> list[str]:
    text = _CONTROL_RE.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    blocks = re.split(r"\n[ \t]*\n", text)
    if len(blocks) == 1 and len(text) > PASSAGE_MAX_CHARS:
        blocks = text.split("\n")  # a PDF page is often lines with no blank one between
    out = []
    for block in blocks:
        words = " ".join(block.split())
        if words:
            out.extend(_cut_long(words))
    return out


def _cut_long(paragraph: str) -> list[str]:
    if len(paragraph) <= PASSAGE_MAX_CHARS:
        return [paragraph]
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE_END_RE.split(paragraph):
        while len(sentence) > PASSAGE_MAX_CHARS:  # no sentence end: cut at a space
            cut = sentence.rfind(" ", 0, PASSAGE_CHARS)
            cut = cut if cut > 0 else PASSAGE_CHARS
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > PASSAGE_CHARS:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return [p for p in pieces if p]


def cut_passages(sections: Iterable[Section]) -> list[tuple[str | None, str]]:
    """(where, text) of each passage: paragraphs of one section gathered up to about
    PASSAGE_CHARS characters, one paragraph a line. A passage never spans two sections, so
    its page or heading is exact."""
    out: list[tuple[str | None, str]] = []
    for heading, text in sections:
        where = _one_line(heading or "") or None  # a heading is file text: one clean line
        current: list[str] = []
        size = 0
        for paragraph in _paragraphs(text):
            if current and size + len(paragraph) > PASSAGE_CHARS:
                out.append((where, "\n".join(current)))
                current, size = [], 0
            current.append(paragraph)
            size += len(paragraph) + 1
        if current:
            out.append((where, "\n".join(current)))
    return out


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class TextCache(Protocol):
    """Where extracted text is kept by content (storage's `source_text`): a source is parsed
    once, and read again only when its bytes change."""

    def source_text(self, key: str) -> list[Section] | None: ...

    def keep_source_text(self, key: str, sections: Sequence[Section]) -> None: ...


def text_key(spec: SourceSpec, data: bytes) -> str:
    """What a source's extracted text depends on: its bytes, how its kind is read, and the
    pages listed. TEXT_VERSION changes when extraction changes, so that old text is not
    reused."""
    kind = Path(spec.name).suffix.lower()
    pages = f"{spec.pages[0]}-{spec.pages[1]}" if spec.pages else "all"
    return f"v{TEXT_VERSION}:{hashlib.sha256(data).hexdigest()}:{kind}:{pages}"


# Bump when sections_of reads a kind of file differently (a new extractor, another cap).
TEXT_VERSION = 1


def cached_sections(spec: SourceSpec, data: bytes, label: str,
                    cache: TextCache | None) -> list[Section]:
    """sections_of, through `cache` when there is one: a refusal is never kept, so a file
    refused once is checked again (its limits may have been raised since)."""
    if cache is None:
        return sections_of(spec, data, label)
    key = text_key(spec, data)
    found = cache.source_text(key)
    if found is not None:
        return found
    sections = sections_of(spec, data, label)
    cache.keep_source_text(key, sections)
    return sections


def read_material(entries: Sequence[str], read: Callable[[str], bytes],
                  label: Callable[[str], str], cache: TextCache | None = None
                  ) -> ChapterMaterial:
    """A chapter's material from its `sources`: `read(name)` gives a file's bytes (raising
    SourceError naming it when it cannot), `label(name)` names it in messages; `cache` keeps
    what was extracted by content."""
    hashes: dict[str, str] = {}
    passages: list[Passage] = []
    for entry in entries:
        spec = parse_entry(entry)
        data = read(spec.name)
        hashes[entry] = file_hash(data)
        for where, text in cut_passages(cached_sections(spec, data, label(spec.name),
                                                        cache)):
            passages.append(Passage(len(passages) + 1, spec.name, where, text))
    return ChapterMaterial(hashes, tuple(passages))


def read_exam_material(chapters: Iterable[tuple[str, Sequence[str] | None]],
                       read: Callable[[str], bytes], label: Callable[[str], str],
                       cache: TextCache | None = None) -> dict[str, ChapterMaterial]:
    """Every chapter's material ({chapter id: material}; a chapter without sources gets an
    empty one). Each file is read once however many chapters list it."""
    files: dict[str, bytes] = {}

    def once(name: str) -> bytes:
        if name not in files:
            files[name] = read(name)
        return files[name]

    return {cid: read_material(entries or (), once, label, cache)
            for cid, entries in chapters}


def read_file_under(folder: Path, root: Path, name: str) -> bytes:
    """The bytes of source `name` of an exam's `folder`, refused when it resolves outside
    `root` (EXAMS_DIR: a symlink out of it), is not a regular file, or is over the size cap
    (checked before it is read)."""
    check_name(name)
    path = folder / name
    label = str(path)
    try:
        resolved = path.resolve(strict=True)
    except FileNotFoundError:
        raise SourceError(f"{label}: file not found") from None
    except (OSError, RuntimeError) as exc:
        raise SourceError(f"{label}: cannot read: {exc}") from None
    if not resolved.is_relative_to(root.resolve()):
        raise SourceError(f"{label}: resolves to {resolved}, outside EXAMS_DIR {root.resolve()}")
    if not resolved.is_file():
        raise SourceError(f"{label}: not a regular file")
    size = resolved.stat().st_size
    if size > MAX_SOURCE_BYTES:
        raise SourceError(f"{label}: {size} bytes, larger than the {MAX_SOURCE_BYTES} allowed")
    try:
        with resolved.open("rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise SourceError(f"{label}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(f"{label}: larger than the {MAX_SOURCE_BYTES} bytes allowed")
    return data


# --- which passages a slice shows ---------------------------------------------------------

def slice_passages(count: int, first_number: int, target: int, chapter_target: int
                   ) -> range:
    """The passages (0-based indexes of the chapter's `count`) of the slice covering question
    numbers `first_number`..`first_number + target - 1` of `chapter_target`: passage i lies
    at question position i * chapter_target / count, and a slice takes those on its own
    numbers. Slices of a chapter thus take disjoint, contiguous shares that together cover
    all of its material. A slice on which no passage lies (fewer passages than slices) takes
    the one nearest its numbers."""
    if count <= 0 or target <= 0:
        return range(0)
    total = max(chapter_target, first_number + target - 1)
    start = -(-(first_number - 1) * count // total)  # ceil
    stop = -(-(first_number - 1 + target) * count // total)
    if stop > start:
        return range(start, min(stop, count))
    nearest = min(count - 1, (2 * (first_number - 1) + target) * count // (2 * total))
    return range(nearest, nearest + 1)


def fit(indexes: Sequence[int], tokens: Callable[[int], int], allowance: int) -> list[int]:
    """The most of `indexes` whose tokens fit `allowance`, evenly spread over them (never
    the first ones only); at least one, whatever its size."""
    if not indexes:
        return []
    sizes = {i: tokens(i) for i in indexes}
    if sum(sizes.values()) <= allowance:
        return list(indexes)
    n = len(indexes)
    # Shrink k until an even spread of k fits (sizes vary: a spread of k may not fit when
    # k - 1 does).
    k = max(1, min(n - 1, allowance * n // max(1, sum(sizes.values()))))
    while k > 1:
        picked = sorted({indexes[(2 * j + 1) * n // (2 * k)] for j in range(k)})
        if sum(sizes[i] for i in picked) <= allowance:
            return picked
        k -= 1
    return [indexes[n // 2]]


MATERIAL_HEADER = ("Course material (the passages to write from; base each question on "
                   'one passage and give its id, such as "p3", as the question\'s "source"):')
MATERIAL_FOOTER = "End of course material."
_PASSAGE_LINE_RE = re.compile(r"^\[(p\d{1,6})\] ", re.MULTILINE)


def material_block(passages: Sequence[Passage]) -> str:
    """The passages as the prompt shows them: `[p3] guide.pdf, page 4` and the passage's
    lines indented below it, so that no text of a file can pass for an id line."""
    lines = [MATERIAL_HEADER]
    for p in passages:
        lines.append(f"[{p.pid}] " + ", ".join(filter(None, [_one_line(p.source),
                                                             _one_line(p.where or "")])))
        lines.extend(f"    {line}" for line in p.text.split("\n"))
    lines.append(MATERIAL_FOOTER)
    return "\n".join(lines)


def offered_ids(text: str) -> tuple[str, ...]:
    """The passage ids a prompt's material block offers (what the mock cites)."""
    _, found, rest = text.partition(MATERIAL_HEADER)
    if not found:
        return ()
    block, _, _ = rest.partition("\n" + MATERIAL_FOOTER)  # text lines are indented
    return tuple(_PASSAGE_LINE_RE.findall(block))


def by_id(passages: Mapping[int, Passage] | Sequence[Passage]) -> dict[str, Passage]:
    values = passages.values() if isinstance(passages, Mapping) else passages
    return {p.pid: p for p in values}


@dataclass(frozen=True)
class SliceMaterial:
    """What a slice's prompts carry of its chapter's material: the block of text and the
    passages it offers, by id."""

    block: str | None = None
    offered: dict[str, Passage] = field(default_factory=dict)


# What a passage costs in the prompt beyond its text: its id line and indents.
_PASSAGE_OVERHEAD_TOKENS = 12


def slice_material(passages: Sequence[Passage], first_number: int, target: int,
                   chapter_target: int, allowance: int,
                   count_tokens: Callable[[str], int]) -> SliceMaterial:
    """The slice's own passages (`slice_passages`), an even spread of them when they do not
    fit `allowance` tokens (`fit`)."""
    if not passages:
        return SliceMaterial()
    own = list(slice_passages(len(passages), first_number, target, chapter_target))
    picked = fit(own, lambda i: count_tokens(passages[i].text) + _PASSAGE_OVERHEAD_TOKENS,
                 allowance)
    chosen = [passages[i] for i in picked]
    return SliceMaterial(material_block(chosen), {p.pid: p for p in chosen})


def ground(questions: Sequence[Question], offered: Mapping[str, Passage],
           chapter: Mapping[str, Passage] | None = None) -> list[Question]:
    """The questions with the passage each cites resolved to its reference (`source`) and
    number (`passage`); a citation of no passage offered (nor of the chapter's, when given)
    is stored as none."""
    import dataclasses

    out = []
    for q in questions:
        p = offered.get(q.source or "") or (chapter or {}).get(q.source or "")
        out.append(dataclasses.replace(q, source=p.reference if p else None,
                                       passage=p.seq if p else None))
    return out

