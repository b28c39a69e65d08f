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


def _text(data):  # type: ignore[no-untyped-def]
    return lambda f: f.write(data)


def test_write_atomic_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "generated.jsonl"
    write_atomic(target, _text("old\n"))

    def boom(fd):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(target, _text("new\n"))
    assert target.read_text() == "old\n"
    assert [p.name for p in target.parent.iterdir()] == ["generated.jsonl"]  # no temp left


def test_export_to_stdout(capsys):
    export(ROWS, "jsonl", "-")
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_a_missing_directory_is_refused_not_created(tmp_path):
    from examforge.errors import UserError

    with pytest.raises(UserError) as info:
        export(ROWS, "jsonl", str(tmp_path / "nope" / "out.jsonl"))
    assert "does not exist" in str(info.value)
    assert not (tmp_path / "nope").exists()


def test_an_export_gets_the_usual_file_mode_not_a_private_one(tmp_path):
    old = os.umask(0o022)
    try:
        export(ROWS, "csv", str(tmp_path / "out.csv"))
    finally:
        os.umask(old)
    assert (tmp_path / "out.csv").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
def test_the_writers_stream_the_rows(tmp_path, fmt):
    """A generator that checks the file already holds the earlier rows when it is asked for
    the next one: nothing is collected in memory first."""
    target = tmp_path / f"out.{fmt}"
    seen: list[int] = []

    def rows():  # type: ignore[no-untyped-def]
        for i in range(1, 2001):
            if i == 1500:
                tmp = [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
                seen.append(tmp[0].stat().st_size if tmp else 0)
            yield {**ROWS[0], "number": i}

    assert export(rows(), fmt, str(target)) == 2000
    assert seen and seen[0] > 0  # bytes were on disk before the last rows were read
    if fmt == "json":
        assert [r["number"] for r in json.loads(target.read_text())] == list(range(1, 2001))
    if fmt == "jsonl":
        assert len(target.read_text().splitlines()) == 2000


def test_json_streamed_reads_back_as_the_rows_and_an_empty_bank_is_an_empty_list():
    assert json.loads(render([], "json")) == []
    assert json.loads(render(ROWS, "json"))[1]["question"] == ROWS[1]["question"]
