"""export's SQLite fast path (producer/export_sqlite.py) writes the same bytes as the store's
path in every table format, and steps aside for everything it does not handle."""

from __future__ import annotations

import sqlite3

import pytest

from bench.seed import seed_exam
from producer import export_sqlite
from producer.export import render
from storage import open_existing_store
from storage.db import SCHEMA_REVISION


@pytest.fixture()
def seeded(tmp_path):  # type: ignore[no-untyped-def]
    db = tmp_path / "ef.db"
    url = f"sqlite:///{db}"
    seed_exam(url, "ex", 57, 4)
    conn = sqlite3.connect(db)
    with conn:  # what seeding leaves out: levels, non-ASCII text, quotes and commas for CSV
        conn.execute("UPDATE question SET difficulty = 'hard', bloom = 'apply', "
                     "question = 'Größe, \"quoted\"?\n' || question WHERE number % 3 = 0")
        conn.execute("UPDATE question SET created_at = created_at + 0.7 WHERE number % 5 = 0")
    conn.close()
    return url, db


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
def test_the_fast_path_writes_the_same_bytes_as_the_store(seeded, tmp_path, fmt):
    url, _ = seeded
    store = open_existing_store(url)
    expected = render(store.iter_questions("ex"), fmt)
    store.engine.dispose()
    target = tmp_path / f"out.{fmt}"
    assert export_sqlite.export(url, tmp_path, "ex", fmt, str(target)) == 57
    assert target.read_bytes() == expected.encode("utf-8")


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_approved_only_and_rejected_questions_match_the_store(seeded, tmp_path, fmt):
    url, _ = seeded
    store = open_existing_store(url)
    items = store.chapter_questions("ex", store.review_summary("ex")[0].chapter_id)[1]
    for q in items[:5]:
        store.approve("ex", q["id"], 1, "unit")
    store.edit("ex", items[1]["id"], 2, "unit", {"explanation": "Edited, then approved."})
    store.approve("ex", items[1]["id"], 3, "unit")
    store.reject("ex", items[6]["id"], 1, "unit")
    every = render(store.iter_questions("ex"), fmt)
    approved = render(store.iter_questions("ex", approved_only=True), fmt)
    store.engine.dispose()
    target = tmp_path / f"out.{fmt}"
    assert export_sqlite.export(url, tmp_path, "ex", fmt, str(target)) == 56  # one rejected
    assert target.read_bytes() == every.encode("utf-8")
    assert export_sqlite.export(url, tmp_path, "ex", fmt, str(target), approved_only=True) == 5
    assert target.read_bytes() == approved.encode("utf-8")
    assert "Edited, then approved." in target.read_text()


def test_the_default_target_is_the_exams_folder(seeded, tmp_path):
    url, _ = seeded
    (tmp_path / "exams" / "ex").mkdir(parents=True)
    assert export_sqlite.export(url, tmp_path / "exams", "ex", "jsonl", None) == 57
    assert len((tmp_path / "exams" / "ex" / "generated.jsonl").read_text().splitlines()) == 57


def test_what_it_does_not_handle_goes_the_store_way(seeded, tmp_path):
    url, db = seeded
    out = str(tmp_path / "x")
    assert export_sqlite.export(url, tmp_path, "nope", "jsonl", out) is None  # unknown exam
    assert export_sqlite.export(url, tmp_path, "ex", "gift", out) is None  # a bank format
    assert export_sqlite.export("postgresql://u@h/db", tmp_path, "ex", "jsonl", out) is None
    assert export_sqlite.export(f"sqlite:///{tmp_path}/missing.db", tmp_path, "ex", "jsonl",
                                out) is None
    assert not (tmp_path / "missing.db").exists()  # never created
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    conn.close()
    assert export_sqlite.export(url, tmp_path, "ex", "jsonl", out) is None  # older schema
    assert not (tmp_path / "x").exists()


def test_the_newest_migration_file_is_the_schema_revision():
    from producer.sqlite_file import head_revision

    assert head_revision() == SCHEMA_REVISION


@pytest.mark.parametrize("rows", [
    [],
    [{}],
    [{"a": 1}],
    [{"exam": "ex", "choices": ["é", "b\n\"c\"", "", "\u2028"], "n": None, "f": 1.5e-7,
      "t": True, "created_at": "2027-01-15T08:00:01+00:00"},
     {"exam": "ex", "choices": [], "nested": {"x": [1, {"y": 2}]}},
     {"exam": "ex", "choices": [[1, 2], []]},
     {"exam": "ex", "choices": ("a", "b")},
     {1: "an int key"}],
])
def test_json_is_exactly_what_json_dumps_with_indent_2_gives(rows):
    import io
    import json

    from producer.export import write_json

    out = io.StringIO()
    assert write_json(rows, out, dated=True) == len(rows)
    assert out.getvalue() == json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
