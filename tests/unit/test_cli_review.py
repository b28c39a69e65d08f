"""`review SLUG` and `export --approved-only` in this process (producer.cli.main) on SQLite:
the counts per chapter in a table and in JSON, an unknown exam in one line, and an export of
approved questions through the SQLite fast path and the store's path (a bank format)."""

from __future__ import annotations

import json

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import open_store
from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)


def _reviewed(env: dict[str, str]) -> None:  # noqa: F811
    from pathlib import Path

    store = open_store(env["DATABASE_URL"])
    path = write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 3), ("b", 2)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    store.import_questions("ex", {ch: [
        Question(f"{ch} question {i}?", (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 0, "why")
        for i in range(n)] for ch, n in (("a", 3), ("b", 2))}, "test")
    a = store.chapter_questions("ex", "a")[1]
    store.approve("ex", a[0]["id"], 1, "me")
    store.edit("ex", a[1]["id"], 1, "me", {"question": "An edited question?"})
    store.approve("ex", a[1]["id"], 2, "me")
    store.reject("ex", a[2]["id"], 1, "me")
    store.engine.dispose()


def test_review_counts_per_chapter(env, capsys):  # noqa: F811
    _reviewed(env)
    code, out, err = cli(capsys, "review", "ex", "--json")
    assert code == 0, err
    data = json.loads(out)
    by = {c["chapter_id"]: c for c in data["chapters"]}
    assert {k: by["a"][k] for k in ("target", "questions", "unreviewed", "approved",
                                    "rejected", "disputed")} == {
        "target": 3, "questions": 2, "unreviewed": 0, "approved": 2, "rejected": 1,
        "disputed": 0}
    assert data["totals"] == {"questions": 4, "unreviewed": 2, "approved": 2, "rejected": 1,
                              "disputed": 0, "stale": 0}
    # Each review filter's count, as the API's (and the page's filters) have them.
    assert data["filters"] == {"disputed": 0, "unreviewed": 2, "edited": 1, "stale": 0,
                               "approved": 2, "rejected": 1}
    assert by["a"]["filters"]["edited"] == 1 and by["a"]["filters"]["unreviewed"] == 0
    code, out, err = cli(capsys, "review", "ex")
    assert code == 0, err
    assert "2 questions to review; 1 rejected; 1 missing (the next run or enqueue generates them)" \
        in out, out
    assert_one_line(*cli(capsys, "review", "nope")[::2], "nope")


def test_review_once_rejected_are_replaced(env, capsys):  # noqa: F811
    """A rejected question already replaced is not announced as still to generate."""
    _reviewed(env)
    store = open_store(env["DATABASE_URL"])
    store.import_questions("ex", {"a": [
        Question("a replacement?", ("r1", "r2", "r3", "r4"), 0, "why")]}, "test")
    store.engine.dispose()
    code, out, err = cli(capsys, "review", "ex")
    assert code == 0, err
    assert "3 questions to review; 1 rejected" in out and "missing" not in out, out


def test_export_approved_only(env, capsys, tmp_path):  # noqa: F811
    _reviewed(env)
    target = tmp_path / "approved.jsonl"
    code, _, err = cli(capsys, "export", "ex", "--approved-only", "-o", str(target))
    assert code == 0 and "wrote 2 questions" in err, err
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["question"] for r in rows] == ["a question 0?", "An edited question?"]
    code, _, err = cli(capsys, "export", "ex", "-o", str(target))
    assert code == 0 and "wrote 4 questions" in err, err  # all but the rejected one
    gift = tmp_path / "approved.gift.txt"
    code, _, err = cli(capsys, "export", "ex", "--approved-only", "--format", "gift", "-o",
                       str(gift))
    assert code == 0 and "wrote 2 questions" in err, err
    assert "An edited question?" in gift.read_text()


def test_dry_run_asks_for_the_rejected_questions_replacement(env, capsys):  # noqa: F811
    """The dry run counts the bank, not the questions withdrawn from it: a rejected
    question's number is generated again, and priced."""
    _reviewed(env)
    code, out, err = cli(capsys, "enqueue", "ex", "--dry-run")
    assert code == 0, err
    assert "questions to generate: 1 in 1 of 2 chapters (4 already stored)" in out, out


def test_run_cut_short_by_cancel_says_so(env, capsys, monkeypatch):  # noqa: F811
    """A `run` that `cancel` stopped ends with the cancelled chapters and the way on."""
    import runner.local

    from pathlib import Path

    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 3), ("b", 2)])

    def cancelled_meanwhile(rt, slug, slices, concurrency, on_progress=None):
        rt.store.cancel(slug)  # as `cancel ex` from another shell
        return {}

    monkeypatch.setattr(runner.local, "run_local", cancelled_meanwhile)
    code, out, err = cli(capsys, "run", "ex")
    assert code == 7, err  # producer.exits.CANCELLED: only a finished exam exits 0
    assert out.strip().endswith(
        "0/5 questions; 0/2 chapters done, 2 chapters cancelled "
        "(python -m producer run ex restarts them)"), out
