"""The mock's command line: every config field is an option with a help line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mockllm import ALL_FAULTS, MockConfig
from mockllm.cli import build_parser, parse_args

REPO_ROOT = Path(__file__).resolve().parents[2]


def _help_text(*command: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "200"}
    result = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_option_has_a_help_line() -> None:
    parser = build_parser()
    options = {option: action for action in parser._actions for option in action.option_strings}
    for config_field in dataclasses.fields(MockConfig):
        action = options.get("--" + config_field.name.replace("_", "-"))
        assert action is not None, f"no option for {config_field.name}"
        assert action.help and len(action.help) > 10, config_field.name
    assert all(action.help for action in parser._actions)


@pytest.mark.slow
@pytest.mark.parametrize("command", [("mockllm",), ("producer", "mock-llm")])
def test_help_lists_every_option_and_every_fault(command: tuple[str, ...]) -> None:
    text = _help_text(*command)
    for config_field in dataclasses.fields(MockConfig):
        assert "--" + config_field.name.replace("_", "-") in text
    faults_help = text[text.index("--faults NAMES"):text.index("--seed INT  ")]
    faults_help = " ".join(faults_help.split())  # argparse may wrap between "429:" and its text
    for fault in ALL_FAULTS:
        assert f"{fault}: " in faults_help, fault


def test_options_reach_the_config() -> None:
    host, port, config = parse_args([
        "--host", "0.0.0.0", "--port", "0", "--rpm", "600", "--tpm", "90000", "--burst-fraction", "0.2",
        "--ratelimit-headers", "azure", "--omit-usage", "--quota-tokens", "5000", "--trickle-pieces", "3",
        "--trickle-interval-s", "0.5", "--oversized-bytes", "4096", "--reword-rate", "0.1",
        "--answer-position", "0", "--faults", "trickle,oversized", "--script", '{"demo/ch-1": ["429", "ok"]}',
        "--batch-validation-s", "1", "--batch-expire-after-s", "30", "--batch-enqueued-token-limit", "9000",
    ])
    assert (host, port) == ("0.0.0.0", 0)
    assert (config.rpm, config.tpm, config.burst_fraction, config.ratelimit_headers) == (600, 90000, 0.2, "azure")
    assert config.omit_usage and not config.quota_exhausted and config.quota_tokens == 5000
    assert (config.trickle_pieces, config.trickle_interval_s, config.oversized_bytes) == (3, 0.5, 4096)
    assert (config.reword_rate, config.answer_position) == (0.1, 0)
    assert config.faults == ["trickle", "oversized"] and config.script == {"demo/ch-1": ["429", "ok"]}
    assert (config.batch_validation_s, config.batch_expire_after_s, config.batch_enqueued_token_limit) == (
        1.0, 30.0, 9000)
    assert parse_args([])[2] == MockConfig()


@pytest.mark.parametrize(
    "argv",
    [["--rpm", "0"], ["--reword-rate", "2"], ["--answer-position", "7"], ["--script", "{not json"],
     ["--ratelimit-headers", "nope"], ["--faults", "explode"]],
)
def test_bad_options_exit_with_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args(argv)
    assert excinfo.value.code == 2
