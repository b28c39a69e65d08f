"""Run the real CLI and real Celery worker processes against the mock model server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import wait_for, write_syllabus

ROOT = Path(__file__).resolve().parents[2]

# The commands that Deployment.cli_in_process may run: those that never reach the broker, and
# those that publish (BROKER_COMMANDS), through the Celery app of their own settings
# (tasks.app.app_for), not the one this process configured at its first import.
BROKER_COMMANDS = frozenset({"enqueue", "resume", "retry", "reconcile"})
IN_PROCESS = frozenset({"status", "exams", "export", "review", "run", "cancel", "migrate",
                        "import", "prune", "token", "audit", "backup"}) | BROKER_COMMANDS


@dataclass
class Deployment:
    """One exam deployment: a working directory, its environment, and its processes."""

    workdir: Path
    env: dict[str, str]
    mock: Any
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _store: Any = None

    @classmethod
    def create(cls, tmp_path: Path, database_url: str, broker_url: str, mock: Any,
               **settings: Any) -> "Deployment":
        env = {k: v for k, v in os.environ.items() if not k.startswith(
            ("BROKER_", "DATABASE_", "LLM_", "EXAMS_", "LEASE_", "QUESTIONS_"))}
        env.update({
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p),
            "PYTHONUNBUFFERED": "1",
            "BROKER_URL": broker_url,
            "DATABASE_URL": database_url,
            "LLM_BASE_URL": mock.base_url,
            "LLM_API_KEY": "sk-e2e",
            "LLM_TIMEOUT_S": "3",
            "EXAMS_DIR": str(tmp_path / "exams"),
            "QUESTIONS_PER_CALL": "5",
            "LEASE_S": "4",
            "RETRY_BASE_S": "0.2",
            "RETRY_MAX_S": "2",
            "RECONCILE_INTERVAL_S": "2",
            "WORKER_SOFT_SHUTDOWN_S": "5",
            "TASK_QUEUE": f"ef-{uuid.uuid4().hex[:8]}",
        })
        env.update({k.upper(): str(v) for k, v in settings.items()})
        return cls(tmp_path, env, mock)

    def syllabus(self, slug: str, chapters: list[tuple[str, int]] | dict[str, Any]) -> Path:
        return write_syllabus(Path(self.env["EXAMS_DIR"]), slug, chapters)

    def cli(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "producer", *args], cwd=self.workdir,
                              env={**self.env, **env}, capture_output=True, text=True,
                              timeout=timeout)

    def cli_in_process(self, *args: str, timeout: float | None = None,
                       **env: str) -> subprocess.CompletedProcess[str]:
        """`cli` for a test that is not about the process itself: run in this process
        (`cli_here`), unless EXAMFORGE_TEST_CLI_HERE=0 makes it a real process. The mock's
        server runs in a process of its own (mockproc.py), so a command run here cannot delay
        its replies."""
        if os.environ.get("EXAMFORGE_TEST_CLI_HERE") == "0":
            return self.cli(*args, timeout=timeout or 60, **env)
        return self.cli_here(*args, timeout=timeout, **env)

    def cli_here(self, *args: str, timeout: float | None = None,
                 **env: str) -> subprocess.CompletedProcess[str]:
        """`cli`, run in this process (producer.cli.main) with the same environment, working
        directory, arguments and captured output, for a test that is not about the process
        itself: the same code without a Python start-up (0.3 to 0.6 s of CPU a call, about
        500 calls a run). The commands of IN_PROCESS only. `timeout` is `cli`'s, for the same
        call sites; pytest-timeout bounds a call here."""
        import contextlib
        import gc
        import io
        import logging
        import traceback

        from examforge.settings import load_settings
        from producer.cli import main

        command = next((a for a in args if not a.startswith("-")), "")
        assert command in IN_PROCESS, f"`{command}` reaches the broker: use Deployment.cli"
        environment = {**self.env, **env}
        # A crash hook (EXAMFORGE_TEST_*_CRASH) SIGKILLs its process: never this one.
        hooks = [k for k in environment if k.startswith("EXAMFORGE_TEST_") and k.endswith("_CRASH")]
        assert not hooks, f"{hooks}: use Deployment.cli or spawn_cli"
        from producer import commands

        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
        err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
        environ, cwd = dict(os.environ), os.getcwd()
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        # `run` sets its own (Ctrl-C finishes the calls in flight); pytest's are put back.
        handlers_of = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        consoles = commands.out, commands.err
        # A command migrates with Alembic itself, as its process would, not with this
        # process's replay of the migrated schema (tests/schema_template.py).
        import alembic.command
        import schema_template

        replay = alembic.command.upgrade
        if schema_template._original is not None:
            alembic.command.upgrade = schema_template._original
        try:
            os.environ.clear()
            os.environ.update(environment)
            os.chdir(self.workdir)
            load_settings.cache_clear()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                # Made on these streams, as a process's import makes them on its pipes (off a
                # terminal, tables as wide as their cells).
                commands.out, commands.err = commands._console(), commands._console(stderr=True)
                try:
                    code = main(list(args))
                except Exception:  # as the interpreter would: the traceback, exit 1
                    traceback.print_exc()
                    code = 1
                out.flush()
                err.flush()
        finally:
            alembic.command.upgrade = replay
            commands.out, commands.err = consoles
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(cwd)
            load_settings.cache_clear()
            root.handlers[:], root.level = handlers, level
            for sig, handler in handlers_of.items():
                signal.signal(sig, handler)
            gc.collect()  # the command's engine and its connections, as its process's end would
        decoded = [stream.buffer.getvalue().decode(errors="replace").replace("\r\n", "\n")
                   for stream in (out, err)]
        return subprocess.CompletedProcess(["producer", *args], code, *decoded)

    def spawn_cli(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "producer", *args], cwd=self.workdir,
                                env={**self.env, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def worker(self, concurrency: int = 8, *extra: str, **env: str) -> subprocess.Popen[bytes]:
        name = f"w{len(self.procs)}-{uuid.uuid4().hex[:6]}@%h"
        proc = self._celery(self.workdir / f"worker-{len(self.procs)}.log", {**self.env, **env},
                            "-A", "tasks", "worker", "-P", "threads", "-c", str(concurrency),
                            "-n", name, "--loglevel", "INFO", "--without-mingle",
                            "--without-gossip", *extra)
        self.procs.append(proc)
        return proc

    def _celery(self, log_path: Path, env: dict[str, str], *argv: str) -> Any:
        """`python -m celery <argv>`: forked from the tests' forkserver (forks.py), which
        imported Celery and the libraries once, or a real command where a fork cannot be
        one (an LD_PRELOAD, EXAMFORGE_TEST_FORK=0)."""
        import forks

        if forks.forkable(env):
            return forks.start("celery", list(argv), env, self.workdir, log_path)
        log = open(log_path, "wb")
        return subprocess.Popen([sys.executable, "-m", "celery", *argv], cwd=self.workdir,
                                env=env, stdout=log, stderr=subprocess.STDOUT)

    def beat(self, **env: str) -> subprocess.Popen[bytes]:
        """`celery -A tasks beat`: the reconciler every RECONCILE_INTERVAL_S."""
        proc = self._celery(self.workdir / f"worker-beat-{len(self.procs)}.log",
                            {**self.env, **env}, "-A", "tasks", "beat", "--loglevel", "INFO",
                            "--schedule", str(self.workdir / f"beat-{len(self.procs)}.schedule"))
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(timeout=60)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=30)
        if self._store is not None:
            self._store.engine.dispose()

    @property
    def store(self) -> Any:
        if self._store is None:
            from examforge.settings import normalise_database_url
            from storage import open_store

            # Migrating is safe beside the processes doing the same.
            self._store = open_store(normalise_database_url(self.env["DATABASE_URL"]),
                                     pool_size=2)
        return self._store

    def status(self, slug: str) -> dict[str, Any]:
        return self.store.status(slug).as_dict()

    def wait_done(self, slug: str, timeout_s: float = 120) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            report = self.status(slug)
            ch = report["chapters"]
            return report if ch["done"] + ch["failed"] + ch["cancelled"] == ch["total"] else None

        return wait_for(finished, timeout_s, f"exam {slug} to finish", interval_s=0.3)

    def wait_drained(self, timeout_s: float = 60) -> None:
        """Wait until every message of this deployment's queue was taken and acknowledged:
        none queued (at any priority), none unacknowledged. With task_acks_late a worker
        acknowledges a message once its task has ended (a retry's countdown holds it
        unacknowledged), so nothing is left that could still make a call. What a test waits
        for before it checks that duplicates or a cancel made no call, instead of a sleep."""
        import redis

        client = redis.Redis.from_url(self.env["BROKER_URL"])
        queue = self.env["TASK_QUEUE"]

        def drained() -> bool:
            queued = sum(client.llen(key) for key in client.scan_iter(match=f"{queue}*"))
            return queued == 0 and client.hlen("unacked") == 0

        try:
            wait_for(drained, timeout_s, f"queue {queue} drained", interval_s=0.1)
        finally:
            client.close()

    def worker_logs(self, tail_chars: int | None = 4000) -> str:
        """The workers' logs (by default the tail of each, for assertion messages)."""
        texts = [p.read_text(errors="replace") for p in sorted(self.workdir.glob("worker-*.log"))]
        return "\n".join(t[-tail_chars:] if tail_chars else t for t in texts)

    def calls(self, slug: str) -> list[dict[str, Any]]:
        from sqlalchemy import select

        from storage.db import READ_ONLY
        from storage.store import K

        # A read snapshot (deferred BEGIN on SQLite): never waits for a writer, not even a
        # frozen one holding the write lock (tests/e2e/test_chaos.py reads in such a freeze).
        with self.store.engine.connect().execution_options(**{READ_ONLY: True}) as conn:
            return [dict(r._mapping) for r in conn.execute(
                select(K).where(K.c.exam == slug).order_by(K.c.id))]


def assert_stored_exactly_once(dep: Deployment, slug: str, targets: dict[str, int]) -> None:
    """Every chapter holds numbers 1..target once, with no repeated question text."""
    rows = dep.store.questions(slug)
    by_chapter: dict[str, list[int]] = {}
    for row in rows:
        by_chapter.setdefault(row["chapter_id"], []).append(row["number"])
    assert {c: sorted(n) for c, n in by_chapter.items()} == {
        c: list(range(1, t + 1)) for c, t in targets.items()}
    texts = [(r["chapter_id"], r["question"]) for r in rows]
    assert len(texts) == len(set(texts))


def used_batches(calls: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(c["chapter_id"], c["first_number"]) for c in calls if c["outcome"] == "used"]


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]
