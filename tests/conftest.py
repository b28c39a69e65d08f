"""Shared fixtures. Three tiers: tests/unit (SQLite, fakeredis, httpx.MockTransport),
tests/integration (the machine's real Redis and PostgreSQL), tests/e2e (the real CLI and
worker processes against the mock server, killed with real signals).

Real services are required in CI (CI=true): a missing one fails the run. Locally a missing
service skips its tests with the reason."""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# The suite writes bytecode caches even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1, as on the machines CI runs on): it starts some 600 Python
# processes, each of which would compile our sources again, and each pytest-xdist worker
# would rewrite every test module's assertions again (collecting the suite took 9.5 s of CPU
# a process without the caches, 3.6 s with them). Set here, before any test module is
# imported, and dropped from the environment that xdist's workers and every process the
# tests start inherit. The caches go to the git-ignored __pycache__ folders, as a deployment
# has them.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# The processes the tests start import what a deployment has (tests/runtime_only/trio.py).
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "tests" / "runtime_only"), os.environ.get("PYTHONPATH")) if p)

pytest_plugins = ["speed_guard"]

PG_ADMIN_URL = os.environ.get("EXAMFORGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _redis_test_db() -> int:
    """Database 9 of the machine's Redis; under pytest-xdist each worker process has its own
    (gw0 is 1, gw1 is 2, ...: Redis has 16), since the `redis_url` fixture empties it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return 1 + int(worker[2:]) % 15 if worker.startswith("gw") else 9


REDIS_TEST_URL = os.environ.get("EXAMFORGE_TEST_REDIS",
                                f"redis://127.0.0.1:6379/{_redis_test_db()}")


def _service_missing(what: str, reason: str) -> None:
    message = f"{what} is not reachable ({reason})"
    if os.environ.get("CI"):
        pytest.fail(message + ": integration tests must run in CI", pytrace=False)
    pytest.skip(message)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _one_default_ssl_context() -> None:
    """Every httpx client this process makes with the default verification shares one SSL
    context (one for each value of SSL_CERT_FILE and SSL_CERT_DIR, which httpx reads). httpx
    makes a new one for each client and transport (a CA bundle parsed again: 21 ms of CPU), and
    the tests make some 770 of them in a fast tier (each Runtime's and BatchRuntime's LLMClient
    and BatchAPI, each `httpx.get` to the mock): 16 s of CPU, for clients that only ever speak
    plain HTTP to 127.0.0.1 or go through a MockTransport. A client given its own `verify` (a
    context, a path, False) or `cert` gets httpx's own, as before. Only in this process: the
    processes the tests start make their own."""
    import threading

    from httpx._transports import default

    original = default.create_ssl_context
    shared: dict[tuple[str | None, str | None], Any] = {}
    lock = threading.Lock()

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return original(verify=verify, cert=cert, trust_env=trust_env)
        key = ((os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env
               else (None, None))
        with lock:
            if key not in shared:
                shared[key] = original(verify=True, cert=None, trust_env=trust_env)
            return shared[key]

    default.create_ssl_context = create_ssl_context  # type: ignore[assignment]


class _OneCompiledCache:
    """One cache of compiled statements for every engine of this process, in place of
    SQLAlchemy's own cache of each engine (`Engine._compiled_cache`, an LRU keyed by the
    engine's dialect object and the statement's cache key). The tests make a new engine for
    nearly every test (some 2,000 a fast tier), each of which compiled the same statements
    again: about a tenth of the CPU the tests spend (py-spy, 2026-12-05). Here a statement
    compiled by one engine is used by another whose dialect is the same in everything it
    holds that can change its SQL: its class, and every plain value on it (the server's
    version, paramstyle, the flags its first connection set). A dialect is given its
    signature once it has connected (server_version_info set); before that it shares
    nothing. A deployment has one or two engines a process: it compiles each statement
    once either way, so this is the tests' own."""

    def __init__(self, capacity: int) -> None:
        import weakref

        from sqlalchemy.util import LRUCache

        self.lru: Any = LRUCache(capacity)
        self.signatures: Any = weakref.WeakKeyDictionary()

    def _signature(self, dialect: Any) -> Any:
        signature = self.signatures.get(dialect)
        if signature is None:
            values = tuple(sorted(
                (k, v) for k, v in vars(dialect).items()
                if isinstance(v, (bool, int, float, str, tuple, type(None)))))
            signature = (type(dialect), values)
            if dialect.server_version_info is None:  # not connected yet: its own
                return (dialect, signature)
            self.signatures[dialect] = signature
        return signature

    def _key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self._signature(key[0]),) + key[1:]

    def get(self, key: tuple[Any, ...], default: Any = None) -> Any:
        return self.lru.get(self._key(key), default)

    def __setitem__(self, key: tuple[Any, ...], value: Any) -> None:
        self.lru[self._key(key)] = value

    def __len__(self) -> int:
        return len(self.lru)

    def clear(self) -> None:
        self.lru.clear()


@pytest.fixture(scope="session", autouse=True)
def _one_compiled_cache() -> Iterator[None]:
    """Every engine made in this process (in a test) shares one cache of compiled statements
    (_OneCompiledCache). In a fixture, not at start-up: pytest-xdist's controlling process
    runs no test and need not import SQLAlchemy."""
    from sqlalchemy.engine import Engine

    shared = _OneCompiledCache(5000)
    original = Engine.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self._compiled_cache is not None:  # query_cache_size=0 still means none
            self._compiled_cache = shared

    Engine.__init__ = __init__  # type: ignore[method-assign]
    yield
    Engine.__init__ = original  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    import schema_template

    schema_template.install()
    _one_default_ssl_context()


# The mark expressions that leave out every test of tests/e2e (all of them are marked e2e and
# slow, in pytest_collection_modifyitems): the developer's loop and the fast tier.
_NO_E2E = {"not slow", "not e2e"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m "not slow"` (or "not e2e") tests/e2e is not collected at all: every one of its
    tests would be deselected, after each pytest-xdist worker had imported its 60 modules
    (schemathesis, selenium's helpers, the harness: 0.7 s of CPU a worker). The same tests
    run; only the count of deselected ones shrinks."""
    if collection_path.name != "e2e" or collection_path.resolve() != ROOT / "tests" / "e2e":
        return None
    expression = " ".join((config.getoption("-m") or "").split())
    return True if expression in _NO_E2E else None


def _large_selected(config: pytest.Config) -> bool:
    # EXAMFORGE_SLOW is the variable's old name, from when `slow` meant what `large` means.
    return bool(os.environ.get("EXAMFORGE_LARGE") or os.environ.get("EXAMFORGE_SLOW")
                or "large" in (config.getoption("-m") or ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers a run can choose with -m (pyproject.toml registers the marks):

    - `slow`: a test that starts processes (the CLI, workers, mypy, a browser, py-spy, a chaos
      run) or takes more than about 5 s. It runs by default, so CI runs it; `-m "not slow"`
      leaves it out, the developer's loop of a few minutes. Every test of tests/e2e is one.
    - `e2e`: every test of tests/e2e, marked here whether its file says so or not.
    - `large`: the large version of a test that runs by default (a 20,000-chapter exam, a
      hold past a minute): skipped unless asked for, with `-m large` or EXAMFORGE_LARGE=1,
      so neither CI nor a developer's loop waits on it."""
    from helpers import resolved_parents

    e2e = ROOT / "tests" / "e2e"
    for item in items:
        if e2e in resolved_parents(item):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)
    if _large_selected(config):
        return
    skip = pytest.mark.skip(reason="large version: run with -m large or EXAMFORGE_LARGE=1")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command run in process (`producer.cli.main`) sets the root logger up with a handler on
    the sys.stderr of that moment, which is pytest's capture of that one test. Left in place, a
    later test's log line is written into a closed file ("--- Logging error ---")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'examforge.db'}"


class _PgDatabases:
    """PostgreSQL databases for the tests, each made one test ahead and dropped behind, in a
    thread of this process's own: CREATE DATABASE and DROP DATABASE take 0.1 to 0.5 s each
    (PostgreSQL writes the new database out and checkpoints), which a test would otherwise
    wait for, some 500 times a run. One thread, so one of each at a time.

    Two kinds: empty (`pg_url`'s promise), and migrated, for a test whose fixture migrates
    its database to head before anything else touches it (`helpers.migrates_at_once`): a copy of
    the run's migrated template (schema_template.pg_template) with its own database id, as
    the replay of the schema gives it. The copy costs the server about what an empty
    database does (both copy a template: WAL_LOG, PostgreSQL 15's default, measured cheaper
    here than FILE_COPY, which checkpoints twice), and saves the replay: measured 2026-12-05,
    per test, the replay's 27-29 ms of the test's server process and 3-5 ms of the test's
    own CPU, for the 128 PostgreSQL tests of the fast tier whose fixture migrates first."""

    def __init__(self, admin: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.admin = admin
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="pg-databases")
        self.ahead: dict[bool, Any] = {}  # migrated? -> the one made ahead of that kind
        self.conn: Any = None  # the thread's, kept: not a connection (a server process) each
        self.template: Any = ...  # the thread's: the run's template's name, or None

    def _run(self, sql: str) -> None:
        """In the thread, on its connection to the server's `postgres` database, opened at
        its first statement and again after one failed."""
        import psycopg

        if self.conn is None:
            self.conn = psycopg.connect(self.admin, autocommit=True)
        try:
            self.conn.execute(sql)
        except psycopg.Error:
            self._disconnect()
            raise

    def _disconnect(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _create(self, migrated: bool) -> str:
        name = f"ef_test_{uuid.uuid4().hex[:12]}"
        if migrated and self.template is ...:
            import schema_template

            self.template = schema_template.pg_template(self.admin)
        if not migrated or self.template is None:
            self._run(f'CREATE DATABASE "{name}"')
            return name
        import time

        import psycopg

        self._run(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        # What migration 0015 writes once per database (and the replay after it): its own
        # random id, not the template's.
        with psycopg.connect(f"{self.admin.rsplit('/', 1)[0]}/{name}", autocommit=True) as conn:
            conn.execute("UPDATE database_identity SET database_id = %s, created_at = %s",
                         (uuid.uuid4().hex, time.time()))
        return name

    def take(self, migrated: bool = False) -> str:
        made = self.ahead.pop(migrated, None) or self.thread.submit(self._create, migrated)
        self.ahead[migrated] = self.thread.submit(self._create, migrated)
        return str(made.result())

    def drop(self, name: str) -> None:
        self.thread.submit(self._run, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Drop the ones made ahead, and wait for every drop."""
        for ahead in self.ahead.values():
            try:
                self.drop(ahead.result())
            except Exception:  # noqa: BLE001 (PostgreSQL went away: nothing was made)
                pass
        self.thread.submit(self._disconnect)
        self.thread.shutdown(wait=True)


def _migrated_at_once(request: pytest.FixtureRequest) -> bool:
    """Whether a fixture of this test marked `helpers.migrates_at_once` takes this test's PostgreSQL
    database: as `pg_url`, or as `db_url` when the test runs on PostgreSQL."""
    info = getattr(request.node, "_fixtureinfo", None)
    if info is None:
        return False
    callspec = getattr(request.node, "callspec", None)
    on_postgres = callspec is not None and callspec.params.get("db_url") == "postgres"
    for name in request.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if defs and getattr(defs[-1].func, "migrates_at_once", False) and (
                "pg_url" in defs[-1].argnames or (on_postgres and "db_url" in defs[-1].argnames)):
            return True
    return False


@pytest.fixture(scope="session")
def _pg_databases() -> Iterator[_PgDatabases]:
    databases = _PgDatabases(PG_ADMIN_URL)
    yield databases
    databases.close()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, _pg_databases: _PgDatabases) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards (already at head
    for a `migrates_at_once` fixture, which would migrate it first thing)."""
    if not _port_open("127.0.0.1", 5432):
        _service_missing("PostgreSQL at 127.0.0.1:5432", "connection refused")
    name = _pg_databases.take(migrated=_migrated_at_once(request))
    yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    _pg_databases.drop(name)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Both databases, for tests whose behaviour must be the same on each."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'examforge.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def redis_url() -> str:
    """The machine's real Redis, this process's database (REDIS_TEST_URL), emptied for the
    test."""
    import redis

    client = redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        _service_missing("Redis at 127.0.0.1:6379", str(exc))
    client.flushdb()
    return REDIS_TEST_URL


@pytest.fixture
def mock_llm() -> Iterator[Any]:
    """The project's mock model server, in this process, on a free port."""
    from mockllm import MockConfig, MockServer

    server = MockServer(MockConfig(latency_s=0.01))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Any]:
    """Settings built directly (no environment), with fast timings for tests."""
    from examforge.settings import Settings

    def make(**overrides: Any) -> Any:
        base: dict[str, Any] = {
            "database_url": f"sqlite:///{tmp_path / 'examforge.db'}",
            "broker_url": REDIS_TEST_URL,
            "exams_dir": tmp_path / "exams",
            "llm_base_url": "http://mock.invalid/v1",
            "llm_api_key": "sk-test",
            "questions_per_call": 5,
            "lease_s": 8.0,
            "retry_base_s": 0.05,
            "retry_max_s": 0.5,
            "llm_timeout_s": 5.0,
        }
        base.update(overrides)
        return Settings(_env_file=None, **base)

    return make
