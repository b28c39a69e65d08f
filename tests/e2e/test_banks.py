"""Question banks through the real CLI processes, on PostgreSQL: a mock that always puts the
answer first and labels what the prompt asks for, `producer run`, then `producer export` in
every bank format, read back with ElementTree (Moodle XML, QTI), the GIFT reader and sqlite3
(.apkg), and compared with the database."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter
from pathlib import Path

import pytest

# The strict readers live with the writers' unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from bank_samples import strict_unhtml  # noqa: E402
from test_banks_gift import read_bank as read_gift  # noqa: E402
from test_banks_qti import read_bank as read_qti  # noqa: E402

pytestmark = pytest.mark.e2e

MIX = {"easy": 0.3, "medium": 0.5, "hard": 0.2}


def test_run_and_export_every_bank_format_on_postgres(deploy, mock, tmp_path: Path) -> None:
    mock.configure(answer_position=0)
    dep = deploy("postgres", questions_per_call=8, slice_questions=20)
    dep.syllabus("banks", {"title": "Banks <&> فارسی 🎓", "chapters": [
        {"id": "mixed", "title": "Mixed {=~#}", "questions": 40, "difficulty": MIX,
         "bloom": ["apply", "analyze"]},
        {"id": "plain", "title": "Plain", "questions": 12}]})
    run = dep.cli_in_process("run", "banks", "--concurrency", "4", timeout=120)
    assert run.returncode == 0, run.stderr
    rows = dep.store.questions("banks")
    assert len(rows) == 52
    for chapter, n in (("mixed", 40), ("plain", 12)):
        counts = Counter(r["answer_index"] for r in rows if r["chapter_id"] == chapter)
        assert sorted(counts[p] for p in range(4)) == [n // 4] * 4, counts  # 10 or 3 each
    assert Counter(r["difficulty"] for r in rows if r["chapter_id"] == "mixed") == \
        {"easy": 12, "medium": 20, "hard": 8}
    expected = [(r["question"], tuple(r["choices"]), r["answer_index"],
                 tuple(f"{k}:{r[k]}" for k in ("difficulty", "bloom") if r[k])) for r in rows]

    folder = dep.workdir / "exams" / "banks"
    for fmt in ("moodle-xml", "gift", "anki", "qti"):
        done = dep.cli_in_process("export", "banks", "--format", fmt)
        assert done.returncode == 0, done.stderr
    refused = dep.cli_in_process("export", "banks", "--format", "qti", "-o", "-")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == ("error: -o -: qti is a binary format (.qti.zip); write "
                                      "it to a file")

    quiz = ET.parse(folder / "generated.xml").getroot()
    moodle = []
    for q in quiz.findall("question[@type='multichoice']"):
        answers = q.findall("answer")
        moodle.append((strict_unhtml(q.findtext("questiontext/text") or ""),
                       tuple(strict_unhtml(a.findtext("text") or "") for a in answers),
                       [a.get("fraction") for a in answers].index("100"),
                       tuple(t.findtext("text") for t in q.findall("tags/tag"))))
    assert moodle == expected

    gift = [(g["question"], g["choices"], g["answer_index"], g["tags"])
            for _, g in read_gift((folder / "generated.gift.txt").read_bytes())]
    assert gift == expected

    _, items = read_qti((folder / "generated.qti.zip").read_bytes())
    assert [(i["question"], i["choices"], i["answer_index"], i["tags"]) for _, i in items] == \
        expected

    with zipfile.ZipFile(io.BytesIO((folder / "generated.apkg").read_bytes())) as zf:
        (tmp_path / "collection.anki2").write_bytes(zf.read("collection.anki2"))
    conn = sqlite3.connect(tmp_path / "collection.anki2")
    try:
        notes = conn.execute("SELECT flds, tags FROM notes ORDER BY id").fetchall()
        decks = {d["name"] for d in json.loads(conn.execute("SELECT decks FROM col").fetchone()[0])
                 .values()}
    finally:
        conn.close()
    anki = []
    for flds, tags in notes:
        question, *choices, letter, _ = flds.split("\x1f")
        anki.append((strict_unhtml(question), tuple(strict_unhtml(c) for c in choices),
                     "ABCD".index(letter), tuple(tags.split())))
    assert anki == expected
    assert {"Banks <&> فارسی 🎓::Mixed {=~#}", "Banks <&> فارسی 🎓::Plain"} <= decks
