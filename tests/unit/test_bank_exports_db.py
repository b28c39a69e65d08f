"""The four question-bank exports, end to end from the database: an exam is generated through
the real pipeline (claim, call, validate, balance, commit) from a fake model that writes hostile
text and always puts the answer first, exported with `python -m producer export` (in this
process), read back with an independent reader per format, and compared, question by question,
with the rows in the database: text, choices, the right answer, explanation and tags.

The readers are the strict ones of the writers' own tests (ElementTree for Moodle XML and QTI,
the strict GIFT reader, sqlite3 on the .apkg's collection)."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bank_samples import HOSTILE, normalised
from fakellm import reply
from test_banks_anki import read_collection
from test_banks_gift import read_bank as read_gift
from test_banks_moodle_xml import read_bank as read_moodle_xml
from test_banks_qti import read_bank as read_qti

from examforge.levels import schedule
from examforge.llm import LLMClient
from runner.pipeline import Runtime, process_chapter
from examforge.prompt import Label, parse_difficulty, read_fields
from examforge.settings import Settings, load_settings
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from producer.cli import main
from storage import open_store

EXAM_TITLE = 'Exam <&> "quoted" / slash // colon: {x} ~ # = فارسی 🎓'
MIX = {"easy": 0.25, "medium": 0.5, "hard": 0.25}
CHAPTERS = [
    {"id": "ch-1", "title": "First & <chapter> ]]> :: deck sep {=~#}", "questions": 12,
     "difficulty": MIX, "bloom": ["apply", "remember"]},
    {"id": "ch-2", "title": "Русский / العربية 🧪 'quotes'", "questions": 9,
     "difficulty": "hard", "bloom": "analyze"},
    {"id": "ch-3", "title": "Plain chapter", "questions": 5},
]


class HostileModel:
    """A model that follows the prompt's Difficulty and Bloom lines, writes every hostile text
    of bank_samples into questions, choices and explanations, and always answers first."""

    def __init__(self) -> None:
        self.serial: Counter[str] = Counter()
        self.total = 0  # across chapters, so that every hostile text is a question somewhere
        self.asked: Counter[tuple[str, str]] = Counter()  # (chapter, level) -> asked for

    def __call__(self, request: httpx.Request) -> httpx.Response:
        fields = read_fields(json.loads(request.content)["messages"][-1]["content"])
        chapter, count = fields[Label.chapter_id], int(fields[Label.question_count])
        asked = parse_difficulty(fields.get(Label.difficulty, ""))
        for level, n in asked.items():
            self.asked[chapter, level] += n
        levels = [level for level, n in asked.items() for _ in range(n)]
        bloom = [b.strip() for b in fields.get(Label.bloom, "").split(",") if b.strip()]
        items = []
        for i in range(count):
            self.serial[chapter] += 1
            s = self.serial[chapter]
            texts = [HOSTILE[(self.total + k) % len(HOSTILE)] for k in range(4)]
            self.total += 1
            item: dict[str, Any] = {
                "question": f"{chapter} #{s}: {texts[0]}",
                "choices": [f"right {s}: {texts[0]}",
                            *(f"wrong {k} of {s}: {t}" for k, t in enumerate(texts[1:]))],
                "answer_index": 0,
                "explanation": f"Because {texts[0]} (not {texts[1]})"}
            if levels:
                item["difficulty"] = levels[min(i, len(levels) - 1)]
            if bloom:
                item["bloom"] = bloom[s % len(bloom)]
            items.append(item)
        return reply(json.dumps({"questions": items}))


@pytest.fixture
def exam(make_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[Settings, HostileModel]]:
    settings = make_settings(questions_per_call=5, slice_questions=5)
    for name in Settings.model_fields:  # the CLI reads the environment: only ours
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("EXAMS_DIR", str(settings.exams_dir))
    monkeypatch.setenv("BROKER_URL", "redis://127.0.0.1:1/0")
    model = HostileModel()
    generate(settings, model, CHAPTERS)
    yield settings, model
    load_settings.cache_clear()


def generate(settings: Settings, model: HostileModel, chapters: list[dict[str, Any]]) -> None:
    """Sync the syllabus and run every slice that needs work through the real pipeline."""
    path = write_syllabus(settings.exams_dir, "ex", {"title": EXAM_TITLE, "chapters": chapters})
    store = open_store(settings.database_url)
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=1000),
                           slice_questions=settings.slice_questions)
    rt = Runtime.build(settings, store,
                       LLMClient(settings, transport=httpx.MockTransport(model)))
    try:
        for chapter_id, slice_no in plan.slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
    finally:
        rt.close()
        store.engine.dispose()


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    root = logging.getLogger()
    mp = pytest.MonkeyPatch()
    mp.setattr(root, "handlers", list(root.handlers))  # main() points them at this stderr
    mp.setattr(root, "level", root.level)
    try:
        load_settings.cache_clear()
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
    finally:
        mp.undo()
        load_settings.cache_clear()
    return code, captured.out, captured.err


def db_rows(settings: Settings) -> list[dict[str, Any]]:
    """Every stored question, straight from the database file, in syllabus order."""
    order = {c["id"]: i for i, c in enumerate(CHAPTERS)}
    conn = sqlite3.connect(settings.database_url.removeprefix("sqlite:///"))
    try:
        rows = conn.execute("SELECT chapter_id, number, question, choices, answer_index, "
                            "explanation, difficulty, bloom FROM question").fetchall()
    finally:
        conn.close()
    out = [{"chapter_id": c, "number": n, "question": q, "choices": tuple(json.loads(ch)),
            "answer_index": a, "explanation": e,
            "tags": tuple(t for t in (d and f"difficulty:{d}", b and f"bloom:{b}") if t)}
           for c, n, q, ch, a, e, d, b in rows]
    return sorted(out, key=lambda r: (order[r["chapter_id"]], r["number"]))


def expected(row: dict[str, Any]) -> dict[str, Any]:
    """What a reader gets back of a row: line breaks of any convention are one '\\n'."""
    return {"question": normalised(row["question"]),
            "choices": tuple(normalised(c) for c in row["choices"]),
            "answer_index": row["answer_index"], "explanation": normalised(row["explanation"]),
            "tags": row["tags"]}


def export(capsys: pytest.CaptureFixture[str], settings: Settings, fmt: str,
           name: str | None = None) -> bytes:
    target = settings.exams_dir / "ex" / (name or f"out-{fmt}")
    code, _, err = cli(capsys, "export", "ex", "--format", fmt, "-o", str(target))
    assert code == 0, err
    assert err.strip() == f"wrote {len(db_rows(settings))} questions to {target}"
    return target.read_bytes()


TITLES = {c["id"]: c["title"] for c in CHAPTERS}


def test_the_database_holds_hostile_text_balanced_answers_and_the_levels_asked(exam) -> None:
    settings, model = exam
    rows = db_rows(settings)
    assert len(rows) == 26
    joined = "".join(r["question"] + "".join(r["choices"]) + r["explanation"] for r in rows)
    for needle in ("<", "&", "{", "}", "~", "#", "=", ":", '"', "'", "فارسی", "العربية",
                   "Русский", "🎓"):
        assert needle in joined, needle
    # The model always answered first; the store balanced the positions per chapter.
    for chapter in ("ch-1", "ch-2", "ch-3"):
        counts = Counter(r["answer_index"] for r in rows if r["chapter_id"] == chapter)
        assert max(counts.values()) - min(counts[p] for p in range(4)) <= 1, (chapter, counts)
    for r in rows:
        assert r["choices"][r["answer_index"]].startswith("right ")
    # The mix over ch-1's 12 questions: 3 easy, 6 medium, 3 hard, asked for and stored, though
    # the chapter is cut into slices of 5 that each steered their own share.
    ch1 = Counter(r["tags"][0] for r in rows if r["chapter_id"] == "ch-1")
    assert ch1 == {"difficulty:easy": 3, "difficulty:medium": 6, "difficulty:hard": 3}
    assert {lv: n for (c, lv), n in model.asked.items() if c == "ch-1"} == \
        {"easy": 3, "medium": 6, "hard": 3} == dict(schedule(MIX, 1, 12))
    assert {r["tags"] for r in rows if r["chapter_id"] == "ch-2"} == \
        {("difficulty:hard", "bloom:analyze")}
    assert {r["tags"][1] for r in rows if r["chapter_id"] == "ch-1"} == \
        {"bloom:apply", "bloom:remember"}
    assert {r["tags"] for r in rows if r["chapter_id"] == "ch-3"} == {()}


def test_moodle_xml_round_trips_every_question_from_the_database(exam, capsys) -> None:
    settings, _ = exam
    rows = db_rows(settings)
    read = read_moodle_xml(export(capsys, settings, "moodle-xml"))
    assert len(read) == len(rows)
    for (category, got), row in zip(read, rows):
        assert category == ["$course$", "top", EXAM_TITLE, TITLES[row["chapter_id"]]]
        assert got == {"name": f"{row['chapter_id']}-{row['number']:04d}", **expected(row)}


def test_gift_round_trips_every_question_from_the_database(exam, capsys) -> None:
    settings, _ = exam
    rows = db_rows(settings)
    read = read_gift(export(capsys, settings, "gift"))
    assert len(read) == len(rows)
    for (category, got), row in zip(read, rows):
        assert category == ["$course$", "top", EXAM_TITLE, TITLES[row["chapter_id"]]]
        assert got == {"name": f"{row['chapter_id']}-{row['number']:04d}", **expected(row)}


def test_qti_round_trips_every_question_from_the_database(exam, capsys) -> None:
    settings, _ = exam
    rows = db_rows(settings)
    package, read = read_qti(export(capsys, settings, "qti"))
    assert "imsmanifest.xml" in package.names
    assert len(read) == len(rows)
    for (section, got), row in zip(read, rows):
        assert section == TITLES[row["chapter_id"]]
        assert got == {"title": f"{row['chapter_id']}-{row['number']:04d}", **expected(row)}


def _anki_notes(data: bytes, tmp_path: Path) -> list[dict[str, Any]]:
    from bank_samples import strict_unhtml

    col = read_collection(data, tmp_path)
    out = []
    for guid, _, flds, tags, did in col.notes:
        question, *choices, letter, explanation = flds.split("\x1f")
        out.append({"guid": guid, "deck": col.decks[did].split("::"), "got": {
            "question": strict_unhtml(question),
            "choices": tuple(strict_unhtml(c) for c in choices),
            "answer_index": "ABCD".index(letter), "explanation": strict_unhtml(explanation),
            "tags": tuple(tags.split())}})
    return out


def test_anki_round_trips_and_keeps_its_guids_when_the_bank_grows(exam, capsys,
                                                                  tmp_path) -> None:
    settings, model = exam
    rows = db_rows(settings)
    notes = _anki_notes(export(capsys, settings, "anki", "bank.apkg"), tmp_path)
    assert len(notes) == len(rows)
    for note, row in zip(notes, rows):
        assert note["deck"] == [EXAM_TITLE, TITLES[row["chapter_id"]].replace("::", ": :")]
        assert note["got"] == expected(row)
    before = {n["got"]["question"]: n["guid"] for n in notes}
    # More questions for ch-3 (and the same export again): every old note keeps its GUID,
    # so Anki updates it instead of adding a duplicate; the new ones get GUIDs of their own.
    grown = [*CHAPTERS[:2], {**CHAPTERS[2], "questions": 9}]
    generate(settings, model, grown)
    again = _anki_notes(export(capsys, settings, "anki", "bank.apkg"), tmp_path)
    after = {n["got"]["question"]: n["guid"] for n in again}
    assert len(after) == len(rows) + 4
    assert {q: after[q] for q in before} == before
    assert len(set(after.values())) == len(after)


def test_a_second_export_is_byte_for_byte_the_same(exam, capsys) -> None:
    settings, _ = exam
    for fmt in ("moodle-xml", "gift"):
        assert export(capsys, settings, fmt, "one") == export(capsys, settings, fmt, "two")


def test_default_names_and_stdout_for_the_text_formats(exam, capsys) -> None:
    settings, _ = exam
    folder = settings.exams_dir / "ex"
    for fmt, name in (("moodle-xml", "generated.xml"), ("gift", "generated.gift.txt"),
                      ("anki", "generated.apkg"), ("qti", "generated.qti.zip"),
                      ("csv", "generated.csv")):
        code, _, err = cli(capsys, "export", "ex", "--format", fmt)
        assert code == 0 and err.strip() == f"wrote 26 questions to {folder / name}", err
        assert (folder / name).stat().st_size > 0
    code, out, _ = cli(capsys, "export", "ex", "--format", "gift", "-o", "-")
    assert code == 0 and out.encode() == (folder / "generated.gift.txt").read_bytes()
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("fmt, suffix", [("anki", ".apkg"), ("qti", ".qti.zip")])
def test_binary_formats_refuse_stdout_in_one_line(exam, capsys, fmt: str, suffix: str) -> None:
    settings, _ = exam
    before = sorted(p.name for p in (settings.exams_dir / "ex").iterdir())
    code, out, err = cli(capsys, "export", "ex", "--format", fmt, "-o", "-")
    assert code == 2 and out == ""
    assert sorted(p.name for p in (settings.exams_dir / "ex").iterdir()) == before
    assert err.strip() == f"error: -o -: {fmt} is a binary format ({suffix}); write it to a file"


def test_table_formats_carry_difficulty_and_bloom(exam, capsys) -> None:
    import csv
    import io

    settings, _ = exam
    rows = {(r["chapter_id"], r["number"]): r for r in db_rows(settings)}
    lines = export(capsys, settings, "jsonl").decode().splitlines()
    for line in lines:
        item = json.loads(line)
        tags = rows[item["chapter_id"], item["number"]]["tags"]
        assert tuple(f"{k}:{item[k]}" for k in ("difficulty", "bloom") if item[k]) == tags
    table = list(csv.DictReader(io.StringIO(export(capsys, settings, "csv").decode())))
    assert len(table) == len(rows)
    for item in table:
        tags = rows[item["chapter_id"], int(item["number"])]["tags"]
        assert tuple(f"{k}:{item[k]}" for k in ("difficulty", "bloom") if item[k]) == tags


def test_a_failed_bank_export_leaves_the_old_file_and_no_temporary(exam, capsys,
                                                                   monkeypatch) -> None:
    from examforge import banks

    settings, _ = exam
    target = settings.exams_dir / "ex" / "bank.apkg"
    old = export(capsys, settings, "anki", "bank.apkg")

    def half_then_fail(fmt: str, outline: Any, questions: Any, out: Any) -> int:
        out.write(b"PK\x03\x04 half a zip")
        raise ValueError("question ch-1/3: character '\\x00' cannot be exported")

    monkeypatch.setattr(banks, "write_bank", half_then_fail)
    code, _, err = cli(capsys, "export", "ex", "--format", "anki", "-o", str(target))
    assert code == 2
    assert err.strip() == ("error: export anki: question ch-1/3: character '\\x00' cannot be "
                           "exported")
    assert target.read_bytes() == old
    assert sorted(p.name for p in target.parent.iterdir() if p.name.startswith(".")) == []


def test_the_cli_offers_every_export_format() -> None:
    from producer import cli as cli_module
    from producer.export import FORMATS

    assert cli_module._EXPORT_FORMATS == FORMATS


def test_store_rows_become_bank_questions_one_at_a_time() -> None:
    from producer.export import bank_questions

    pulled: list[int] = []

    def rows() -> Iterator[dict[str, Any]]:
        for n in range(1, 1_000_000):
            pulled.append(n)
            yield {"chapter_id": "a", "number": n, "question": f"Q{n}?",
                   "choices": ["w", "x", "y", "z"], "answer_index": n % 4, "explanation": "",
                   "difficulty": "hard" if n % 2 else None, "bloom": None}

    stream = bank_questions(rows())
    first, second = next(stream), next(stream)
    assert pulled == [1, 2]  # a bank of any size is read as it is written
    assert (first.tags, second.tags) == (("difficulty:hard",), ())
