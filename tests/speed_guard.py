"""The suite guards its own speed (a pytest plugin, loaded by tests/conftest.py):

- a test not marked `slow` whose setup, call or teardown takes over `unmarked_limit_s`
  (pyproject.toml) fails the run, named;
- every run ends with its time against `suite_budget_s`, the whole suite's budget on the 2-core
  machine CI runs on, so that the next contributor sees the number.

Under pytest-xdist the reports reach the controller, which does both."""

from __future__ import annotations

import json
import os
import resource
import time
from typing import Any

import pytest

_CONFIG: dict[str, pytest.Config] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("suite_budget_s", "the whole suite's time budget (README's test command, "
                  "on the 2-core machine CI runs on), printed against the time taken",
                  default="600")
    parser.addini("unmarked_limit_s", "a test not marked slow that takes longer than this "
                  "fails the run", default="30")


def pytest_configure(config: pytest.Config) -> None:
    config._examforge_too_slow = []  # type: ignore[attr-defined]
    config._examforge_started = time.monotonic()  # type: ignore[attr-defined]
    _CONFIG["config"] = config


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """With EXAMFORGE_CPU_LOG=FILE, each test's CPU (this process and the children it reaped:
    workers, CLI runs) is appended to FILE as a JSON line, to find where the suite's CPU goes
    (`python tests/cpu_report.py FILE` sums it)."""
    path = os.environ.get("EXAMFORGE_CPU_LOG")
    if not path:
        return (yield)
    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), \
            resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    started, wall, at = cpu(), time.monotonic(), time.time()
    try:
        return (yield)
    finally:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - started, 2),
                                  "wall_s": round(time.monotonic() - wall, 2),
                                  "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
                                  "at": round(at, 2)}) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The suite guards its own speed: a test over `unmarked_limit_s` (its setup, call or
    teardown) that is not marked `slow` fails the run, named. Under pytest-xdist this runs in
    the controller too, on the workers' reports."""
    config = _CONFIG.get("config")
    if config is None or hasattr(config, "workerinput") or "slow" in report.keywords:
        return
    if report.duration > float(config.getini("unmarked_limit_s")):
        config._examforge_too_slow.append(  # type: ignore[attr-defined]
            f"{report.nodeid} ({report.when}) took {report.duration:.1f} s")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    too_slow = getattr(config, "_examforge_too_slow", [])
    if too_slow:
        terminalreporter.section("tests over the unmarked limit")
        for line in too_slow:
            terminalreporter.write_line(
                f"{line}: over {config.getini('unmarked_limit_s')} s and not marked slow")
    if hasattr(config, "workerinput"):
        return
    taken = time.monotonic() - config._examforge_started  # type: ignore[attr-defined]
    budget = float(config.getini("suite_budget_s"))
    terminalreporter.write_line(
        f"suite time: {taken:.0f} s of its budget of {budget:.0f} s (pyproject.toml "
        f"suite_budget_s){'  OVER BUDGET' if taken > budget else ''}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if getattr(session.config, "_examforge_too_slow", None) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


