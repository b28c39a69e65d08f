"""High availability settings (issue 34). Redis through Sentinel: the settings, what Celery
and redis-py are given, and the one line every command prints when no master can be had (no
server: the Sentinels named here refuse connections; the failover itself is
tests/e2e/test_failover_redis.py). PostgreSQL: libpq's multi-host DATABASE_URL, as SQLAlchemy
and psycopg read it (the failover: tests/e2e/test_failover_postgres.py)."""

from __future__ import annotations

import socket
import time

import pytest
from celery import Celery
from pydantic import ValidationError

from examforge.errors import BrokerUnavailable, ConfigError
from examforge.settings import Settings


@pytest.fixture
def clean_env(monkeypatch):
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sentinel(**extra: object) -> Settings:
    return Settings(_env_file=None, broker_url="sentinel://127.0.0.1:26391;"
                    "sentinel://:secret@10.0.0.2:26392/3", broker_sentinel_master="ef",
                    **extra)


def test_a_sentinel_url_without_the_masters_name_is_refused_in_one_line(
        clean_env, monkeypatch, tmp_path):
    from examforge.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_URL", "sentinel://127.0.0.1:26391")
    load_settings.cache_clear()
    try:
        with pytest.raises(ConfigError) as info:
            load_settings()
    finally:
        load_settings.cache_clear()
    assert str(info.value) == (
        "environment/.env: BROKER_SENTINEL_MASTER: required with a sentinel:// BROKER_URL: "
        "the name the Sentinels monitor (sentinel monitor NAME ...)")


def test_the_masters_name_with_a_plain_redis_url_is_refused(clean_env):
    with pytest.raises(ValidationError, match="BROKER_URL is not sentinel://"):
        Settings(_env_file=None, broker_url="redis://h:6379/0", broker_sentinel_master="ef")
    # compose passes ${BROKER_SENTINEL_MASTER:-}: empty is unset.
    assert Settings(_env_file=None, broker_url="redis://h:6379/0",
                    broker_sentinel_master="").broker_sentinel_master is None


def test_celery_gets_the_masters_name_and_the_sentinels_own_password(clean_env):
    from tasks.config import celery_config

    conf = celery_config(_sentinel(broker_sentinel_password="s-pass"))
    transport = conf["broker_transport_options"]
    assert transport["master_name"] == "ef"
    assert transport["sentinel_kwargs"] == {"socket_timeout": 2, "socket_connect_timeout": 2,
                                            "password": "s-pass"}
    assert conf["broker_url"].startswith("sentinel://127.0.0.1:26391;")
    # No password of their own: the Sentinels still get the timeouts, and no password key.
    plain = celery_config(_sentinel())["broker_transport_options"]["sentinel_kwargs"]
    assert plain == {"socket_timeout": 2, "socket_connect_timeout": 2}
    redis_conf = celery_config(Settings(_env_file=None, broker_url="redis://h:6379/0"))
    assert "master_name" not in redis_conf["broker_transport_options"]


def test_the_limiters_client_asks_the_sentinels_for_the_master(clean_env):
    from redis.sentinel import SentinelConnectionPool

    from tasks.broker import broker_redis, is_redis, sentinel_addresses

    settings = _sentinel(broker_sentinel_password="s-pass")
    assert is_redis(settings)
    assert sentinel_addresses(settings.broker_url) == [("127.0.0.1", 26391), ("10.0.0.2", 26392)]
    assert sentinel_addresses("sentinel://h") == [("h", 26379)]
    client = broker_redis(settings)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "ef"
    # The master's password and database come from the URL (its first part, as kombu reads
    # it), the Sentinels' own password from BROKER_SENTINEL_PASSWORD.
    assert pool.connection_kwargs["db"] == 0 and pool.connection_kwargs["password"] is None
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26391, 26392]
    assert all(s.connection_pool.connection_kwargs["password"] == "s-pass" for s in sentinels)
    first = Settings(_env_file=None, broker_url="sentinel://:m-pass@127.0.0.1:26391/2",
                     broker_sentinel_master="ef")
    kwargs = broker_redis(first).connection_pool.connection_kwargs
    assert kwargs["password"] == "m-pass" and kwargs["db"] == 2


def test_no_sentinel_reachable_fails_a_command_within_the_timeout_in_one_line(clean_env):
    from tasks.broker import check_broker
    from tasks.config import celery_config

    ports = [_closed_port(), _closed_port()]
    settings = Settings(_env_file=None, broker_url=f"sentinel://127.0.0.1:{ports[0]};"
                        f"sentinel://:hidden@127.0.0.1:{ports[1]}",
                        broker_sentinel_master="ef", broker_connect_timeout_s=1)
    app = Celery("t")
    app.conf.update(celery_config(settings))
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as info:
        check_broker(app, settings)
    assert time.monotonic() - started < 10
    text = str(info.value)
    assert "\n" not in text and "hidden" not in text, text
    assert f"Sentinel 127.0.0.1:{ports[0]} unreachable" in text
    assert f"Sentinel 127.0.0.1:{ports[1]} unreachable" in text


def test_doctor_names_each_sentinel_and_why_the_broker_failed(clean_env, monkeypatch):
    from producer.doctor import _broker
    from tasks.health import Level

    port = _closed_port()
    settings = Settings(_env_file=None, broker_url=f"sentinel://127.0.0.1:{port}",
                        broker_sentinel_master="ef", broker_connect_timeout_s=1)
    findings = {f.check: f for f in _broker(settings)}
    assert findings[f"broker sentinel 127.0.0.1:{port}"].level is Level.fail
    assert findings["broker sentinels"].level is Level.warn  # one Sentinel only
    assert findings["broker"].level is Level.fail
    assert f"Sentinel 127.0.0.1:{port} unreachable" in findings["broker"].message
    assert "rate limiter" not in findings  # the broker's line says why, once


def test_the_limiters_check_fails_in_one_line_when_no_sentinel_answers(clean_env):
    from tasks.health import Level, limiter_finding

    port = _closed_port()
    settings = Settings(_env_file=None, broker_url=f"sentinel://127.0.0.1:{port}",
                        broker_sentinel_master="ef")
    limiter = limiter_finding(settings)
    assert limiter.level is Level.fail and "\n" not in limiter.message
    assert f"Sentinel 127.0.0.1:{port} unreachable" in limiter.message


def test_a_redacted_sentinel_url_hides_every_password():
    from tasks.broker import _redacted

    shown = _redacted("sentinel://:one@h1:26379/0;sentinel://:two@h2:26379/0")
    assert "one" not in shown and "two" not in shown and "h2:26379" in shown


@pytest.mark.parametrize(("given", "read"), [
    ("postgresql://u@h1:5432,h2:5433/exams?target_session_attrs=read-write",
     "postgresql+psycopg://u@/exams?host=h1:5432&host=h2:5433&target_session_attrs=read-write"),
    ("postgres://u:pw@h1,h2/exams",
     "postgresql+psycopg://u:pw@/exams?host=h1&host=h2"),
    ("postgresql+psycopg://u@h1:5432,h2:5432/exams",
     "postgresql+psycopg://u@/exams?host=h1:5432&host=h2:5432"),
    # SQLAlchemy's own multi-host form, and one host, are left as they are.
    ("postgresql+psycopg://u@/exams?host=h1:5432&host=h2:5432",
     "postgresql+psycopg://u@/exams?host=h1:5432&host=h2:5432"),
    ("postgresql://u@h1:5432/exams", "postgresql+psycopg://u@h1:5432/exams"),
])
def test_libpqs_multi_host_database_url_is_read_as_sqlalchemy_reads_one(given, read):
    from examforge.settings import check_database_url

    assert check_database_url(given) == read


def test_the_multi_host_url_reaches_psycopg_as_a_list_of_hosts():
    from sqlalchemy import create_engine

    from examforge.settings import check_database_url

    engine = create_engine(check_database_url(
        "postgresql://u@h1:5432,h2:5433/exams?target_session_attrs=read-write"))
    _, params = engine.dialect.create_connect_args(engine.url)
    assert params["host"] == "h1,h2" and params["port"] == "5432,5433"
    assert params["target_session_attrs"] == "read-write"
    # The heartbeat's own engine is made from the URL rendered again (storage.leases).
    again = create_engine(engine.url.render_as_string(hide_password=False))
    rendered = again.dialect.create_connect_args(again.url)[1]
    assert {k: v for k, v in rendered.items() if k != "context"} == {
        k: v for k, v in params.items() if k != "context"}  # context: each engine's own


def test_every_command_that_needs_the_broker_fails_in_one_line_when_no_master_can_be_had(
        clean_env, monkeypatch, tmp_path, capsys):
    """The walk through the actions that publish (enqueue, resume, retry, reconcile, and
    enqueue --regenerate): each refuses in one line naming the Sentinel, exit 3, before it
    changes anything. In process, as the commands publish through the Celery app of their
    own settings (tasks.app.app_for), not the one this process configured first."""
    import logging

    from examforge.settings import load_settings
    from helpers import write_syllabus
    from producer.cli import main

    port = _closed_port()
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'examforge.db'}",
           "EXAMS_DIR": str(tmp_path / "exams"), "BROKER_CONNECT_TIMEOUT_S": "1",
           "BROKER_URL": f"sentinel://127.0.0.1:{port}", "BROKER_SENTINEL_MASTER": "ef"}
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    load_settings.cache_clear()
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    path = write_syllabus(tmp_path / "exams", "ex", [("a", 5)])

    def refused(*args: str) -> None:
        capsys.readouterr()
        code = main(list(args))
        err = capsys.readouterr().err
        assert code == 3, (args, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert err.startswith(f"error: broker sentinel://127.0.0.1:{port}/ unreachable: "
                              f"Sentinel 127.0.0.1:{port} unreachable"), (args, err)

    from examforge.syllabus import load_syllabus
    from storage import open_store

    try:
        assert main(["migrate"]) == 0
        refused("enqueue", "ex")
        refused("enqueue", "ex", "--regenerate", "a")
        store = open_store(env["DATABASE_URL"])
        try:
            with pytest.raises(Exception, match="ex"):
                store.status("ex")  # nothing written
            store.sync_exam("ex", load_syllabus(path, max_questions=1000))  # planned before
            before = store.status("ex").as_dict()
            refused("resume", "ex")
            refused("retry", "ex")
            refused("reconcile")
            assert store.status("ex").as_dict() == before  # nothing changed
        finally:
            store.engine.dispose()
    finally:
        load_settings.cache_clear()


@pytest.mark.parametrize(("role", "level"), [(b"master", "ok"), (b"slave", "fail")])
def test_the_limiters_check_asks_its_server_for_its_role(clean_env, monkeypatch, role, level):
    """A BROKER_URL naming a replica: kombu connects and reads, and the limiter's writes (and
    the queue's) would be refused; the check says so before a worker finds out."""
    import tasks.health
    from tasks.health import limiter_finding

    class Client:
        def execute_command(self, *args: str) -> list[object]:
            assert args == ("ROLE",)
            return [role, 0, []]

        def close(self) -> None:
            pass

    monkeypatch.setattr(tasks.health, "broker_redis", lambda settings: Client())
    finding = limiter_finding(Settings(_env_file=None, broker_url="redis://h:6379/0"))
    assert finding.level.value == level, finding
    if level == "fail":
        assert "is a replica (slave)" in finding.message
