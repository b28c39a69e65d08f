"""Anki .apkg: open the zip, read its SQLite collection with sqlite3."""

from __future__ import annotations

import dataclasses
import io
import json
import sqlite3
import tempfile
import zipfile
from pathlib import Path

from bank_samples import hostile_exam, hostile_questions, normalised, strict_unhtml

from examforge.banks import BankExam, BankQuestion, write_bank
from examforge.banks import anki as anki_writer


@dataclasses.dataclass
class Collection:
    decks: dict[int, str]  # id -> name
    models: dict[str, dict]
    notes: list[tuple[str, int, str, str, int]]  # guid, model id, fields, tags, deck id


def read_collection(data: bytes, tmp_path: Path) -> Collection:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert set(zf.namelist()) >= {"collection.anki2", "media"}
        db = tmp_path / "collection.anki2"
        db.write_bytes(zf.read("collection.anki2"))
    conn = sqlite3.connect(db)
    try:
        decks_json, models_json = conn.execute("SELECT decks, models FROM col").fetchone()
        decks = {int(k): v["name"] for k, v in json.loads(decks_json).items()}
        models = json.loads(models_json)
        notes = conn.execute(
            "SELECT n.guid, n.mid, n.flds, n.tags, c.did FROM notes n JOIN cards c ON c.nid = n.id "
            "ORDER BY n.id").fetchall()
        assert conn.execute("SELECT count(*) FROM cards").fetchone() == (len(notes),)
    finally:
        conn.close()
    return Collection(decks, models, notes)


def _export(exam: BankExam, questions: list[BankQuestion], tmp_path: Path) -> Collection:
    out = io.BytesIO()
    assert write_bank("anki", exam, iter(questions), out) == len(questions)
    return read_collection(out.getvalue(), tmp_path)


def _anki_tag(tag: str) -> str:
    return "_".join(tag.replace('"', "").split())


def test_every_question_choice_answer_explanation_and_tag_round_trips(tmp_path):
    exam, questions = hostile_exam(), hostile_questions()
    col = _export(exam, questions, tmp_path)
    assert len(col.notes) == len(questions)
    titles = {c.id: c.title for c in exam.chapters}
    [model] = col.models.values()
    assert [f["name"] for f in model["flds"]] == ["Question", "A", "B", "C", "D", "Answer",
                                                  "Explanation"]
    for (_, mid, flds, tags, did), q in zip(col.notes, questions):
        assert str(mid) == str(model["id"])
        question, *choices, letter, explanation = flds.split("\x1f")
        assert strict_unhtml(question) == normalised(q.question)
        assert tuple(strict_unhtml(c) for c in choices) == tuple(normalised(c) for c in q.choices)
        assert "ABCD".index(letter) == q.answer_index
        assert strict_unhtml(explanation) == normalised(q.explanation)
        assert tags.split() == [_anki_tag(t) for t in q.tags]
        # The chapter title's own "::" must not make a deeper deck.
        assert col.decks[did].split("::") == [exam.title, titles[q.chapter_id].replace("::", ": :")]


def test_one_deck_per_exam_and_a_subdeck_per_chapter_with_questions(tmp_path):
    exam = hostile_exam()
    decks = _export(exam, hostile_questions(), tmp_path).decks
    names = sorted(name for name in decks.values() if name != "Default")
    assert names == sorted([exam.title, f"{exam.title}::First & <chapter> ]]> : : deck sep",
                            f"{exam.title}::Second / chapter {{x}} \\n"])


def test_guids_and_deck_ids_are_the_same_across_exports_and_differ_between_questions(tmp_path):
    exam, questions = hostile_exam(), hostile_questions()
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    first = _export(exam, questions, tmp_path / "1")
    # An updated bank: every text edited. Identity is slug, chapter and number, not content.
    edited = [dataclasses.replace(q, question=q.question + " (edited)", explanation="new")
              for q in questions]
    second = _export(exam, edited, tmp_path / "2")
    assert first.decks == second.decks
    assert first.models.keys() == second.models.keys()
    guids = [n[0] for n in first.notes]
    assert guids == [n[0] for n in second.notes]
    assert [n[4] for n in first.notes] == [n[4] for n in second.notes]
    # Unique, including the two questions whose fields are identical (genanki#61).
    assert len(set(guids)) == len(guids)
    twin, last = questions[1], questions[-1]
    assert (twin.question, twin.choices) == (last.question, last.choices)


def test_the_exam_slug_is_part_of_the_identity(tmp_path):
    exam, questions = hostile_exam(), hostile_questions()[:3]
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    one = _export(exam, questions, tmp_path / "1")
    other = _export(dataclasses.replace(exam, slug="other-exam"), questions, tmp_path / "2")
    assert not {n[0] for n in one.notes} & {n[0] for n in other.notes}
    default_deck = {1}
    assert not (set(one.decks) - default_deck) & (set(other.decks) - default_deck)


def test_anki_itself_updates_the_notes_of_a_reimported_bank_instead_of_duplicating(
        tmp_path, monkeypatch):
    from anki import import_export_pb2
    from anki.collection import Collection

    exam, questions = hostile_exam(), hostile_questions()
    col = Collection(str(tmp_path / "collection.anki2"))
    try:
        def import_bank(bank: list[BankQuestion], now: float):  # -> Anki's ImportLogWithChanges.Log
            monkeypatch.setattr(anki_writer, "_now", lambda: now)
            path = tmp_path / f"bank-{now}.apkg"
            with path.open("wb") as f:
                write_bank("anki", exam, iter(bank), f)
            request = import_export_pb2.ImportAnkiPackageRequest(
                package_path=str(path), options=import_export_pb2.ImportAnkiPackageOptions())
            return col.import_anki_package(request).log  # Anki's defaults: update if newer

        first = import_bank(questions, now=1_800_000_000.0)
        assert len(first.new) == len(questions) and not first.updated
        edited = [dataclasses.replace(q, explanation=f"{q.explanation} (edited)")
                  for q in questions]
        second = import_bank(edited, now=1_800_000_100.0)
        assert not second.new and len(second.updated) == len(questions)
        assert col.note_count() == len(questions)
        explanations = {col.get_note(nid).fields[-1] for nid in col.find_notes("")}
        assert all(e.endswith("(edited)") for e in explanations)
        deck_names = {d.name for d in col.decks.all_names_and_ids()}
        assert f"{exam.title}::{exam.chapters[1].title.replace('::', ': :')}" in deck_names
    finally:
        col.close()


def test_the_export_leaves_no_temporary_file_behind(tmp_path, monkeypatch):
    # genanki's own Package.write_to_file leaves its temporary collection in the temp dir.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    write_bank("anki", hostile_exam(), hostile_questions(), io.BytesIO())
    assert list(scratch.iterdir()) == []
