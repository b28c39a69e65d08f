"""producer import's file reader and prune's DURATION, without a database."""

from __future__ import annotations

import json

import pytest

from examforge.output import ItemInvalid, check_item
from examforge.errors import BadImportLine
from producer.importer import check_chapters, read_file
from producer.prune import parse_duration_s

GOOD = {"chapter_id": "a", "question": "Why?", "choices": ["w", "x", "y", "z"],
        "answer_index": 2, "explanation": "because"}


@pytest.mark.parametrize("text, seconds", [
    ("0s", 0), ("45s", 45), ("30m", 1800), ("12h", 43200), ("7d", 604800), (" 2d ", 172800)])
def test_durations(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "1.5h", "-1d", "7days", "1w", "7D", "1h30m"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_s(text)


@pytest.mark.parametrize("change, field, reason", [
    ({"question": None}, "question", "non-empty string"),
    ({"question": "  "}, "question", "non-empty string"),
    ({"choices": ["a", "b", "c"]}, "choices", "list of 4"),
    ({"choices": ["a", "b", "c", ""]}, "choices", "choice 3"),
    ({"choices": ["a", "A", "c", "d"]}, "choices", "the same"),
    ({"answer_index": 4}, "answer_index", "0 to 3"),
    ({"answer_index": True}, "answer_index", "0 to 3"),
    ({"explanation": 3}, "explanation", "string"),
    ({"question": "a\x1b[2J"}, "question", "control character"),
])
def test_check_item_names_the_field(change, field, reason):
    with pytest.raises(ItemInvalid) as info:
        check_item({**GOOD, **change})
    assert info.value.field == field and reason in info.value.reason


def test_export_lines_and_blank_lines_are_read(tmp_path):
    path = tmp_path / "f.jsonl"
    exported = {**GOOD, "exam": "other", "number": 7, "model": "gpt", "created_at": "x"}
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(exported) + "\n")
    file = read_file(path)
    assert [line.line_no for line in file.lines] == [1, 3]
    assert file.by_chapter()["a"][0].answer_index == 2


@pytest.mark.parametrize("line, message", [
    ("{not json", "f.jsonl:2: line: not JSON"),
    ("[1, 2]", "f.jsonl:2: line: not a JSON object"),
    (json.dumps({**GOOD, "chapter_id": None}), "f.jsonl:2: chapter_id: must be"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "chapter_id"}),
     "f.jsonl:2: chapter_id: missing"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "answer_index"}),
     "f.jsonl:2: answer_index: missing"),
    (json.dumps({**GOOD, "choices": "abcd"}), "f.jsonl:2: choices: must be a list of 4"),
])
def test_a_bad_line_refuses_the_file_naming_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(BadImportLine) as info:
        read_file(path)
    assert str(info.value).startswith(str(tmp_path / message))
    assert "nothing was imported" in str(info.value) and "\n" not in str(info.value)


def test_a_line_that_is_not_utf8_or_a_missing_file_is_refused(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(BadImportLine, match=r"f.jsonl:2: line: not UTF-8"):
        read_file(path)
    with pytest.raises(Exception, match="cannot read"):
        read_file(tmp_path / "missing.jsonl")


def test_an_unknown_chapter_refuses_the_file_at_its_line(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "chapter_id": "zz"}) + "\n")
    with pytest.raises(BadImportLine, match=r"f.jsonl:2: chapter_id: 'zz' is not a chapter "
                                            r"of ex \(its syllabus\)"):
        check_chapters(read_file(path), "ex", ["a"], "its syllabus")
