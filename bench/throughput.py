"""Throughput benchmark: examforge against a plain asyncio + httpx script, in one run.

Every number in the report is a ratio or a per-request cost measured in the same run against
the same in-process mock server, never an absolute-time assertion. See bench/README.md.

    python bench/throughput.py [--questions 3200] [--chapters 64]
        [--latency-s 0.5] [--questions-per-reply 5] [--concurrency 32]
        [--only baseline,embedded,...] [--curator-python PATH]

Systems (each run once):
  baseline      one asyncio + httpx process, semaphore of CONCURRENCY, same requests as
                examforge/llm.py, replies validated by examforge.output.parse_questions, each
                batch appended to a JSONL file ("the seed script done right")
  embedded      `python -m producer run SLUG --concurrency C` on SQLite
  dist-sqlite   one `celery -A tasks worker -P threads -c C` + `producer enqueue`, SQLite
  dist-pg       the same on a fresh PostgreSQL database
  dist-pg-2x    two workers of -c C/2 each, PostgreSQL
  dist-sqlite-2x two workers of -c C/2 each, SQLite
  curator       the peer bespokelabs-curator (bench/curator_peer.py in its own venv), if present
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import resource
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLK_TCK = os.sysconf("SC_CLK_TCK")
REDIS_URL = "redis://127.0.0.1:6379/12"
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ALL_SYSTEMS = ("baseline", "embedded", "dist-sqlite", "dist-pg", "dist-pg-2x", "dist-sqlite-2x",
               "curator")
DEFAULT_CURATOR_PYTHON = "/tmp/curator-venv/bin/python"


# ----------------------------------------------------------------------------- helpers
def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pids_named(*names: str) -> list[int]:
    """PIDs whose comm is one of `names` (read-only: used to account server CPU)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() in names:
                    out.append(int(entry))
        except OSError:
            pass
    return out


def servers_cpu_s() -> dict[int, float]:
    """CPU of every redis-server and postgres process right now."""
    return {pid: proc_cpu_s(pid) for pid in pids_named("redis-server", "postgres")}


def servers_delta(before: dict[int, float], after: dict[int, float]) -> float:
    # New backends (PostgreSQL forks one per connection) count from zero; ones that exited in
    # between are missed (none should: the pools keep their connections).
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


def _record_child_report(res: "Result", stdout: bytes, launched: float, mock: Any) -> dict[str, Any]:
    """Read the JSON line a timed child process (baseline, curator) prints last, and fill in
    the result's timings and CPU from it."""
    report: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    # monotonic clocks are system-wide on Linux, so the child's timestamp is comparable.
    done = report["done_monotonic"]
    res.e2e_s = done - launched
    res.window_s = done - mock.first_call_t if mock.first_call_t else None
    res.cpu_window_s = report["work_cpu_s"]
    res.cpu_e2e_s = report["total_cpu_s"]
    return report


def wait_rusage(proc: subprocess.Popen, timeout_s: float) -> tuple[int, float]:
    """Wait for a child we started; return (exit code, its user+sys CPU seconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return code, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {proc.pid} still running after {timeout_s:.0f} s")
        time.sleep(0.01)


def stop_child(proc: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM one process we started (by its pid), SIGKILL it if it does not exit."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# ----------------------------------------------------------------------------- the mock
class MockProbe:
    """The in-process mock plus timestamps of this run's first and last call.

    It wraps the mock state's begin/end hooks (they run on the mock's event loop), so the
    window "first paid call -> all stored" is measured where the calls land, and the CPU of the
    processes under test is sampled at the moment the first call arrives."""

    def __init__(self, latency_s: float, questions_per_reply: int) -> None:
        from mockllm import MockConfig, MockServer

        self.server = MockServer(MockConfig(latency_s=latency_s,
                                            questions_per_reply=questions_per_reply))
        self.url = self.server.start()
        state = self.server._service.state  # noqa: SLF001 (bench-only instrumentation)
        self._state = state
        self._begin, self._end = state.begin_call, state.end_call
        self.prefix = ""
        self.watch: list[int] = []
        self.first_call_t: float | None = None
        self.last_end_t: float | None = None
        self.cpu_at_first: dict[int, float] = {}
        self.servers_at_first: dict[int, float] = {}

        def begin(key: str, *rest: Any) -> None:
            if self.first_call_t is None and key.startswith(self.prefix):
                self.first_call_t = time.monotonic()
                self.cpu_at_first = {pid: proc_cpu_s(pid) for pid in self.watch}
                self.servers_at_first = servers_cpu_s()
            self._begin(key, *rest)

        def end(key: str) -> None:
            self._end(key)
            if key.startswith(self.prefix):
                self.last_end_t = time.monotonic()

        # Wraps the mock's own hooks to see the first and last call of this system.
        state.begin_call, state.end_call = begin, end  # type: ignore[method-assign, assignment]

    def arm(self, slug: str, watch: list[int] | None = None) -> None:
        self.prefix = f"{slug}/"
        self.watch = list(watch or [])
        self.first_call_t = None
        self.last_end_t = None
        self.cpu_at_first = {}
        self.servers_at_first = {}

    def calls_for(self, slug: str) -> tuple[int, int]:
        """(chat calls for this exam's chapters, calls with no chapter, e.g. probes)."""
        stats = self.server.stats()
        mine = sum(n for k, n in stats["calls_by_chapter"].items() if k.startswith(f"{slug}/"))
        return mine, stats["calls_by_chapter"].get("unknown", 0)

    def max_inflight(self) -> int:
        return self.server.stats()["max_inflight"]

    def stop(self) -> None:
        self.server.stop()


# ----------------------------------------------------------------------------- results
@dataclass
class Result:
    system: str
    description: str
    questions_target: int
    calls_needed: int
    questions_stored: int = 0
    calls_paid: int = 0
    calls_other: int = 0
    max_inflight: int = 0
    window_s: float | None = None  # first paid call -> all questions stored
    e2e_s: float | None = None  # command launched -> all stored (CLI start-up included)
    cpu_window_s: float | None = None  # CPU of the system's processes over the window
    cpu_e2e_s: float | None = None  # ... from launch, start-up and imports included
    server_cpu_s: float | None = None  # redis-server + postgres processes over the window
    command: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def qps(self, which: str) -> float | None:
        t = self.window_s if which == "window" else self.e2e_s
        return self.questions_stored / t if t else None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["qps_window"], d["qps_e2e"] = self.qps("window"), self.qps("e2e")
        return d


def plan(questions: int, chapters: int, qpc: int) -> tuple[list[int], int]:
    """Per-chapter targets summing to `questions`, and the number of calls they need."""
    chapters = max(1, min(chapters, questions))
    base, extra = divmod(questions, chapters)
    targets = [base + (1 if i < extra else 0) for i in range(chapters)]
    return targets, sum(math.ceil(t / qpc) for t in targets)


def write_syllabus(exams_dir: Path, slug: str, targets: list[int]) -> None:
    folder = exams_dir / slug
    folder.mkdir(parents=True, exist_ok=True)
    syllabus = {"title": f"Benchmark exam {slug}",
                "chapters": [{"id": f"ch-{i:03d}", "title": f"Topic number {i}", "questions": t}
                             for i, t in enumerate(targets)]}
    (folder / "syllabus.json").write_text(json.dumps(syllabus, indent=1))


# ----------------------------------------------------------------------------- baseline
async def _baseline_async(base_url: str, slug: str, targets: list[int], qpc: int,
                          concurrency: int, out_path: str) -> dict[str, Any]:
    import httpx

    from examforge.errors import OutputInvalid
    from examforge.output import parse_questions
    from examforge.prompt import build_messages
    from examforge.syllabus import Chapter

    title = f"Benchmark exam {slug}"
    sem = asyncio.Semaphore(concurrency)
    stats = {"calls": 0, "invalid": 0, "errors": 0, "stored": 0}
    out = open(out_path, "a", encoding="utf-8")
    client = httpx.AsyncClient(
        base_url=base_url.rstrip("/") + "/",
        timeout=httpx.Timeout(60.0, connect=5.0),
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        headers={"Authorization": "Bearer sk-mock"},
    )

    async def chapter(index: int, target: int) -> None:
        spec = Chapter(id=f"ch-{index:03d}", title=f"Topic number {index}", questions=target)
        known: set[str] = set()
        avoid: list[str] = []
        stored, failures = 0, 0
        while stored < target:
            want = min(qpc, target - stored)
            body = {"model": "mock-model",
                    "messages": build_messages(slug, title, spec, want, avoid),
                    "temperature": 0.7, "response_format": {"type": "json_object"}}
            async with sem:
                stats["calls"] += 1
                try:
                    response = await client.post("chat/completions", json=body)
                    response.raise_for_status()
                    choice = response.json()["choices"][0]
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    stats["errors"] += 1
                    failures += 1
                    if failures > 8:
                        raise
                    await asyncio.sleep(min(2 ** failures, 30))
                    continue
            try:
                parsed = parse_questions(choice["message"].get("content"),
                                         choice.get("finish_reason"), want, known)
            except OutputInvalid:
                stats["invalid"] += 1
                continue
            lines = []
            for offset, q in enumerate(parsed.questions):
                lines.append(json.dumps({
                    "exam": slug, "chapter_id": spec.id, "number": stored + offset + 1,
                    "question": q.question, "choices": list(q.choices),
                    "answer_index": q.answer_index, "explanation": q.explanation},
                    ensure_ascii=False))
                known.add(" ".join(q.question.lower().split()))
                avoid.append(q.question)
            out.write("\n".join(lines) + "\n")
            out.flush()
            stored += len(parsed.questions)
            stats["stored"] += len(parsed.questions)

    try:
        await asyncio.gather(*(chapter(i, t) for i, t in enumerate(targets)))
    finally:
        await client.aclose()
        out.close()
    return stats


def baseline_child(args: argparse.Namespace) -> int:
    """Runs in its own process so its rusage holds nothing but the baseline."""
    targets = json.loads(args.targets)
    import httpx  # noqa: F401 - imports are start-up, not steady-state work
    import examforge.output, examforge.prompt, examforge.syllabus  # noqa: F401,E401
    t0, c0 = time.monotonic(), time.process_time()
    stats = asyncio.run(_baseline_async(args.base_url, args.slug, targets, args.qpc,
                                        args.concurrency, args.out))
    t1, c1 = time.monotonic(), time.process_time()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({**stats, "work_s": t1 - t0, "work_cpu_s": c1 - c0,
                      "total_cpu_s": ru.ru_utime + ru.ru_stime, "done_monotonic": t1}))
    return 0


def run_baseline(mock: MockProbe, workdir: Path, targets: list[int], calls_needed: int,
                 qpc: int, concurrency: int) -> Result:
    slug = f"base-{uuid.uuid4().hex[:6]}"
    out = workdir / f"{slug}.jsonl"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_baseline-child",
           "--base-url", mock.url, "--slug", slug, "--targets", json.dumps(targets),
           "--qpc", str(qpc), "--concurrency", str(concurrency), "--out", str(out)]
    res = Result("baseline", f"asyncio + httpx, 1 process, semaphore {concurrency}, JSONL",
                 sum(targets), calls_needed,
                 command=f"{sys.executable} bench/throughput.py --_baseline-child ...")
    mock.arm(slug)
    launched = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=600)
    if proc.returncode != 0:
        res.error = stderr.decode()[-800:]
        return res
    report = _record_child_report(res, stdout, launched, mock)
    lines = out.read_text().splitlines()
    keys = {(json.loads(line)["chapter_id"], json.loads(line)["number"]) for line in lines}
    res.questions_stored = len(keys)
    if len(keys) != len(lines):
        res.notes.append(f"{len(lines) - len(keys)} duplicate lines in the JSONL")
    res.calls_paid, res.calls_other = mock.calls_for(slug)
    res.max_inflight = mock.max_inflight()
    if report["invalid"] or report["errors"]:
        res.notes.append(f"{report['invalid']} invalid replies, {report['errors']} errors")
    return res


# ----------------------------------------------------------------------------- examforge
def ef_env(workdir: Path, db_url: str, mock: MockProbe, qpc: int, queue: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLM_", "DATABASE_", "BROKER_", "EXAMS_", "TASK_", "QUESTIONS_"))}
    env.update({
        "PYTHONPATH": str(ROOT), "DATABASE_URL": db_url, "EXAMS_DIR": str(workdir / "exams"),
        "LLM_BASE_URL": mock.url, "QUESTIONS_PER_CALL": str(qpc), "BROKER_URL": REDIS_URL,
        "TASK_QUEUE": queue, "WORKER_SOFT_SHUTDOWN_S": "5",
    })
    return env


class DbProbe:
    """Counts done chapters and stored questions straight from the database (cheap queries)."""

    def __init__(self, db_url: str) -> None:
        self.url = db_url
        if db_url.startswith("sqlite:///"):
            self._sqlite: str | None = db_url[len("sqlite:///"):]
            self._conn: Any = None
        else:
            self._sqlite = None
            import psycopg

            self._conn = psycopg.connect(db_url, autocommit=True)

    def _query(self, sql: str, slug: str) -> int:
        if self._sqlite is not None:
            if not os.path.exists(self._sqlite):
                return 0
            conn = sqlite3.connect(f"file:{self._sqlite}?mode=ro", uri=True, timeout=5)
            try:
                return conn.execute(sql.replace("%s", "?"), (slug,)).fetchone()[0]
            except sqlite3.OperationalError:  # schema not created yet
                return 0
            finally:
                conn.close()
        try:
            return self._conn.execute(sql, (slug,)).fetchone()[0]
        except Exception:  # noqa: BLE001 - schema not created yet
            return 0

    def chapters_done(self, slug: str) -> int:
        return self._query("SELECT count(*) FROM slice WHERE exam = %s AND state = 'done'", slug)

    def chapters_failed(self, slug: str) -> int:
        return self._query("SELECT count(*) FROM slice WHERE exam = %s AND state = 'failed'",
                           slug)

    def questions(self, slug: str) -> int:
        return self._query("SELECT count(DISTINCT chapter_id || '/' || number) FROM question "
                           "WHERE exam = %s", slug)

    def calls(self, slug: str) -> int:
        return self._query("SELECT count(*) FROM call WHERE exam = %s", slug)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def wait_done(db: DbProbe, slug: str, chapters: int, timeout_s: float,
              procs: list[subprocess.Popen]) -> float:
    """Poll until every chapter is done; return the monotonic time it was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if db.chapters_done(slug) + db.chapters_failed(slug) >= chapters:
            return time.monotonic()
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise RuntimeError(f"pid {p.pid} exited with {p.returncode}")
        time.sleep(0.02)
    raise TimeoutError(f"{slug}: not done after {timeout_s:.0f} s")


def run_embedded(mock: MockProbe, workdir: Path, targets: list[int], calls_needed: int,
                 qpc: int, concurrency: int) -> Result:
    slug = f"emb-{uuid.uuid4().hex[:6]}"
    db_url = f"sqlite:///{workdir / 'embedded.db'}"
    env = ef_env(workdir, db_url, mock, qpc, "unused")
    write_syllabus(workdir / "exams", slug, targets)
    cmd = [sys.executable, "-m", "producer", "run", slug, "--concurrency", str(concurrency)]
    res = Result("embedded", f"`producer run --concurrency {concurrency}`, SQLite",
                 sum(targets), calls_needed,
                 command=f"python -m producer run {slug} --concurrency {concurrency}")
    db = DbProbe(db_url)
    log = open(workdir / f"{slug}.log", "wb")
    launched = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    mock.arm(slug, [proc.pid])
    try:
        done = wait_done(db, slug, len(targets), 600, [proc])
        cpu_done = proc_cpu_s(proc.pid)
        code, cpu_total = wait_rusage(proc, 120)
        exited = time.monotonic()
    finally:
        stop_child(proc)
        log.close()
    if code != 0:
        res.error = f"exit {code}: " + (workdir / f"{slug}.log").read_text()[-800:]
    res.window_s = done - mock.first_call_t if mock.first_call_t else None
    res.e2e_s = done - launched
    res.cpu_window_s = cpu_done - mock.cpu_at_first.get(proc.pid, 0.0)
    res.cpu_e2e_s = cpu_total
    res.questions_stored = db.questions(slug)
    res.calls_paid, res.calls_other = mock.calls_for(slug)
    res.max_inflight = mock.max_inflight()
    res.notes.append(f"process exit {exited - done:.2f} s after the last commit")
    if db.chapters_failed(slug):
        res.notes.append(f"{db.chapters_failed(slug)} chapters failed")
    db.close()
    return res


def flush_redis() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    client.close()


def wait_workers_ready(procs: list[subprocess.Popen], timeout_s: float = 90) -> None:
    """Ready = each worker blocks in BRPOP on our Redis database (the consumer loop runs) and
    the start-up reconcile has run (it creates the broker epoch key after our FLUSHDB).

    The default log level (WARNING) prints no 'ready.' line, so the broker is watched instead."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    db = int(REDIS_URL.rsplit("/", 1)[1])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker pid {p.pid} exited with {p.returncode}")
            blocked = [c for c in client.client_list()
                       if int(c.get("db", -1)) == db and c.get("cmd") in ("brpop", "blpop")]
            if len(blocked) >= len(procs) and client.exists("examforge:broker-epoch"):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise TimeoutError("workers not ready")


def run_distributed(name: str, mock: MockProbe, workdir: Path, targets: list[int],
                    calls_needed: int, qpc: int, concurrency: int, workers: int,
                    database: str) -> Result:
    slug = f"{name.replace('dist-', 'd').replace('-', '')}-{uuid.uuid4().hex[:6]}"
    queue = f"efbench-{uuid.uuid4().hex[:8]}"
    pg_db = None
    if database == "postgres":
        import psycopg

        pg_db = f"efbench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{pg_db}"')
        db_url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{pg_db}"
    else:
        db_url = f"sqlite:///{workdir / (slug + '.db')}"
    per_worker = concurrency // workers
    env = ef_env(workdir, db_url, mock, qpc, queue)
    write_syllabus(workdir / "exams", slug, targets)
    celery = str(Path(sys.executable).with_name("celery"))
    worker_cmds = [[celery, "-A", "tasks", "worker", "-P", "threads", "-c", str(per_worker),
                    "-n", f"bench{i}-{queue}@%h", "--without-mingle", "--without-gossip"]
                   for i in range(workers)]
    shown = " ".join(shlex.quote(a) for a in worker_cmds[0]).replace(celery, "celery")
    res = Result(name, f"{workers} × `celery worker -P threads -c {per_worker}`, "
                 f"{'PostgreSQL' if database == 'postgres' else 'SQLite'}, Redis",
                 sum(targets), calls_needed,
                 command=f"{shown} (×{workers}); python -m producer enqueue {slug}")
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    db = None
    try:
        flush_redis()
        if database == "postgres":  # create the schema before the workers race to do it
            subprocess.run([sys.executable, "-m", "producer", "migrate"], cwd=ROOT, env=env,
                           check=True, capture_output=True, timeout=120)
        for i, cmd in enumerate(worker_cmds):
            path = workdir / f"{slug}-worker{i}.log"
            logs.append(path)
            with open(path, "wb") as log:
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
        wait_workers_ready(procs)
        time.sleep(1.0)  # let the start-up reconcile pass finish
        db = DbProbe(db_url)
        mock.arm(slug, [p.pid for p in procs])
        cpu0 = {p.pid: proc_cpu_s(p.pid) for p in procs}
        servers0 = servers_cpu_s()
        launched = time.monotonic()
        enq = subprocess.Popen([sys.executable, "-m", "producer", "enqueue", slug], cwd=ROOT,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        done = wait_done(db, slug, len(targets), 600, procs)
        cpu1 = {p.pid: proc_cpu_s(p.pid) for p in procs}
        servers1 = servers_cpu_s()
        code, enq_cpu = wait_rusage(enq, 60)
        assert enq.stdout is not None
        output = enq.stdout.read().decode()
        enq.stdout.close()
        if code != 0:
            res.error = f"enqueue exit {code}: {output[-500:]}"
        res.window_s = done - mock.first_call_t if mock.first_call_t else None
        res.e2e_s = done - launched
        res.cpu_window_s = sum(cpu1[p] - mock.cpu_at_first.get(p, cpu0[p]) for p in cpu1)
        res.cpu_e2e_s = sum(cpu1[p] - cpu0[p] for p in cpu1) + enq_cpu
        res.server_cpu_s = servers_delta(mock.servers_at_first or servers0, servers1)
        res.questions_stored = db.questions(slug)
        res.calls_paid, res.calls_other = mock.calls_for(slug)
        res.max_inflight = mock.max_inflight()
        res.notes.append(f"enqueue CLI {enq_cpu * 1000:.0f} ms CPU (in the e2e CPU column); "
                         "worker start-up not timed")
        if db.chapters_failed(slug):
            res.notes.append(f"{db.chapters_failed(slug)} chapters failed")
    finally:
        for p in procs:
            stop_child(p)
        if db is not None:
            db.close()
        if pg_db is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')
        flush_redis()
    return res


# ----------------------------------------------------------------------------- curator peer
def run_curator(mock: MockProbe, workdir: Path, targets: list[int], calls_needed: int,
                qpc: int, concurrency: int, python: str) -> Result:
    slug = f"cur-{uuid.uuid4().hex[:6]}"
    res = Result("curator", f"bespokelabs-curator, backend openai, max_concurrent_requests "
                 f"{concurrency}", sum(targets), calls_needed,
                 command=f"{python} bench/curator_peer.py ...")
    if not Path(python).exists():
        res.error = f"no curator venv at {python}"
        return res
    site = subprocess.run([python, "-c", "import litellm, os; print(os.path.dirname("
                           "litellm.__file__))"], capture_output=True, text=True, timeout=120)
    if site.returncode != 0:
        res.error = "litellm not importable in the curator venv"
        return res
    scratch = workdir / "curator-home"
    scratch.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HF_"))}
    env.update({
        "TIKTOKEN_CACHE_DIR": str(Path(site.stdout.strip()) / "litellm_core_utils" / "tokenizers"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
        "TELEMETRY_ENABLED": "false", "CURATOR_VIEWER": "0", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(scratch),
        "HF_HOME": str(scratch / "hf"), "CURATOR_CACHE_DIR": str(scratch / "cache"),
        "PYTHONPATH": str(ROOT),
    })
    rows = []
    for i, t in enumerate(targets):
        for start in range(0, t, qpc):
            rows.append({"chapter": i, "want": min(qpc, t - start)})
    spec = {"base_url": mock.url, "slug": slug, "rows": rows, "concurrency": concurrency,
            "working_dir": str(scratch / "work"), "out": str(workdir / f"{slug}.jsonl")}
    spec_path = workdir / f"{slug}.json"
    spec_path.write_text(json.dumps(spec))
    mock.arm(slug)
    launched = time.monotonic()
    proc = subprocess.Popen([python, str(BENCH / "curator_peer.py"), str(spec_path)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        stop_child(proc)
        res.error = "timed out"
        return res
    (workdir / f"{slug}.stderr").write_bytes(stderr)
    if proc.returncode != 0:
        res.error = f"exit {proc.returncode}: " + stderr.decode(errors="replace")[-800:]
        return res
    report = _record_child_report(res, stdout, launched, mock)
    res.questions_stored = report["stored"]
    res.calls_paid, res.calls_other = mock.calls_for(slug)
    res.max_inflight = mock.max_inflight()
    res.notes.append(f"{res.calls_other} probe request(s) with empty messages at construction, "
                     "not counted as paid calls")
    if report.get("invalid"):
        res.notes.append(f"{report['invalid']} rows with invalid output")
    if report.get("children_cpu_s"):
        res.notes.append(f"{report['children_cpu_s'] * 1000:.0f} ms CPU in child processes "
                         "(in the start-up column only)")
    res.notes.append("one request per row, no per-chapter avoid list; curator "
                     f"{report.get('version', '?')}")
    return res


# ----------------------------------------------------------------------------- report
def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render(results: list[Result], args: argparse.Namespace, argv: list[str],
           started: dt.datetime, total_s: float) -> str:
    base = next((r for r in results if r.system == "baseline" and not r.error), None)
    rows = []
    for r in results:
        if r.error:
            rows.append(f"| {r.system} | {r.description} | error: "
                        f"{r.error.strip().splitlines()[-1][:120]} |" + " |" * 9)
            continue
        qw, qe = r.qps("window"), r.qps("e2e")
        bw, be = (base.qps("window"), base.qps("e2e")) if base else (None, None)
        ratio_w = qw / bw if qw and bw else None
        ratio_e = qe / be if qe and be else None
        per = 1000 / r.calls_paid if r.calls_paid else None
        cpu_w = r.cpu_window_s * per if per and r.cpu_window_s is not None else None
        cpu_e = r.cpu_e2e_s * per if per and r.cpu_e2e_s is not None else None
        srv = r.server_cpu_s * per if per and r.server_cpu_s is not None else None
        rows.append(
            f"| {r.system} | {r.description} | {fmt(qw, '.1f')} | {fmt(ratio_w, '.2f')} | "
            f"{fmt(qe, '.1f')} | {fmt(ratio_e, '.2f')} | {fmt(cpu_w, '.2f')} | "
            f"{fmt(cpu_e, '.2f')} | {fmt(srv, '.2f') if srv is not None else '–'} | "
            f"{r.calls_paid} / {r.calls_needed} | {r.questions_stored} / {r.questions_target} |")
    ideal_calls_s = args.concurrency / args.latency_s if args.latency_s else None
    ideal_q_s = ideal_calls_s * args.questions_per_reply if ideal_calls_s else None
    lines = [
        "# examforge throughput benchmark",
        "",
        f"- command: `{' '.join(shlex.quote(a) for a in argv)}` (from {ROOT})",
        f"- date: {started.isoformat(timespec='seconds')}; total benchmark time {total_s:.0f} s",
        f"- machine: nproc={os.cpu_count()}, {platform.platform()}, Python "
        f"{platform.python_version()}",
        f"- mock: in-process `mockllm`, latency {args.latency_s} s, "
        f"{args.questions_per_reply} questions per reply, no faults",
        f"- work: {args.questions} questions in {len(plan(args.questions, args.chapters, args.questions_per_reply)[0])} "
        f"chapters, QUESTIONS_PER_CALL={args.questions_per_reply}, concurrency "
        f"{args.concurrency} everywhere; ideal = {fmt(ideal_q_s, '.0f')} questions/s "
        f"({fmt(ideal_calls_s, '.0f')} calls/s)",
        "- each configuration was run **once**, one after the other, on the same mock",
        "",
        "| system | what | q/s (first call → all stored) | ratio to baseline | "
        "q/s (launch → all stored) | ratio to baseline | CPU ms/request (steady) | "
        "CPU ms/request (incl. start-up) | Redis+PG CPU ms/request | paid calls at mock / "
        "needed | questions stored / target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Columns: *first call → all stored* is timed from the first chat request of the run "
        "reaching the mock until the last batch is durable (JSONL line flushed, or every chapter "
        "`done` in the database); *launch → all stored* adds process start-up (imports, "
        "migrations) for the CLI modes and the enqueue for the distributed ones (worker start-up "
        "is excluded: workers are long-lived). *CPU (steady)* is user+sys CPU of the system's "
        "own processes over the first window (from /proc, or process_time inside the baseline "
        "and curator processes); *incl. start-up* also counts interpreter start-up and imports "
        "(and the enqueue CLI). The mock's own CPU is never counted. *Redis+PG CPU* is the CPU "
        "of every redis-server and postgres process on the machine over the window (other "
        "users of those servers would show up here).",
        "",
        "Notes:",
    ]
    for r in results:
        for note in r.notes:
            lines.append(f"- {r.system}: {note}")
        if r.max_inflight:
            lines.append(f"- {r.system}: max concurrent requests seen by the mock "
                         f"{r.max_inflight}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--questions", type=int, default=3200, help="questions per system (total)")
    p.add_argument("--chapters", type=int, default=64)
    p.add_argument("--latency-s", type=float, default=0.5)
    p.add_argument("--questions-per-reply", type=int, default=5,
                   help="mock questions per reply, and QUESTIONS_PER_CALL")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--only", default=",".join(ALL_SYSTEMS),
                   help=f"comma-separated subset of {','.join(ALL_SYSTEMS)}")
    p.add_argument("--curator-python", default=DEFAULT_CURATOR_PYTHON)
    p.add_argument("--results", default=str(BENCH / "results.md"))
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    # internal: the baseline's own process
    p.add_argument("--_baseline-child", dest="baseline_child", action="store_true",
                   help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--slug", help=argparse.SUPPRESS)
    p.add_argument("--targets", help=argparse.SUPPRESS)
    p.add_argument("--qpc", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.baseline_child:
        return baseline_child(args)
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(systems) - set(ALL_SYSTEMS)
    if unknown:
        print(f"unknown systems: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    targets, calls_needed = plan(args.questions, args.chapters, args.questions_per_reply)
    workdir = Path(tempfile.mkdtemp(prefix="efbench-"))
    mock = MockProbe(args.latency_s, args.questions_per_reply)
    qpc, conc = args.questions_per_reply, args.concurrency
    results: list[Result] = []
    try:
        for system in systems:
            mock.server.reset()
            print(f"[bench] running {system} ...", file=sys.stderr, flush=True)
            try:
                if system == "baseline":
                    r = run_baseline(mock, workdir, targets, calls_needed, qpc, conc)
                elif system == "embedded":
                    r = run_embedded(mock, workdir, targets, calls_needed, qpc, conc)
                elif system == "curator":
                    r = run_curator(mock, workdir, targets, calls_needed, qpc, conc,
                                    args.curator_python)
                else:
                    workers = 2 if system.endswith("-2x") else 1
                    database = "postgres" if "-pg" in system else "sqlite"
                    r = run_distributed(system, mock, workdir, targets, calls_needed, qpc,
                                        conc, workers, database)
            except Exception as exc:  # noqa: BLE001 - one failed system must not lose the rest
                r = Result(system, system, sum(targets), calls_needed,
                           error=f"{type(exc).__name__}: {exc}")
            print(f"[bench] {system}: " + json.dumps(r.to_dict(), default=str), file=sys.stderr,
                  flush=True)
            results.append(r)
    finally:
        mock.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"[bench] scratch kept in {workdir}", file=sys.stderr)
    shown_argv = ["python", "bench/throughput.py", *argv]
    report = render(results, args, shown_argv, started, time.monotonic() - t_start)
    print(report)
    Path(args.results).write_text(report)
    (Path(args.results).with_suffix(".json")).write_text(
        json.dumps([r.to_dict() for r in results], indent=1, default=str))
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
