"""Anki `.apkg`, built with genanki.

One deck per exam (`<exam title>`) with a subdeck per chapter (`<exam title>::<chapter title>`)
and one note per question, of a multiple-choice note type whose front shows the question and
the four choices and whose back names and highlights the right one, then the explanation.

Identity, so that importing an updated bank updates notes instead of duplicating them:
- note GUID = genanki.guid_for("examforge", exam slug, chapter id, number). genanki's default
  derives it from the fields, so two notes with the same text collide and any edit makes a new
  note (genanki#61); Anki matches an imported note to an existing one by GUID.
- deck ids from the exam slug (and chapter id), the note type id a constant: stable across
  exports, so re-imports land in the same decks and note type. The note type is part of the
  contract: Anki updates a note only from a file whose note type matches the one it has, so
  new fields (which need a new `MODEL_NAME`, hence id) make a re-import report the existing
  notes as conflicting, unless the teacher ticks "Merge note types" (checked with Anki 26.9).

genanki keeps every note in memory and writes the collection at the end, so unlike the text
formats this one holds the whole bank (a few hundred bytes a question) until it is written.

Fields are HTML (`as_html`). Anki tags cannot contain spaces (genanki refuses them) or `"`:
whitespace runs become `_` and `"` is dropped. Choices are shown in the stored order.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import tempfile
import time
import zipfile
from typing import BinaryIO, Iterable

import genanki

from examforge.banks.model import BankChapter, BankExam, BankQuestion, checked
from examforge.banks.text import as_html, one_line, stable_id

MODEL_NAME = "examforge multiple choice v1"
MODEL_ID = stable_id("examforge-anki-model", MODEL_NAME)
LETTERS = ("A", "B", "C", "D")
FIELDS = ("Question", *LETTERS, "Answer", "Explanation")

_FRONT = """\
<div class="ef-question">{{Question}}</div>
<ol class="ef-choices">
<li id="ef-choice-A"><span class="ef-letter">A.</span> {{A}}</li>
<li id="ef-choice-B"><span class="ef-letter">B.</span> {{B}}</li>
<li id="ef-choice-C"><span class="ef-letter">C.</span> {{C}}</li>
<li id="ef-choice-D"><span class="ef-letter">D.</span> {{D}}</li>
</ol>"""

# The letter is spelled out for every client; the highlight is a bonus where scripts run.
_BACK = """\
{{FrontSide}}
<hr id="answer">
<div class="ef-answer">Answer: <b>{{Answer}}</b></div>
<div class="ef-explanation">{{Explanation}}</div>
<script>
(function () {
  var choice = document.getElementById("ef-choice-" + "{{text:Answer}}".trim());
  if (choice) { choice.classList.add("ef-correct"); }
})();
</script>"""

_CSS = """\
.card { font-family: sans-serif; font-size: 18px; text-align: left; }
.ef-choices { list-style: none; padding-left: 0; }
.ef-choices li { margin: 0.3em 0; }
.ef-letter { font-weight: bold; }
.ef-correct { background: #d4f4d4; }
.ef-answer { margin: 0.5em 0; }
"""

MODEL = genanki.Model(
    MODEL_ID,
    MODEL_NAME,
    fields=[{"name": name} for name in FIELDS],
    templates=[{"name": "Multiple choice", "qfmt": _FRONT, "afmt": _BACK}],
    css=_CSS,
)


# Items of the other types (examforge.item_types) are notes of a note type of their own, so
# that the four-choice note type, and with it every bank exported before, is unchanged: the
# front shows the question (and a multi's choices, lettered, or "True or false?"), the back
# the answer in words: the correct letters and choices, True or False, the accepted answers,
# or the value with its tolerance and unit.
TYPED_MODEL_NAME = "examforge item v1"
TYPED_MODEL_ID = stable_id("examforge-anki-model", TYPED_MODEL_NAME)
TYPED_FIELDS = ("Question", "Type", "Choices", "Answer", "Explanation")
TYPED_MODEL = genanki.Model(
    TYPED_MODEL_ID,
    TYPED_MODEL_NAME,
    fields=[{"name": name} for name in TYPED_FIELDS],
    templates=[{"name": "Item", "qfmt": (
        '<div class="ef-question">{{Question}}</div>\n'
        '<div class="ef-type">{{Type}}</div>\n'
        "{{#Choices}}<ol class=\"ef-choices\">{{Choices}}</ol>{{/Choices}}"),
        "afmt": ('{{FrontSide}}\n<hr id="answer">\n'
                 '<div class="ef-answer">Answer: <b>{{Answer}}</b></div>\n'
                 '<div class="ef-explanation">{{Explanation}}</div>')}],
    css=_CSS,
)
TYPE_LINES = {"multi": "Select all that apply.", "truefalse": "True or false?",
              "short": "Answer in a few words.", "numeric": "Give a number."}
MULTI_LETTERS = ("A", "B", "C", "D", "E", "F")


def typed_answer(q: BankQuestion) -> str:
    """The back of an item of another type than mcq, as plain text."""
    from examforge.banks.moodle_xml import number
    from examforge.item_types import absolute_tolerance

    if q.type == "multi":
        return "; ".join(f"{MULTI_LETTERS[i]}. {q.choices[i]}" for i in q.correct)
    if q.type == "truefalse":
        return "True" if q.answer["value"] else "False"
    if q.type == "short":
        return " / ".join(q.answer["accepted"])
    unit = f" {q.answer['unit']}" if q.answer.get("unit") else ""
    return (f"{number(q.answer['value'])}{unit} "
            f"(± {number(absolute_tolerance(q.answer))}{unit})")


def deck_name(*titles: str) -> str:
    """Anki reads `::` as a subdeck separator, so a title's own `::` is broken up."""
    return "::".join(one_line(t).replace("::", ": :") for t in titles)


def exam_deck_id(exam: BankExam) -> int:
    return stable_id("examforge-anki-deck", exam.slug)


def chapter_deck_id(exam: BankExam, chapter: BankChapter) -> int:
    return stable_id("examforge-anki-deck", exam.slug, chapter.id)


def note_guid(exam: BankExam, q: BankQuestion) -> str:
    return str(genanki.guid_for("examforge", exam.slug, q.chapter_id, q.number))


def anki_tag(tag: str) -> str:
    """A tag Anki keeps as one tag: no whitespace (it separates tags) and no `"`."""
    return "_".join(tag.replace('"', "").split())


def _note(exam: BankExam, q: BankQuestion) -> genanki.Note:
    tags = [t for t in map(anki_tag, q.tags) if t]
    if q.type != "mcq":
        choices = "".join(f'<li><span class="ef-letter">{MULTI_LETTERS[i]}.</span> '
                          f"{as_html(c)}</li>" for i, c in enumerate(q.choices))
        fields = [as_html(q.question), TYPE_LINES[q.type], choices,
                  as_html(typed_answer(q)), as_html(q.feedback)]
        return genanki.Note(model=TYPED_MODEL, fields=fields, tags=tags,
                            guid=note_guid(exam, q))
    fields = [as_html(q.question), *(as_html(c) for c in q.choices),
              LETTERS[q.answer_index], as_html(q.feedback)]  # the back: with the source
    return genanki.Note(model=MODEL, fields=fields, tags=tags, guid=note_guid(exam, q))


def _now() -> float:
    """The notes' modification time: "now", so that a re-import counts as newer and Anki's
    default ("update notes if newer") updates them. The one clock seam, for tests."""
    return time.time()


def _write_apkg(package: genanki.Package, out: BinaryIO, timestamp: float) -> None:
    """genanki's Package.write_to_file without its leak: it never deletes the temporary
    collection it builds (one file per export, as large as the bank)."""
    with tempfile.TemporaryDirectory(prefix="examforge-anki-") as tmp:
        db = os.path.join(tmp, "collection.anki2")
        conn = sqlite3.connect(db)
        try:
            # Note and card ids count up from the time in ms, as genanki's own writer does.
            package.write_to_db(conn.cursor(), timestamp, itertools.count(int(timestamp * 1000)))
            conn.commit()
        finally:
            conn.close()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.write(db, "collection.anki2")
            zf.writestr("media", "{}")  # no media files


def write(exam: BankExam, questions: Iterable[BankQuestion], out: BinaryIO) -> int:
    """Write the bank as an .apkg (a zip holding an SQLite collection) to `out`."""
    decks: dict[str, genanki.Deck] = {}
    count = 0
    for chapter, q in checked(exam, questions):
        deck = decks.get(chapter.id)
        if deck is None:
            name = deck_name(exam.title, chapter.title)
            deck = genanki.Deck(chapter_deck_id(exam, chapter), name)
            decks[chapter.id] = deck
        deck.add_note(_note(exam, q))
        count += 1
    top = genanki.Deck(exam_deck_id(exam), deck_name(exam.title))
    _write_apkg(genanki.Package([top, *decks.values()]), out, _now())
    return count
