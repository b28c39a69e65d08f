"""Issue 27, defect 8: `export --approved-only` of an exam with no approved question exits 1
with one line and writes no file (the SQLite fast path and the store's path, SQLite and
PostgreSQL), and the API answers 409 with a problem document."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_support import api

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import open_store
from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)


def _exam(url: str, exams_dir: Path) -> int:
    store = open_store(url)
    path = write_syllabus(exams_dir, "ex", [("a", 2)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    store.import_questions("ex", {"a": [
        Question(f"Question {i} about a thing?", (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 0,
                 "why") for i in range(2)]}, "test")
    first = store.chapter_questions("ex", "a")[1][0]["id"]
    store.engine.dispose()
    return first


@pytest.mark.parametrize("fmt", ["jsonl", "moodle-xml"])  # the fast path, the store's
def test_the_cli_refuses_an_empty_approved_export(env, capsys, db_url, tmp_path,  # noqa: F811
                                                   fmt):
    first = _exam(db_url, Path(env["EXAMS_DIR"]))
    target = tmp_path / f"bank.{fmt}"
    code, out, err = cli(capsys, "export", "ex", "--format", fmt, "--approved-only",
                         "-o", str(target), DATABASE_URL=db_url)
    assert code == 1, err
    assert_one_line(code, err, "no approved question", exit_code=1)
    assert not target.exists() and out == ""
    # One approved: it is written, alone.
    store = open_store(db_url)
    store.approve("ex", first, 1, "me")
    store.engine.dispose()
    code, out, err = cli(capsys, "export", "ex", "--format", fmt, "--approved-only",
                         "-o", str(target), DATABASE_URL=db_url)
    assert code == 0, err
    assert "wrote 1 question" in err and target.exists()


def test_the_api_answers_409_for_an_empty_approved_export(make_settings, db_url):
    with api(make_settings, database_url=db_url) as client:
        settings_dir = Path(make_settings().exams_dir)
        first = _exam(db_url, settings_dir)
        for fmt in ("jsonl", "moodle-xml"):
            r = client.get("/exams/ex/export", params={"format": fmt, "approved_only": "true"})
            assert r.status_code == 409, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert "no approved question" in r.json()["detail"]
        assert client.get("/exams/ex/export", params={"format": "jsonl"}).status_code == 200
        store = open_store(db_url)
        store.approve("ex", first, 1, "me")
        store.engine.dispose()
        r = client.get("/exams/ex/export", params={"format": "jsonl", "approved_only": "true"})
        assert r.status_code == 200 and len(r.text.splitlines()) == 1
