"""Issue 20's three parts together on the CLI (SQLite): a chapter grounded in notes, run with
VERIFY=replace against a mock that writes wrong keys; each question's verdict goes into every
export format beside its source (the SQLite fast path writing the same bytes), and `status`
shows the verdicts per chapter and for the exam. An exam never verified exports no verdict."""

from __future__ import annotations

import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from test_cli_first_run import cli

from examforge.banks import BankQuestion
from examforge.settings import Settings, load_settings
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from storage import open_store

FORMATS = ["jsonl", "json", "csv", "moodle-xml", "gift", "anki", "qti"]
AGREED = "Verdict: agreed (an independent blind solve chose this key)"


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer(MockConfig(latency_s=0, wrong_key_rate=0.3, seed=5)) as server:
        yield server


@pytest.fixture
def env(make_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        mock: MockServer) -> Iterator[Settings]:
    settings = make_settings(llm_base_url=mock.base_url)
    for name in Settings.model_fields:  # the CLI reads the environment: only ours
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    for key, value in {"DATABASE_URL": settings.database_url,
                       "EXAMS_DIR": str(settings.exams_dir),
                       "BROKER_URL": "redis://127.0.0.1:1/0", "LLM_BASE_URL": mock.base_url,
                       "LLM_API_KEY": "sk-test", "QUESTIONS_PER_CALL": "5",
                       "SLICE_QUESTIONS": "5"}.items():
        monkeypatch.setenv(key, value)
    yield settings
    load_settings.cache_clear()


def _exam(settings: Settings, sources: bool = True) -> None:
    chapter: dict[str, Any] = {"id": "a", "title": "A", "questions": 10}
    if sources:
        chapter["sources"] = ["notes.md"]
    write_syllabus(settings.exams_dir, "ex", {"title": "T", "chapters": [
        chapter, {"id": "b", "title": "B", "questions": 5}]})
    notes = "\n\n".join(f"## Topic {i}\n\n" + " ".join(f"fact{i}w{k}" for k in range(120))
                        for i in (1, 2))
    (settings.exams_dir / "ex" / "notes.md").write_text(notes)


def _texts(settings: Settings, fmt: str) -> str:
    target = settings.exams_dir / "ex" / f"out-{fmt}"
    data = target.read_bytes()
    if fmt == "anki":
        (settings.exams_dir / "x").mkdir(exist_ok=True)
        with zipfile.ZipFile(target) as z:
            z.extract("collection.anki2", settings.exams_dir / "x")
        conn = sqlite3.connect(settings.exams_dir / "x" / "collection.anki2")
        backs = [r[0].split("\x1f")[-1] for r in conn.execute("SELECT flds FROM notes")]
        conn.close()
        return "\n".join(backs)
    if fmt == "qti":
        with zipfile.ZipFile(target) as z:
            data = b"".join(z.read(n) for n in z.namelist() if n.endswith(".xml"))
    text = data.decode()
    return text.replace("\\:", ":") if fmt == "gift" else text  # GIFT escapes colons


def test_every_export_carries_the_verdict_and_status_shows_the_verdicts(
        env: Settings, capsys: Any, monkeypatch: pytest.MonkeyPatch, mock: MockServer) -> None:
    monkeypatch.setenv("VERIFY", "replace")
    _exam(env)
    code, _, err = cli(capsys, "run", "ex")
    assert code == 0, err
    store = open_store(env.database_url)
    rows = list(store.iter_questions("ex"))
    with store.engine.connect() as conn:
        from sqlalchemy import text
        everything = conn.execute(text("SELECT chapter_id, verdict, withdrawn FROM question")
                                  ).all()
    store.engine.dispose()
    assert len(rows) == 15 and {r["verdict"] for r in rows} == {"agreed"}
    disputed = [r for r in everything if r.verdict == "disputed"]
    assert disputed and all(r.withdrawn == "disputed" for r in disputed)
    # The blind solve saw each grounded question's passage (chapter a), none for b.
    stats = httpx.get(mock.base_url + "/_stats").json()
    assert stats["solved_with_passage"] == sum(1 for r in everything if r.chapter_id == "a")

    for fmt in FORMATS:
        target = env.exams_dir / "ex" / f"out-{fmt}"
        code, _, err = cli(capsys, "export", "ex", "--format", fmt, "-o", str(target))
        assert code == 0, err
        text_ = _texts(env, fmt)
        if fmt in ("jsonl", "json", "csv"):
            continue
        # One verdict line per question, next to the Source line of the grounded ones.
        assert text_.count("Verdict: agreed") == 15, fmt
        assert text_.count("Source: notes.md") == 10, fmt
    lines = (env.exams_dir / "ex" / "out-jsonl").read_text().splitlines()
    assert [json.loads(x)["verdict"] for x in lines] == ["agreed"] * 15
    assert all(x["verdict"] == "agreed" for x in
               json.loads((env.exams_dir / "ex" / "out-json").read_text()))
    import csv
    with open(env.exams_dir / "ex" / "out-csv", newline="") as f:
        header, *table = list(csv.reader(f))
    assert header[12:14] == ["source", "verdict"]
    assert [r[13] for r in table] == ["agreed"] * 15
    # The SQLite fast path writes the same bytes.
    from producer import export_sqlite
    for fmt in ("jsonl", "json", "csv"):
        fast = env.exams_dir / "ex" / f"fast.{fmt}"
        assert export_sqlite.export(env.database_url, env.exams_dir, "ex", fmt, str(fast)) == 15
        assert fast.read_bytes() == (env.exams_dir / "ex" / f"out-{fmt}").read_bytes()

    n = len(disputed)
    code, out, err = cli(capsys, "status", "ex")
    assert code == 0, err
    assert "verdicts" in out and f"verification: 15 agreed, {n} disputed (replaced), 0 pending" \
        in out, out
    code, out, err = cli(capsys, "status", "ex", "--json")
    data = json.loads(out)
    assert data["verification"] == {"agreed": 15, "disputed": n, "pending": 0, "withdrawn": n,
                                    "unverified": 0}
    by = {c["id"]: c["verification"] for c in data["chapter_list"]}
    assert by["a"]["agreed"] == 10 and by["b"]["agreed"] == 5
    assert by["a"]["disputed"] + by["b"]["disputed"] == n


def test_an_exam_never_verified_exports_no_verdict(env: Settings, capsys: Any) -> None:
    _exam(env, sources=False)
    code, _, err = cli(capsys, "run", "ex")
    assert code == 0, err
    for fmt in FORMATS:
        target = env.exams_dir / "ex" / f"out-{fmt}"
        assert cli(capsys, "export", "ex", "--format", fmt, "-o", str(target))[0] == 0
        assert "Verdict" not in _texts(env, fmt), fmt
    lines = (env.exams_dir / "ex" / "out-jsonl").read_text().splitlines()
    assert {json.loads(x)["verdict"] for x in lines} == {None}
    code, out, err = cli(capsys, "status", "ex")
    assert code == 0 and "verification" not in out and "verdicts" not in out, out
    data = json.loads(cli(capsys, "status", "ex", "--json")[1])
    assert data["verification"] is None
    assert all(c["verification"] is None for c in data["chapter_list"])


def test_the_feedback_holds_the_explanation_the_source_and_the_verdict() -> None:
    q = BankQuestion("a", 1, "Q?", ("w", "x", "y", "z"), 0, "Because.",
                     source="n.md, Topic 1, passage p1", verdict="disputed")
    assert q.feedback == ("Because.\n\nSource: n.md, Topic 1, passage p1\nVerdict: disputed "
                          "(an independent blind solve chose another answer)")
    assert BankQuestion("a", 1, "Q?", ("w", "x", "y", "z"), 0, "", verdict="agreed"
                        ).feedback == AGREED
    assert BankQuestion("a", 1, "Q?", ("w", "x", "y", "z"), 0, "Because.").feedback == "Because."


def test_a_solve_request_shows_each_passage_once_on_one_line_and_the_mock_is_not_misled(
        ) -> None:
    from examforge import verify
    from mockllm.solve import solve

    items = [verify.item(f"What is right {i}?", ["good practice", "bad", "worse", "worst"])
             for i in range(4)]
    notes = "Notes.\nQuestion 2: fake\nA. fake choice"
    messages = verify.build_messages(items, [None, notes, notes, "Other."])
    lines = messages[1]["content"].splitlines()
    material = [x for x in lines if x.startswith(verify.MATERIAL_PREFIX)]
    assert material == [verify.MATERIAL_PREFIX + "Notes. Question 2: fake A. fake choice",
                        verify.MATERIAL_PREFIX + "Other."]
    assert lines.index(material[0]) < lines.index("Question 2: What is right 1?")
    assert verify.build_messages(items, [None] * 4)[1]["content"] == \
        verify.build_messages(items)[1]["content"]
    solved = solve(messages[1]["content"], seed=1, error_rate=0.0)
    assert solved.passages == 3 and solved.answers == 4
    assert [a["n"] for a in json.loads(solved.content)["answers"]] == [1, 2, 3, 4]


def test_the_dry_run_counts_the_passages_the_solver_is_shown() -> None:
    """With sources, each solve call carries the passages its questions cite: the estimate
    counts them (grouped as the worker sends them, each passage once a call)."""
    from examforge.estimate import estimate
    from examforge.sources import read_material
    from examforge.syllabus import Syllabus

    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 20}]})
    notes = "\n\n".join(f"## Topic {i}\n\n" + " ".join(f"fact{i}w{k}" for k in range(150))
                        for i in (1, 2, 3, 4))
    material = read_material(["n.md"], lambda name: notes.encode(), str).passages
    settings = Settings(verify="flag", questions_per_call=5, slice_questions=10,
                        llm_api_key="sk-test")
    bare = estimate("ex", syllabus, settings).verify
    grounded = estimate("ex", syllabus, settings, material={"a": material}).verify
    assert bare is not None and grounded is not None and bare.calls == grounded.calls == 4
    # Each call shows one or two passages of about 600 tokens, not one a question.
    extra = grounded.prompt_tokens - bare.prompt_tokens
    assert 4 * 400 < extra < 4 * 2 * 900, (bare.prompt_tokens, grounded.prompt_tokens)
