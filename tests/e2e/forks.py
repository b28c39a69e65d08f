"""The end-to-end tests' forkserver: processes forked from one that imported their code once.

A Celery worker started as `python -m celery -A tasks worker` spends about 1.3 of its 1.8 s
of CPU importing Celery, its CLI's plugins (Flower and Tornado among them), SQLAlchemy,
pydantic, httpx and the tokenizer, some 300 times a suite run, and the suite is bound by its
two cores. Here the forkserver of multiprocessing imports those once (`fork_warm.py`) and
each worker or beat is a fork of it that takes the deployment's environment, working
directory and log file and then runs the same entry point as `python -m celery` (runpy),
before anything of the project that reads the environment (`tasks`, the settings) is
imported. It is still a process of its own: the tests' signals (SIGKILL, SIGSTOP, SIGTERM)
reach it as they would the command.

What a fork cannot take is what works only at an exec: an LD_PRELOAD (libfaketime) or an
interpreter option in the environment (PYTHON*, but PYTHONPATH and PYTHONUNBUFFERED, which
are the forkserver's own). Such a process is started as a real command (`forkable`).
EXAMFORGE_TEST_FORK=0 starts every one as a real command.

The mock model servers come from the same forkserver (mockproc.py): multiprocessing has one
per process, whose preloaded modules are set before it starts.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["fork_warm", "forks", "mockproc"])
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parents[1]


def ensure_server() -> None:
    """Start the forkserver, if it is not running, able to import its preloads: it gets no
    sys.path from this process (Python 3.11 passes it and does not apply it) and ignores a
    preload it cannot import, so it is started with these folders on PYTHONPATH."""
    from multiprocessing import forkserver

    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_HERE), str(_ROOT), before) if p)
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before

# What the forkserver's interpreter already has: these may be in a forked process's
# environment with these values.
_SAME_AS_SERVER = {"PYTHONPATH", "PYTHONUNBUFFERED"}


def forkable(env: dict[str, str]) -> bool:
    if os.environ.get("EXAMFORGE_TEST_FORK") == "0":
        return False
    if "LD_PRELOAD" in env or "FAKETIME" in env:
        return False
    return not [k for k in env if k.startswith("PYTHON") and k not in _SAME_AS_SERVER
                and env[k] != os.environ.get(k)]


def _run_module(module: str, argv: list[str], env: dict[str, str], cwd: str,
                log_path: str) -> None:
    """The child: become `python -m <module> <argv>` with this environment, directory and
    output, then run it."""
    import io
    import runpy

    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    # As with PYTHONUNBUFFERED=1: every write reaches the file at once (the tests read it).
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True,
                                  line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                  line_buffering=True, errors="backslashreplace")
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Forked:
    """The subprocess.Popen methods the tests use, for a forked process."""

    def __init__(self, process: Any, args: list[str]) -> None:
        self._process = process
        self.pid: int = process.pid
        self.args = args
        self.stdout = None
        self.stderr = None

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # type: ignore[no-any-return]

    def poll(self) -> int | None:
        return self._process.exitcode  # type: ignore[no-any-return]

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code  # type: ignore[no-any-return]

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(module: str, argv: list[str], env: dict[str, str], cwd: Path,
          log_path: Path) -> Forked:
    """`python -m <module> <argv>`, forked."""
    ensure_server()
    process = CONTEXT.Process(target=_run_module, name=module,
                              args=(module, argv, env, str(cwd), str(log_path)))
    process.start()
    return Forked(process, [sys.executable, "-m", module, *argv])
