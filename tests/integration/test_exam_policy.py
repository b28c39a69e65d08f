"""Verification is the exam's policy (issue 27, defect 2), on SQLite and PostgreSQL:
`enqueue --verify`, the enqueuing process's VERIFY for a new exam, a run's `verify` and the
syllabus's record the policy on the exam; a worker whose own VERIFY says otherwise follows
the exam's; `status --json` and GET /exams/SLUG show it; a later `enqueue --verify flag`
solves the questions stored unverified exactly once, priced by `--dry-run`; lowering the
policy deletes no verdict. And `enqueue --batch` never quotes this shell's BATCH_POLL_S, a
setting beat reads in its own environment."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from examforge.settings import Settings, load_settings
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from storage.base import Q
from test_cli_first_run import cli  # the CLI in this process, one helper for both tiers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

PRICES = {"LLM_PRICE_PROMPT_PER_MTOK": "1", "LLM_PRICE_COMPLETION_PER_MTOK": "4"}


@pytest.fixture
def mock():
    with MockServer(MockConfig(latency_s=0, seed=5)) as server:
        yield server


@pytest.fixture
def env(monkeypatch, tmp_path, db_url, redis_url, mock):
    """The CLI's environment: this test's database, Redis and mock; no VERIFY."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    values = {"DATABASE_URL": db_url, "EXAMS_DIR": str(tmp_path / "exams"),
              "BROKER_URL": redis_url, "LLM_BASE_URL": mock.base_url,
              "LLM_API_KEY": "sk-test", "QUESTIONS_PER_CALL": "5",
              "TASK_QUEUE": f"ef-policy-{time.monotonic_ns()}", **PRICES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    load_settings.cache_clear()
    yield values
    load_settings.cache_clear()


def _work(env, **settings):
    """What a worker started with its own settings (no VERIFY: `off`) does with the exam's
    slices, until each is done."""
    from runner.pipeline import Runtime, process_chapter
    from storage import open_store

    store = open_store(env["DATABASE_URL"])
    rt = Runtime.build(load_settings().model_copy(update={"verify": "off", **settings}), store)
    try:
        for chapter in ("a",):
            deadline = time.monotonic() + 30
            while (result := process_chapter(rt, "ex", chapter)).outcome == "retry":
                assert time.monotonic() < deadline, result
                time.sleep(min(result.retry_in_s or 0.0, 0.5))
            assert result.outcome in ("done", "skipped"), result
    finally:
        rt.close()
    return store


def _verdicts(store):
    with store.engine.connect() as conn:
        return [v for v in conn.execute(select(Q.c.verdict).where(
            Q.c.exam == "ex", Q.c.number.is_not(None)).order_by(Q.c.number)).scalars()]


def _solves(mock):
    return httpx.get(mock.base_url + "/_stats").json()["solves"]


def _status(capsys):
    code, out, err = cli(capsys, "status", "ex", "--json")
    assert code == 0, err
    return json.loads(out)


def test_verify_given_at_enqueue_is_the_exams_and_a_worker_without_it_follows_it(
        env, capsys, mock):
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 10)])
    code, out, err = cli(capsys, "enqueue", "ex", VERIFY="replace")
    assert code == 0, out + err
    assert "blind solves: replace" in out
    assert _status(capsys)["verify"] == "replace"
    store = _work(env)  # its own VERIFY is off
    assert _verdicts(store) == ["agreed"] * 10 and _solves(mock) >= 2
    # A later enqueue from a shell without VERIFY keeps the exam's policy.
    code, out, _ = cli(capsys, "enqueue", "ex")
    assert code == 0 and "blind solves: replace" in out
    assert _status(capsys)["verify"] == "replace"


def test_a_later_verify_flag_solves_the_unverified_questions_once_priced_by_the_dry_run(
        env, capsys, mock):
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 10)])
    assert cli(capsys, "enqueue", "ex")[0] == 0  # no VERIFY anywhere: off
    store = _work(env)
    assert _verdicts(store) == [None] * 10 and _solves(mock) == 0
    code, out, err = cli(capsys, "enqueue", "ex", "--verify", "flag", "--dry-run", "--json")
    assert code == 0, err
    dry = json.loads(out)
    assert dry["questions"] == 0 and dry["calls"] == 0
    assert dry["verify"]["owed"] == 10 and dry["verify"]["calls"] == 1
    assert dry["verify"]["worst_usd"] > 0 and dry["worst_usd"] == pytest.approx(
        dry["verify"]["worst_usd"], abs=1.5e-6)
    code, out, err = cli(capsys, "enqueue", "ex", "--verify", "flag")
    assert code == 0 and "10 stored questions to solve" in out, out + err
    _work(env)
    assert None not in _verdicts(store) and "pending" not in _verdicts(store)
    assert _solves(mock) == 1
    status = _status(capsys)
    assert status["verify"] == "flag" and status["verification"]["pending"] == 0
    # Exactly once: a second enqueue --verify flag owes nothing and a worker solves nothing.
    code, out, _ = cli(capsys, "enqueue", "ex", "--verify", "flag")
    assert code == 0 and "to solve" not in out
    _work(env)
    assert _solves(mock) == 1
    # Lowering the policy deletes no verdict.
    kept = _verdicts(store)
    assert cli(capsys, "enqueue", "ex", "--verify", "off")[0] == 0
    assert _status(capsys)["verify"] == "off" and _verdicts(store) == kept


def test_the_syllabus_names_the_policy(env, capsys, mock):
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", {"title": "T", "verify": "flag", "chapters": [
        {"id": "a", "title": "A", "questions": 5}]})
    assert cli(capsys, "enqueue", "ex", VERIFY="off")[0] == 0
    assert _status(capsys)["verify"] == "flag"
    store = _work(env)
    assert set(_verdicts(store)) <= {"agreed", "disputed"} and _solves(mock) == 1


def test_a_runs_verify_is_recorded_on_the_exam_and_shown_by_get_exam(make_settings, db_url,
                                                                     mock):
    from api_support import SYLLABUS, api, wait_run

    with api(make_settings, mock, database_url=db_url, verify="off",
             llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0) as client:
        assert client.put("/exams/demo", json=SYLLABUS).status_code in (200, 201)
        assert client.get("/exams/demo").json()["verify"] is None  # new: none named
        r = client.post("/exams/demo/runs", json={"verify": "flag"},
                        headers={"Idempotency-Key": "k1"})
        assert r.status_code == 202, r.text
        assert wait_run(client, r.json()["id"])["state"] == "done"
        exam = client.get("/exams/demo").json()
        assert exam["verify"] == "flag"
        assert exam["verification"]["pending"] == 0
        assert exam["verification"]["agreed"] + exam["verification"]["disputed"] == 10
        # The same key with another policy is another request.
        again = client.post("/exams/demo/runs", json={"verify": "replace"},
                            headers={"Idempotency-Key": "k1"})
        assert again.status_code == 422, again.text
    assert _solves(mock) >= 2


def test_enqueue_batch_quotes_no_value_of_a_setting_beat_reads(env, capsys):
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 5)])
    code, out, err = cli(capsys, "enqueue", "ex", "--batch", BATCH_POLL_S="7")
    assert code == 0, out + err
    assert "BATCH_POLL_S" in out and "7s" not in out and "(7" not in out, out


def test_questions_imported_into_a_verified_exam_are_solved_once_by_its_next_run(
        env, capsys, mock, tmp_path):
    # Bought elsewhere, they never had a blind solve: under the exam's policy (flag, recorded
    # at enqueue) they are owed one, like questions stored before the policy was raised.
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 10)])
    assert cli(capsys, "enqueue", "ex", "--verify", "flag")[0] == 0
    lines = [json.dumps({"chapter_id": "a", "question": f"Imported question {i} about "
                         f"topic {i * 7}?", "choices": ["w", "x", "y", "z"],
                         "answer_index": i % 4, "explanation": "because"})
             for i in range(6)]
    (tmp_path / "bought.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = cli(capsys, "import", "ex", str(tmp_path / "bought.jsonl"))
    assert code == 0 and "imported 6" in out, out + err
    status = _status(capsys)
    assert status["verify"] == "flag"  # the import kept the exam's policy
    assert status["verification"]["pending"] == 6, status["verification"]
    code, out, err = cli(capsys, "enqueue", "ex")  # the rest, and the owed solves
    assert code == 0, out + err
    store = _work(env)  # a worker without VERIFY of its own: the exam's policy rules
    assert None not in _verdicts(store) and "pending" not in _verdicts(store)
    assert len(_verdicts(store)) == 10
    solved = _solves(mock)
    _work(env)  # nothing is owed twice
    assert _solves(mock) == solved
    assert _status(capsys)["verification"]["pending"] == 0
