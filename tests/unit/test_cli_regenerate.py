"""`enqueue --regenerate CHAPTER` from the CLI, in this process on SQLite (issue 27, defect
1): its dry run lists what it keeps, deletes and generates, per state with the numbers, the
real command prints the same list and does it, and `--discard-reviewed` drops the reviewed
questions too. The broker is stood in for (the messages published are recorded). The store's
side runs on both databases in tests/integration/test_reviewed_work_kept.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import open_store
from test_cli_first_run import cli, env  # noqa: F401 (the fixture)

LIST = ["regenerate ex/a: its title or prompt changed",
        "  keeps:     1 approved (1), 1 edited (2), 1 rejected (3)",
        "  deletes:   2 unreviewed (4-5)",
        "  generates: 3 (3-5)"]


@pytest.fixture
def published(monkeypatch) -> list[Any]:
    import tasks.broker

    sent: list[Any] = []
    monkeypatch.setattr(tasks.broker, "check_broker", lambda app, settings: None)
    monkeypatch.setattr(tasks.broker, "broker_epoch", lambda app, settings: "e")
    monkeypatch.setattr(tasks.broker, "publish_slices",
                        lambda app, exam, slices, origin=None: sent.extend(slices))
    return sent


def _reviewed(env: dict[str, str], title: str = "Chapter a") -> None:  # noqa: F811
    store = open_store(env["DATABASE_URL"])
    path = _write(env, "Chapter a")
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    store.import_questions("ex", {"a": [
        Question(f"Distinct question number {i} about topic {i * 7}?",
                 (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 0, "why") for i in range(5)]}, "test")
    q = store.chapter_questions("ex", "a")[1]
    store.approve("ex", q[0]["id"], 1, "me")
    store.edit("ex", q[1]["id"], 1, "me", {"explanation": "a better why"})
    store.reject("ex", q[2]["id"], 1, "me")
    store.engine.dispose()
    _write(env, title)


def _write(env: dict[str, str], title: str) -> Path:  # noqa: F811
    return write_syllabus(Path(env["EXAMS_DIR"]), "ex", {"title": "Ex", "chapters": [
        {"id": "a", "title": title, "questions": 5}]})


def test_the_dry_run_lists_what_regenerate_keeps_deletes_and_generates(env, capsys,  # noqa: F811
                                                                        published):
    _reviewed(env, title="Chapter a, revised")
    code, out, err = cli(capsys, "enqueue", "ex", "--regenerate", "a", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    start = lines.index(LIST[0])
    assert lines[start:start + 4] == LIST
    assert "questions to generate: 3 in 1 of 1 chapters (2 already stored)" in out
    code, out, err = cli(capsys, "enqueue", "ex", "--regenerate", "a", "--dry-run", "--json")
    assert json.loads(out)["regenerate"][0]["keeps"] == {"approved": [1], "edited": [2],
                                                         "rejected": [3]}
    assert published == []

    # The real command prints the same list, and does it.
    code, out, err = cli(capsys, "enqueue", "ex", "--regenerate", "a")
    assert code == 0, err
    assert out.splitlines()[:4] == LIST
    assert published == [("a", 0)]
    store = open_store(env["DATABASE_URL"])
    items = store.chapter_questions("ex", "a")[1]
    assert [(q["number"], q["review"]) for q in items] == [
        (1, "stale"), (2, "stale"), (3, "rejected")]
    store.engine.dispose()


def test_discard_reviewed_drops_them_too(env, capsys, published):  # noqa: F811
    _reviewed(env, title="Chapter a, revised")
    code, out, err = cli(capsys, "enqueue", "ex", "--regenerate", "a", "--discard-reviewed",
                         "--dry-run")
    assert code == 0, err
    assert "  keeps:     nothing" in out
    assert "  deletes:   2 unreviewed (4-5), 1 approved (1), 1 edited (2), 1 rejected (3)" \
        in out
    assert "  generates: 5 (1-5)" in out
    code, out, err = cli(capsys, "enqueue", "ex", "--regenerate", "a", "--discard-reviewed")
    assert code == 0, err
    store = open_store(env["DATABASE_URL"])
    assert store.chapter_questions("ex", "a")[1] == []
    store.engine.dispose()
    code, out, err = cli(capsys, "enqueue", "ex", "--discard-reviewed")
    assert code == 2 and "--regenerate" in err
