"""Bad syllabi and unsafe slugs given to `enqueue`: one clear line on stderr naming the file
and field, exit 2, no traceback, nothing written. The CLI runs in this process
(producer.cli.main) against SQLite with an unreachable broker, so that a refusal that came
after the broker or the database was touched would show: these cases were end-to-end tests
of tests/e2e/test_cli_errors.py, each paying a Python start-up for what one process shows
(tests/README.md lists the move). The real process's exit code and stderr are still checked
end to end there, by the refusals that need a service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)

GOOD = {"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 5}]}


def _write(env: dict[str, str], slug: str, content: bytes | str | dict) -> None:  # noqa: F811
    folder = Path(env["EXAMS_DIR"]) / slug
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content)
    data = content.encode() if isinstance(content, str) else content
    (folder / "syllabus.json").write_bytes(data)


def _assert_nothing_written(env: dict[str, str]) -> None:  # noqa: F811
    # The database file is not even created: the refusal comes before any connection.
    assert not Path(env["DATABASE_URL"][len("sqlite:///"):]).exists()


@pytest.mark.parametrize("name, content, needles", [
    ("not-utf8", b'{"title": "\xff\xfe"}', ["syllabus.json", "not UTF-8"]),
    ("malformed", '{"title": "T", "chapters": [', ["syllabus.json", "malformed JSON", "line 1"]),
    ("no-chapters", {"title": "T", "chapters": []}, ["syllabus.json", "chapters"]),
    ("dup-ids", {"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 1},
                                            {"id": "a", "title": "B", "questions": 1}]},
     ["syllabus.json", "duplicate chapter id 'a'"]),
    ("zero", {"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 0}]},
     ["syllabus.json", "chapters[0].questions"]),
    ("negative", {"title": "T", "chapters": [{"id": "a", "title": "A", "questions": -3}]},
     ["syllabus.json", "chapters[0].questions"]),
    ("too-many", {"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 10**7}]},
     ["syllabus.json", "chapters[0].questions", "outside"]),
    ("bad-chapter-id", {"title": "T", "chapters": [{"id": "../x", "title": "A",
                                                    "questions": 1}]},
     ["syllabus.json", "chapters[0].id"]),
    ("unknown-language", {"title": "T", "language": "xx", "chapters": [
        {"id": "a", "title": "A", "questions": 1}]},
     ["syllabus.json", "language: 'xx' is not a language", "known tags: ar, en, fa, ru"]),
    ("unknown-chapter-language", {"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 1, "language": "tlh"}]},
     ["syllabus.json", "chapters[0].language", "known tags: ar, en, fa, ru"]),
])
def test_a_bad_syllabus_is_refused_in_one_line_naming_the_file_and_field(
        env, capsys, name, content, needles):  # noqa: F811
    _write(env, "exam", content)
    code, out, err = cli(capsys, "enqueue", "exam")
    assert_one_line(code, err, *needles)
    assert "Traceback" not in out
    _assert_nothing_written(env)


@pytest.mark.parametrize("slug", ["nope", "../etc", "a/b", "has space", "UPPER", "a..b"])
def test_an_unknown_or_unsafe_slug_is_refused(env, capsys, slug):  # noqa: F811
    _write(env, "exam", GOOD)  # a good exam beside it is not touched either
    code, _, err = cli(capsys, "enqueue", "--", slug)
    assert_one_line(code, err)
    _assert_nothing_written(env)


def test_a_slug_with_a_leading_dash_is_refused_in_one_line(env, capsys):  # noqa: F811
    code, _, err = cli(capsys, "enqueue", "-rf")
    assert_one_line(code, err)
    code, _, err = cli(capsys, "enqueue", "--", "-rf")
    assert_one_line(code, err, "must match")
    _assert_nothing_written(env)


def test_a_missing_syllabus_file_is_refused(env, capsys):  # noqa: F811
    (Path(env["EXAMS_DIR"]) / "exam").mkdir(parents=True)
    code, _, err = cli(capsys, "enqueue", "exam")
    assert_one_line(code, err, "syllabus.json")
    _assert_nothing_written(env)
