"""A command publishes to the broker and queue of the settings it runs with, not to those
`tasks.app` was configured from when this process first imported it (tasks.app.app_for):
an embedding program, the HTTP API or a test that loads settings after that import must not
leave its chapters' messages on another queue, where no worker of its own reads them."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import pytest
import redis

from examforge.settings import Settings, load_settings
from helpers import write_syllabus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_cli_first_run import cli  # noqa: E402  (the CLI in this process)


def _tasks_app():
    """The module (the package's `tasks.app` is the Celery app it re-exports)."""
    return importlib.import_module("tasks.app")


@pytest.fixture
def env(monkeypatch, tmp_path, redis_url):
    _tasks_app()  # configured now, if this process had not yet, under the settings before
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)
    values = {"DATABASE_URL": f"sqlite:///{tmp_path / 'examforge.db'}",
              "EXAMS_DIR": str(tmp_path / "exams"), "BROKER_URL": redis_url,
              "TASK_QUEUE": f"ef-own-{time.monotonic_ns()}"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    load_settings.cache_clear()
    yield values
    load_settings.cache_clear()


def test_enqueue_publishes_to_its_own_settings_queue(env, capsys):
    # This process configured its app at its first import, under other settings.
    first = _tasks_app().app.conf
    assert first.task_default_queue != env["TASK_QUEUE"]
    client = redis.Redis.from_url(env["BROKER_URL"])
    # Where the first import's app publishes: its own broker and queue.
    first_broker = redis.Redis.from_url(first.broker_url)
    elsewhere = first.task_default_queue
    before = first_broker.llen(elsewhere)

    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 10), ("b", 10)])
    code, out, err = cli(capsys, "enqueue", "ex")
    assert code == 0, out + err
    assert client.llen(env["TASK_QUEUE"]) == 2
    assert first_broker.llen(elsewhere) == before

    assert cli(capsys, "cancel", "ex")[0] == 0
    code, out, err = cli(capsys, "enqueue", "ex")  # cancelled chapters restarted
    assert code == 0, out + err
    assert client.llen(env["TASK_QUEUE"]) == 4
    assert first_broker.llen(elsewhere) == before


def test_the_same_settings_publish_through_the_workers_own_app(env):
    """A process's usual case: its settings are those of the import, and it publishes through
    `tasks.app.app` itself (the app the bench's tuned configuration changes). Other settings
    get an app of their own, the same one again for the same configuration, a few kept."""
    from tasks.app import app_for
    from tasks.config import celery_config

    module = _tasks_app()
    assert app_for(module._settings_at_start) is module.app
    settings = load_settings()
    own = app_for(settings)
    assert own is not module.app and app_for(settings) is own
    assert own.conf.task_default_queue == env["TASK_QUEUE"]
    assert own.conf.broker_url == celery_config(settings)["broker_url"]
    others = [app_for(settings.model_copy(update={"task_queue": f"q{i}"})) for i in range(6)]
    assert len({id(a) for a in others}) == 6
    assert len(module._publishers) == module._PUBLISHERS_KEPT
    assert app_for(settings) is not own  # pushed out (and closed) by the six since
