"""Item types (issue 32) at the CLI: `--dry-run` prices each type, and a syllabus whose
counts do not add up is refused with one line naming the file and the field, exit 2, and
nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import write_syllabus
from test_cli_first_run import cli, env  # noqa: F401  (the fixture, shared)

MIXED = {"mcq": 20, "multi": 5, "truefalse": 10, "short": 3, "numeric": 2}
PRICES = {"LLM_PRICE_PROMPT_PER_MTOK": "0.15", "LLM_PRICE_COMPLETION_PER_MTOK": "0.60"}


def _syllabus(env: dict[str, str], types: Any) -> None:  # noqa: F811
    write_syllabus(Path(env["EXAMS_DIR"]), "ex", {"title": "Ex", "chapters": [
        {"id": "a", "title": "Mixed", "questions": 40, "types": types},
        {"id": "b", "title": "Plain", "questions": 10}]})


def test_a_dry_run_prices_each_type(env: dict[str, str], capsys: Any) -> None:  # noqa: F811
    _syllabus(env, MIXED)
    code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", "--json", **PRICES)
    assert code == 0, stdout
    est = json.loads(stdout)
    types = {t["type"]: t for t in est["types"]}
    assert {k: t["questions"] for k, t in types.items()} == {**MIXED, "mcq": 30}
    # Each call's prompt and max_tokens are shared out: the parts add up to the whole.
    assert sum(t["prompt_tokens"] for t in types.values()) == pytest.approx(
        est["prompt_tokens"], abs=len(types))
    assert sum(t["max_completion_tokens"] for t in types.values()) == pytest.approx(
        est["max_completion_tokens"], abs=len(types))
    assert sum(t["expected_usd"] for t in types.values()) == pytest.approx(
        est["expected_usd"], rel=1e-3)
    # A true/false item is cheaper to write than a multiple-response one, per question.
    per = {k: t["expected_completion_tokens"] / t["questions"] for k, t in types.items()}
    assert per["truefalse"] < per["mcq"] < per["multi"]
    code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", **PRICES)
    assert code == 0
    lines = [line.strip() for line in stdout.splitlines()]
    assert any(line.startswith("truefalse: 10 questions,") and "expected $" in line
               for line in lines), stdout
    # An exam without types prints and returns what it did before.
    write_syllabus(Path(env["EXAMS_DIR"]), "plain", {"title": "Ex", "chapters": [
        {"id": "b", "title": "Plain", "questions": 10}]})
    code, stdout, _ = cli(capsys, "enqueue", "plain", "--dry-run", "--json", **PRICES)
    assert code == 0 and json.loads(stdout)["types"] is None
    assert not (Path(env["DATABASE_URL"].removeprefix("sqlite:///"))).exists()


def test_counts_that_do_not_add_up_are_refused_in_one_line(
        env: dict[str, str], capsys: Any) -> None:  # noqa: F811
    _syllabus(env, {**MIXED, "mcq": 19})
    code, stdout, stderr = cli(capsys, "enqueue", "ex")
    assert code == 2
    path = Path(env["EXAMS_DIR"]) / "ex" / "syllabus.json"
    assert stderr.strip().splitlines() == [
        f"error: {path}: chapters[0]: types: the counts add up to 39, not to questions (40)"]
    assert "Traceback" not in stderr and stdout == ""
    assert not (Path(env["DATABASE_URL"].removeprefix("sqlite:///"))).exists()


def test_a_dry_run_prices_the_blind_solve_of_each_type(
        env: dict[str, str], capsys: Any) -> None:  # noqa: F811
    from examforge.verify import TYPED_EXTRA_TOKENS

    _syllabus(env, MIXED)
    code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", "--json", "--verify", "flag",
                          **PRICES)
    assert code == 0, stdout
    typed = json.loads(stdout)["verify"]
    _syllabus(env, {"mcq": 40})
    code, stdout, _ = cli(capsys, "enqueue", "ex", "--dry-run", "--json", "--verify", "flag",
                          **PRICES)
    plain = json.loads(stdout)["verify"]
    # Each answer of another type is capped at its own allowance beyond an mcq's letter.
    extra = sum(TYPED_EXTRA_TOKENS[k] * n for k, n in MIXED.items() if k != "mcq")
    assert typed["max_completion_tokens"] - plain["max_completion_tokens"] == extra
    assert typed["calls"] == plain["calls"] and typed["questions"] == plain["questions"]
