"""Celery workers under test: examforge's (`celery -A tasks worker -P threads`, work published
by `python -m producer enqueue`) or the minimal task's (bench.systems.minimal).

A `Cluster` starts its workers once (on a fresh database and an empty Redis db) and runs any
number of exams through them, one after the other; each `run` is timed from the first paid
call reaching the mock to the last chapter finished in the database."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from bench.measure import (
    PG_ADMIN_URL,
    REDIS_URL,
    ROOT,
    DbProbe,
    MockProbe,
    Result,
    flush_redis,
    proc_cpu_s,
    proc_rss_mb,
    servers_cpu_s,
    servers_delta,
    stop_child,
    wait_child,
    wait_done,
    wait_workers_ready,
    write_syllabus,
)
from bench.systems.embedded import ef_env

# What bench.systems.tuned applies over examforge's Celery settings (named here, so that the
# bench process need not import `tasks` to start a tuned cluster).
CELERY_CONF_ENV = "BENCH_CELERY_CONF"


@dataclass(frozen=True)
class ClusterSpec:
    workers: int = 1
    threads: int = 32  # per worker
    database: str = "sqlite"  # or "postgres"
    qpc: int = 5  # QUESTIONS_PER_CALL
    prefetch: int = 1  # WORKER_PREFETCH_MULTIPLIER
    app: str = "examforge"  # or "minimal"
    group_commit: bool = True  # GROUP_COMMIT (storage.group): the A/B of `overhead`, `slots32`
    # Celery settings over examforge's own, as JSON (bench.systems.tuned); "" for none.
    celery_conf: str = ""

    @property
    def slots(self) -> int:
        return self.workers * self.threads

    def describe(self) -> str:
        db = "PostgreSQL" if self.database == "postgres" else "SQLite"
        what = "examforge" if self.app == "examforge" else "minimal Celery task"
        extra = f", prefetch {self.prefetch}" if self.prefetch != 1 else ""
        if not self.group_commit and self.app == "examforge":
            extra += ", group commit off"
        if self.celery_conf not in ("", "{}"):
            extra += f", Celery settings {self.celery_conf}"
        return f"{what}: {self.workers} × `celery worker -P threads -c {self.threads}`, {db}{extra}"


class Cluster:
    """Workers started once for several runs; stopped, their database dropped, on exit."""

    def __init__(self, spec: ClusterSpec, mock: MockProbe, workdir: Path,
                 redis_url: str | None = None) -> None:
        self.spec = spec
        self.mock = mock
        self.workdir = workdir
        self.redis_url = redis_url or REDIS_URL
        self.queue = f"efbench-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen] = []
        self.pg_db: str | None = None
        self.db_url = ""
        self.command = ""

    # ------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def _start(self) -> None:
        spec = self.spec
        tag = uuid.uuid4().hex[:8]
        if spec.database == "postgres":
            import psycopg

            self.pg_db = f"efbench_{tag}"
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{self.pg_db}"')
            self.db_url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{self.pg_db}"
        else:
            self.db_url = f"sqlite:///{self.workdir / f'cluster-{tag}.db'}"
        flush_redis(self.redis_url)
        env = self.env()
        if spec.app == "examforge":
            # Create the schema before the workers race to do it: here, in this process, where
            # Alembic is imported once for every cluster of the run (a `producer migrate` child
            # cost a Python start-up more, about 0.6 s of CPU a cluster).
            from storage import connect, migrate

            engine = connect(self.db_url)
            try:
                migrate(engine)
            finally:
                engine.dispose()
        celery = str(Path(sys.executable).with_name("celery"))
        module = ("bench.systems.minimal" if spec.app != "examforge"
                  else "bench.systems.tuned" if spec.celery_conf else "tasks")
        cmds = [[celery, "-A", module, "worker", "-P", "threads", "-c", str(spec.threads),
                 "-Q", self.queue, "-n", f"bench{i}-{self.queue}@%h", "--without-mingle",
                 "--without-gossip"] for i in range(spec.workers)]
        if spec.app == "examforge":  # the reconciler's queue too, as a deployment would
            for cmd in cmds:
                cmd[cmd.index("-Q") + 1] = f"{self.queue},{self.queue}-control"
        self.command = " ".join(shlex.quote(a) for a in cmds[0]).replace(celery, "celery")
        for i, cmd in enumerate(cmds):
            with open(self.workdir / f"{self.queue}-worker{i}.log", "wb") as log:
                self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT))
        wait_workers_ready(self.procs, url=self.redis_url,
                           epoch_key="examforge:broker-epoch" if spec.app == "examforge"
                           else None)
        time.sleep(1.0)  # let the start-up reconcile pass finish

    def _stop(self) -> None:
        for p in self.procs:
            stop_child(p)
        self.procs = []
        if self.pg_db is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)')
            self.pg_db = None
        flush_redis(self.redis_url)

    def env(self) -> dict[str, str]:
        extra = {"WORKER_PREFETCH_MULTIPLIER": str(self.spec.prefetch),
                 "GROUP_COMMIT": "true" if self.spec.group_commit else "false"}
        if self.spec.celery_conf:
            extra[CELERY_CONF_ENV] = self.spec.celery_conf
        if self.spec.app == "minimal":
            extra["MINIMAL_DB"] = self.db_url[len("sqlite:///"):]
        return ef_env(self.workdir, self.db_url, self.mock.url, self.spec.qpc, self.queue,
                      self.redis_url, **extra)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def probe(self) -> DbProbe:
        if self.spec.app == "minimal":
            from bench.systems.minimal import PROBE_SQL

            return DbProbe(self.db_url, **PROBE_SQL)
        return DbProbe(self.db_url)

    # ------------------------------------------------------------------------- one run
    def run(self, name: str, targets: list[int], calls_needed: int,
            timeout_s: float = 900) -> Result:
        """One exam of `targets` through the workers, timed at the mock and the database."""
        spec = self.spec
        slug = f"{name.replace('_', '-')[:20]}-{uuid.uuid4().hex[:6]}".lower()
        res = Result(name, spec.describe(), sum(targets), calls_needed, chapters=len(targets),
                     slots=spec.slots, latency_s=self.mock.latency_s)
        env = self.env()
        if spec.app == "examforge":
            write_syllabus(self.workdir / "exams", slug, targets)
            cli = "bench.systems.tuned" if spec.celery_conf else "producer"
            enqueue = [sys.executable, "-m", cli, "enqueue", slug]
            res.command = f"{self.command} (×{spec.workers}); python -m {cli} enqueue {slug}"
        else:
            enqueue = [sys.executable, "-m", "bench.systems.minimal", "enqueue", slug,
                       ",".join(map(str, targets))]
            res.command = f"{self.command} (×{spec.workers}); python -m bench.systems.minimal"
        db = self.probe()
        try:
            self.mock.arm(slug, self.pids)
            cpu0 = {pid: proc_cpu_s(pid) for pid in self.pids}
            probe0 = proc_cpu_s(db.backend_pid) if db.backend_pid else 0.0
            servers0 = servers_cpu_s()
            launched = time.monotonic()
            # To a file, not a pipe: enqueue prints a line per chapter, more than a pipe holds.
            enq_log = self.workdir / f"{slug}-enqueue.log"
            with open(enq_log, "wb") as log:
                enq = subprocess.Popen(enqueue, cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            try:
                done = wait_done(db, slug, len(targets), timeout_s, [*self.procs, enq])
            except TimeoutError as exc:  # what the workers said, beside where they hang
                logs = "\n".join(
                    f"--- {log.name} (end):\n" + log.read_text(errors="replace")[-3000:]
                    for log in sorted(self.workdir.glob(f"{self.queue}-worker*.log")))
                raise type(exc)(f"{exc}\n{logs}") from None
            cpu1 = {pid: proc_cpu_s(pid) for pid in self.pids}
            servers1 = servers_cpu_s(exclude=[db.backend_pid])  # only `after`'s pids count
            if db.backend_pid:
                res.notes.append(f"the bench's own polls cost PostgreSQL "
                                 f"{(proc_cpu_s(db.backend_pid) - probe0) * 1000:.0f} ms CPU "
                                 "(left out of the servers' CPU)")
            res.bench_cpu_s = self.mock.bench_cpu_since_first()
            res.machine_cpu_s = self.mock.machine_cpu_since_first()
            usage = wait_child(enq, 120)
            output = enq_log.read_text(errors="replace")
            if usage.code != 0:
                res.error = f"enqueue exit {usage.code}: {output[-500:]}"
            first = self.mock.first_call_t
            res.window_s = done - first if first else None
            res.e2e_s = done - launched
            res.cpu_window_s = sum(cpu1[p] - self.mock.cpu_at_first.get(p, cpu0[p])
                                   for p in cpu1)
            res.cpu_e2e_s = sum(cpu1[p] - cpu0[p] for p in cpu1) + usage.cpu_s
            res.server_cpu_s = servers_delta(self.mock.servers_at_first or servers0, servers1)
            rss = [proc_rss_mb(pid) for pid in self.pids]
            res.rss_mb = sum(r[0] for r in rss)
            res.peak_rss_mb = sum(r[1] for r in rss)
            res.questions_stored = db.questions(slug)
            res.calls_paid, res.calls_other = self.mock.calls_for(slug)
            res.max_inflight = self.mock.max_inflight()
            res.notes.append(f"enqueue {usage.cpu_s * 1000:.0f} ms CPU (in the e2e CPU "
                             "column); worker start-up not timed")
            failed = db.chapters_failed(slug)
            if failed:
                res.notes.append(f"{failed} chapters failed")
        finally:
            db.close()
        return res


def run_distributed(name: str, mock: MockProbe, workdir: Path, targets: list[int],
                    calls_needed: int, spec: ClusterSpec, redis_url: str | None = None
                    ) -> Result:
    """Start a cluster, run one exam through it, stop it."""
    with Cluster(spec, mock, workdir, redis_url) as cluster:
        return cluster.run(name, targets, calls_needed)
