"""Measurement helpers every benchmark shares: process CPU and memory from /proc and rusage, the
in-process mock with its first/last-call probe, a cheap probe of the database, and waits.

Nothing here asserts an absolute time: callers turn these readings into ratios against a
baseline run the same way, in the same process, minutes apart."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLK_TCK = os.sysconf("SC_CLK_TCK")


def child_pythonpath(root: Path = ROOT) -> str:
    """The PYTHONPATH of a process the bench starts: the code under test first, then the
    folders this process was given (the test suite puts tests/runtime_only there)."""
    return os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
# Never db 0 (a developer's default) nor db 9 (the test suite's): the bench flushes its db.
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_CURATOR_PYTHON = "/tmp/curator-venv/bin/python"


# ----------------------------------------------------------------------------- processes
def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mb(pid: int) -> tuple[float, float]:
    """(resident set now, its peak so far) of a live process, in MB; zeros if it is gone."""
    values = {"VmRSS": 0.0, "VmHWM": 0.0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in values:
                    values[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return values["VmRSS"], values["VmHWM"]


def machine_cpu_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (from /proc/stat): the
    processes under test and everyone else's (the machine is shared)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


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


def servers_cpu_s(exclude: Iterable[int | None] = ()) -> dict[int, float]:
    """CPU of every redis-server and postgres process right now, but those of `exclude` (the
    bench's own connections' backends)."""
    left_out = set(exclude)
    return {pid: proc_cpu_s(pid) for pid in pids_named("redis-server", "postgres")
            if pid not in left_out}


def servers_delta(before: dict[int, float], after: dict[int, float]) -> float:
    # New backends (PostgreSQL forks one per connection) count from zero; ones that exited in
    # between are missed (none should: the pools keep their connections).
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


@dataclass(frozen=True)
class ChildUsage:
    """What the kernel says of a child process we waited for."""

    code: int
    cpu_s: float
    max_rss_mb: float
    wall_s: float  # from `started` (given by the caller) to the moment it was reaped


def wait_child(proc: subprocess.Popen, timeout_s: float, started: float | None = None
               ) -> ChildUsage:
    """Wait for a child we started; its exit code, user+sys CPU, peak RSS and wall time.

    The peak RSS is the child's VmHWM, polled while it runs: rusage's ru_maxrss would also
    count the copy of this (large) process that the fork made before the exec."""
    started = time.monotonic() if started is None else started
    deadline = time.monotonic() + timeout_s
    peak = 0.0
    while True:
        peak = max(peak, proc_rss_mb(proc.pid)[1])
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return ChildUsage(code, ru.ru_utime + ru.ru_stime, peak,
                              time.monotonic() - started)
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {proc.pid} still running after {timeout_s:.0f} s")
        time.sleep(0.005)


def exit_code(proc: subprocess.Popen) -> int | None:
    """The exit code of a child that has exited, None while it runs. It is not reaped (WNOWAIT),
    so `wait_child` can still read its rusage."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def wait_rusage(proc: subprocess.Popen, timeout_s: float) -> tuple[int, float]:
    """Wait for a child we started; return (exit code, its user+sys CPU seconds)."""
    usage = wait_child(proc, timeout_s)
    return usage.code, usage.cpu_s


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

    def __init__(self, latency_s: float, questions_per_reply: int | None) -> None:
        from mockllm import MockConfig, MockServer

        self.server = MockServer(MockConfig(latency_s=latency_s,
                                            questions_per_reply=questions_per_reply))
        self.url = self.server.start()
        state = self.server._service.state
        self._begin, self._end = state.begin_call, state.end_call
        self.prefix = ""
        self.watch: list[int] = []
        self.first_call_t: float | None = None
        self.last_end_t: float | None = None
        self.cpu_at_first: dict[int, float] = {}
        self.servers_at_first: dict[int, float] = {}
        self.self_cpu_at_first: float | None = None  # this process (the mock, the probes)
        self.machine_at_first: float | None = None  # every core of the machine

        def begin(key: str, *rest: Any) -> None:
            if self.first_call_t is None and key.startswith(self.prefix):
                self.first_call_t = time.monotonic()
                self.cpu_at_first = {pid: proc_cpu_s(pid) for pid in self.watch}
                self.servers_at_first = servers_cpu_s()
                self.self_cpu_at_first = time.process_time()
                self.machine_at_first = machine_cpu_s()
            self._begin(key, *rest)

        def end(key: str) -> None:
            self._end(key)
            if key.startswith(self.prefix):
                self.last_end_t = time.monotonic()

        # Wraps the mock's own hooks to see the first and last call of this system.
        state.begin_call, state.end_call = begin, end  # type: ignore[method-assign,assignment]

    @property
    def latency_s(self) -> float:
        return float(self.server.config.latency_s)

    def set_latency(self, latency_s: float) -> None:
        self.server.configure(latency_s=latency_s)

    def arm(self, slug: str, watch: list[int] | None = None) -> None:
        """Reset the mock's counters and watch the calls of exam `slug` (and these pids' CPU)."""
        self.server.reset()
        self.prefix = f"{slug}/"
        self.watch = list(watch or [])
        self.first_call_t = None
        self.last_end_t = None
        self.cpu_at_first = {}
        self.servers_at_first = {}
        self.self_cpu_at_first = None
        self.machine_at_first = None

    def bench_cpu_since_first(self) -> float | None:
        """CPU of this process (the mock's event loop, the database probe) since the first call."""
        if self.self_cpu_at_first is None:
            return None
        return time.process_time() - self.self_cpu_at_first

    def machine_cpu_since_first(self) -> float | None:
        """Busy CPU seconds of the whole machine since the first call."""
        if self.machine_at_first is None:
            return None
        return machine_cpu_s() - self.machine_at_first

    def calls_for(self, slug: str) -> tuple[int, int]:
        """(chat calls for this exam's chapters, calls with no chapter, e.g. probes)."""
        stats = self.server.stats()
        mine = sum(n for k, n in stats["calls_by_chapter"].items() if k.startswith(f"{slug}/"))
        return mine, stats["calls_by_chapter"].get("unknown", 0)

    def max_inflight(self) -> int:
        return int(self.server.stats()["max_inflight"])

    def stop(self) -> None:
        self.server.stop()


# ----------------------------------------------------------------------------- results
@dataclass
class Result:
    """One system doing one workload once."""

    system: str
    description: str
    questions_target: int
    calls_needed: int
    chapters: int = 0
    slots: int = 0
    latency_s: float = 0.0
    questions_stored: int = 0
    calls_paid: int = 0
    calls_other: int = 0
    max_inflight: int = 0
    window_s: float | None = None  # first paid call -> all questions stored
    e2e_s: float | None = None  # command launched -> all stored (CLI start-up included)
    cpu_window_s: float | None = None  # CPU of the system's processes over the window
    cpu_e2e_s: float | None = None  # ... from launch, start-up and imports included
    server_cpu_s: float | None = None  # redis-server + postgres processes over the window
    bench_cpu_s: float | None = None  # the bench process (the mock, the probes) over the window
    machine_cpu_s: float | None = None  # every busy core of the machine over the window
    rss_mb: float | None = None  # the system's processes' resident memory after the run
    peak_rss_mb: float | None = None  # ... their peak (VmHWM)
    command: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def qps(self, which: str = "window") -> float | None:
        t = self.window_s if which == "window" else self.e2e_s
        return self.questions_stored / t if t else None

    def calls_per_s(self) -> float | None:
        return self.calls_paid / self.window_s if self.window_s else None

    def fraction_of_ideal(self) -> float | None:
        """Calls per second over the window, as a share of slots / latency."""
        rate = self.calls_per_s()
        if rate is None or not self.slots or not self.latency_s:
            return None
        return rate / (self.slots / self.latency_s)

    def cpu_ms_per_call(self) -> float | None:
        if not self.calls_paid or self.cpu_window_s is None:
            return None
        return self.cpu_window_s * 1000 / self.calls_paid

    def cores_busy(self) -> float | None:
        """Average cores in use over the window: the system, Redis, PostgreSQL and the mock."""
        if not self.window_s or self.cpu_window_s is None:
            return None
        total = self.cpu_window_s + (self.server_cpu_s or 0) + (self.bench_cpu_s or 0)
        return total / self.window_s

    def machine_cores_busy(self) -> float | None:
        """Average busy cores of the whole machine over the window (2 is all of them here):
        what `cores_busy` leaves out is other people's work on the shared machine."""
        if not self.window_s or self.machine_cpu_s is None:
            return None
        return self.machine_cpu_s / self.window_s

    def cpu_ms_per_chapter(self) -> float | None:
        if not self.chapters or self.cpu_window_s is None:
            return None
        return self.cpu_window_s * 1000 / self.chapters

    @property
    def exact(self) -> bool:
        """Every question stored and exactly the calls needed paid for."""
        return (self.error is None and self.calls_paid == self.calls_needed
                and self.questions_stored == self.questions_target)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["qps_window"], d["qps_e2e"] = self.qps("window"), self.qps("e2e")
        d["calls_per_s"] = self.calls_per_s()
        d["fraction_of_ideal"] = self.fraction_of_ideal()
        d["cpu_ms_per_call"] = self.cpu_ms_per_call()
        d["cpu_ms_per_chapter"] = self.cpu_ms_per_chapter()
        d["cores_busy"] = self.cores_busy()
        d["machine_cores_busy"] = self.machine_cores_busy()
        d["exact"] = self.exact
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
                "chapters": [{"id": f"ch-{i:05d}", "title": f"Topic number {i}", "questions": t}
                             for i, t in enumerate(targets)]}
    (folder / "syllabus.json").write_text(json.dumps(syllabus, indent=1))


def chapter_id(index: int) -> str:
    """The id `write_syllabus` gives chapter `index` (every system uses the same ids)."""
    return f"ch-{index:05d}"


def record_child_report(res: Result, stdout: bytes, launched: float, mock: MockProbe
                        ) -> dict[str, Any]:
    """Read the JSON line a timed child process (baseline, curator) prints last, and fill in
    the result's timings and CPU from it."""
    report: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    # monotonic clocks are system-wide on Linux, so the child's timestamp is comparable.
    done = report["done_monotonic"]
    res.e2e_s = done - launched
    res.window_s = done - mock.first_call_t if mock.first_call_t else None
    res.cpu_window_s = report["work_cpu_s"]
    res.machine_cpu_s = mock.machine_cpu_since_first()  # read just after the child exited
    res.cpu_e2e_s = report["total_cpu_s"]
    if report.get("max_rss_mb"):
        res.peak_rss_mb = report["max_rss_mb"]
    return report


# ----------------------------------------------------------------------------- the database
class DbProbe:
    """Counts done chapters and stored questions straight from the database (cheap queries).

    `done_sql` and `questions_sql` default to examforge's tables; the minimal Celery task
    passes its own."""

    # A chapter is finished when every one of its slices is.
    DONE = ("SELECT count(*) FROM (SELECT chapter_id FROM slice WHERE exam = %s "
            "GROUP BY chapter_id HAVING sum(CASE WHEN state IN ('done', 'failed') THEN 0 "
            "ELSE 1 END) = 0) finished")
    # The slices still at work, counted in the partial index of the active slices: it costs
    # what is active, where DONE reads every slice of the exam (polled every 20 ms, DONE alone
    # took PostgreSQL about 0.8 ms of CPU a paid call at 32 slots, on the machine the system
    # under test runs on). DONE confirms the end.
    BUSY = "SELECT count(*) FROM slice WHERE exam = %s AND state IN ('pending', 'running')"
    FAILED = "SELECT count(DISTINCT chapter_id) FROM slice WHERE exam = %s AND state = 'failed'"
    QUESTIONS = ("SELECT count(DISTINCT chapter_id || '/' || number) FROM question "
                 "WHERE exam = %s")

    def __init__(self, db_url: str, *, done_sql: str | None = None,
                 questions_sql: str | None = None, failed_sql: str | None = None) -> None:
        self.url = db_url
        # A system's own done_sql has no BUSY (the minimal task's is cheap already).
        self.busy_sql = None if done_sql else self.BUSY
        self.done_sql = done_sql or self.DONE
        self.questions_sql = questions_sql or self.QUESTIONS
        self.failed_sql = failed_sql or self.FAILED
        if db_url.startswith("sqlite:///"):
            self._sqlite: str | None = db_url[len("sqlite:///"):]
            self._conn: Any = None
        else:
            self._sqlite = None
            import psycopg

            self._conn = psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True)
        # The PostgreSQL backend serving this probe's polls (every 20 ms, a GROUP BY over the
        # exam's slices): its CPU is the bench's, not the system's under test, and is left out
        # of the servers' CPU (`servers_cpu_s`).
        self.backend_pid: int | None = (
            None if self._conn is None
            else int(self._conn.execute("SELECT pg_backend_pid()").fetchone()[0]))

    def _query(self, sql: str, slug: str) -> int:
        if self._sqlite is not None:
            if not os.path.exists(self._sqlite):
                return 0
            conn = sqlite3.connect(f"file:{self._sqlite}?mode=ro", uri=True, timeout=5)
            try:
                return int(conn.execute(sql.replace("%s", "?"), (slug,)).fetchone()[0])
            except sqlite3.OperationalError:  # schema not created yet
                return 0
            finally:
                conn.close()
        try:
            return int(self._conn.execute(sql, (slug,)).fetchone()[0])
        except Exception:  # noqa: BLE001 - schema not created yet
            return 0

    def chapters_finished(self, slug: str) -> int:
        """Done or failed: nothing more will happen to them."""
        return self._query(self.done_sql, slug)

    def slices_busy(self, slug: str) -> int | None:
        """Slices still pending or running (None: not known cheaply). Zero also before the
        exam's slices exist: only `chapters_finished` says it is done."""
        return None if self.busy_sql is None else self._query(self.busy_sql, slug)

    def chapters_failed(self, slug: str) -> int:
        return self._query(self.failed_sql, slug)

    def questions(self, slug: str) -> int:
        return self._query(self.questions_sql, slug)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class Stalled(TimeoutError):
    """No progress for a long while: the workers are stuck, not slow."""


def wait_done(db: DbProbe, slug: str, chapters: int, timeout_s: float,
              procs: list[subprocess.Popen], poll_s: float = 0.02,
              stall_s: float = 120) -> float:
    """Poll until every chapter is finished; return the monotonic time it was seen. Progress
    is fewer slices at work (`DbProbe.slices_busy`), or, where that is not known or none is at
    work, more chapters finished; none for `stall_s` raises Stalled at once (rather than at
    the deadline), with a py-spy dump of every process, so a hang says where it hangs."""
    deadline = time.monotonic() + timeout_s
    seen: tuple[str, int] | None = None
    moved = time.monotonic()
    while time.monotonic() < deadline:
        busy = db.slices_busy(slug)
        if busy:  # progress: fewer slices at work
            now = ("slices at work", busy)
        else:
            finished = db.chapters_finished(slug)
            if finished >= chapters:
                return time.monotonic()
            now = (f"of {chapters} chapters finished", finished)
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise Stalled(f"{slug}: {now[1]} {now[0]}, unchanged for {stall_s:.0f} s\n"
                          + dump_stacks(procs))
        for p in procs:
            code = exit_code(p)
            if code is not None and code != 0:
                raise RuntimeError(f"pid {p.pid} exited with {code}")
        time.sleep(poll_s)
    raise TimeoutError(f"{slug}: not done after {timeout_s:.0f} s\n" + dump_stacks(procs))


def dump_stacks(procs: list[subprocess.Popen]) -> str:
    """`py-spy dump` of each process still running (the threads' stacks), for a report."""
    py_spy = Path(sys.executable).with_name("py-spy")
    out = []
    for p in procs:
        if p.poll() is not None:
            continue
        if not py_spy.exists():
            out.append(f"pid {p.pid}: py-spy not installed, no stacks")
            continue
        try:
            dump = subprocess.run([str(py_spy), "dump", "--pid", str(p.pid)], text=True,
                                  capture_output=True, timeout=30)
            args = p.args if isinstance(p.args, (list, tuple)) else [p.args]
            out.append(f"pid {p.pid} ({' '.join(str(a) for a in args)[:120]}):\n"
                       + (dump.stdout or dump.stderr))
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"pid {p.pid}: py-spy failed: {exc}")
    return "\n".join(out)


# ----------------------------------------------------------------------------- the broker
def flush_redis(url: str | None = None) -> None:
    import redis

    client = redis.Redis.from_url(url or REDIS_URL)
    client.flushdb()
    client.close()


def wait_workers_ready(procs: list[subprocess.Popen], timeout_s: float = 90,
                       url: str | None = None, epoch_key: str | None = "examforge:broker-epoch"
                       ) -> None:
    """Ready = each worker blocks in BRPOP on our Redis database (the consumer loop runs) and,
    for examforge, the start-up reconcile has run (it creates the broker epoch key after our
    FLUSHDB).

    The default log level (WARNING) prints no 'ready.' line, so the broker is watched instead."""
    import redis

    url = url or REDIS_URL
    client = redis.Redis.from_url(url)
    db = int(url.rsplit("/", 1)[1])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker pid {p.pid} exited with {p.returncode}")
            blocked = [c for c in client.client_list()
                       if int(c.get("db", -1)) == db and c.get("cmd") in ("brpop", "blpop")]
            if len(blocked) >= len(procs) and (epoch_key is None or client.exists(epoch_key)):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise TimeoutError("workers not ready")
