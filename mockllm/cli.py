"""The ``mock-llm`` command: serve until SIGTERM or SIGINT.

Its options are built from ``MockConfig``'s fields and their help lines, so every field
(and so every ``/_config`` setting) has an option. This module only builds the parser: the
server (asyncio, tiktoken, the syllabus models) is imported by ``main`` once the arguments
are read, so ``--help`` and a bad option answer at once (tests/unit/test_startup.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any

from mockllm.config import RATELIMIT_HEADER_MODES, MockConfig
from mockllm.faults import ALL_FAULTS, DEFAULT_FAULTS, FAULT_HELP, OPT_IN_FAULTS

DEFAULT_PORT = 8089


def _faults_help() -> str:
    listed = "; ".join(f"{name}: {FAULT_HELP[name]}" for name in ALL_FAULTS)
    return (
        f"comma-separated faults drawn at random when --fault-rate > 0 (default: all but 400, 401, "
        f"{', '.join(OPT_IN_FAULTS)}). Every fault, also usable in --script: {listed}"
    )


def _option_kwargs(config_field: dataclasses.Field[Any], hint: Any, default: Any) -> dict[str, Any]:
    name = config_field.name
    help_text = str(config_field.metadata.get("help", name))
    kwargs: dict[str, Any] = {"dest": name, "help": help_text}
    if name == "faults":
        return {**kwargs, "default": ",".join(DEFAULT_FAULTS), "metavar": "NAMES", "help": _faults_help()}
    if name == "script":
        return {**kwargs, "default": {}, "type": json.loads, "metavar": "JSON",
                "help": f'{help_text}, e.g. \'{{"demo/ch-1": ["429", "ok", "trickle"]}}\''}
    if name in ("wrong_key_rates", "solver_error_rates"):
        return {**kwargs, "default": {}, "type": json.loads, "metavar": "JSON",
                "help": f'{help_text}, e.g. \'{{"truefalse": 0.1}}\''}
    if name == "ratelimit_headers":
        return {**kwargs, "default": default, "choices": RATELIMIT_HEADER_MODES,
                "help": f"{help_text} (default: {default})"}
    if name == "api_key":
        return {**kwargs, "default": None, "metavar": "KEY",
                "help": f"{help_text} (default: {config_field.metadata['unset']})"}
    if hint is bool:
        # --x and --no-x: a flag whose default is on (--prompt-cache) can be turned off.
        return {**kwargs, "action": argparse.BooleanOptionalAction, "default": default}
    kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
    kind = kinds[0]
    shown = config_field.metadata.get("unset", "unset") if default is None else default
    return {**kwargs, "default": default, "type": kind, "metavar": kind.__name__.upper(),
            "help": f"{help_text} (default: {shown})"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mock-llm",
        description="OpenAI-compatible mock LLM (chat completions, files, batches) with fault injection, "
        "rate limits, quota and a usage log. Every option below can also be changed at runtime with "
        "POST /_config.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to listen on, 0 for any free port (default: {DEFAULT_PORT})")
    defaults = MockConfig()
    hints = typing.get_type_hints(MockConfig)
    for config_field in dataclasses.fields(MockConfig):
        option = "--" + config_field.name.replace("_", "-")
        default = getattr(defaults, config_field.name)
        parser.add_argument(option, **_option_kwargs(config_field, hints[config_field.name], default))
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[str, int, MockConfig]:
    """(host, port, config) from the command line; exits with status 2 on a bad option."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    host, port = args.pop("host"), args.pop("port")
    try:
        return host, port, MockConfig(**args)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: serve until SIGTERM/SIGINT, then exit 0."""
    host, port, config = parse_args(argv)
    from mockllm.server import serve  # the one import of the server: after the parsing

    return serve(host, port, config)
