"""Export formats and the atomic write."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from producer.export import export, render, write_atomic

ROWS = [
    {"exam": "ex", "chapter_id": "a", "number": i, "question": f"Q{i}, with \"quotes\"?",
     "choices": ["w", "x", "y", "z"], "answer_index": i % 4, "explanation": "é",
     "model": "m", "created_at": 1_800_000_000.0 + i}
    for i in (1, 2)
]


def test_jsonl_has_one_object_per_question_with_the_contract_fields():
    lines = render(ROWS, "jsonl").splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert {"exam", "chapter_id", "question", "choices", "answer_index", "explanation"} <= set(first)
    assert first["choices"] == ["w", "x", "y", "z"] and first["answer_index"] == 1
    assert first["created_at"] == "2027-01-15T08:00:01+00:00"
    assert "é" in lines[0]  # not escaped


def test_json_is_one_array_and_csv_has_one_column_per_choice():
    assert [r["number"] for r in json.loads(render(ROWS, "json"))] == [1, 2]
    table = list(csv.reader(io.StringIO(render(ROWS, "csv"))))
    assert table[0][4:8] == ["choice_a", "choice_b", "choice_c", "choice_d"]
    assert table[1][3] == 'Q1, with "quotes"?' and table[1][4:8] == ["w", "x", "y", "z"]


def test_write_atomic_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "out" / "generated.jsonl"
    write_atomic(target, "old\n")

    def boom(fd):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in target.parent.iterdir()] == ["generated.jsonl"]  # no temp left


def test_export_to_stdout(capsys):
    export(ROWS, "jsonl", "-")
    assert len(capsys.readouterr().out.splitlines()) == 2
