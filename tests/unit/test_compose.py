"""docker-compose.yml cannot run here (no Docker engine): read it against what the tests run."""

from __future__ import annotations

from pathlib import Path

import yaml

from examforge.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_services_the_readme_names():
    services = _compose()["services"]
    assert {"redis", "postgres", "worker", "beat", "flower", "mock", "api"} <= set(services)


def test_worker_is_scalable_and_runs_the_tested_command():
    worker = _compose()["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert worker["command"][:6] == ["celery", "-A", "tasks", "worker", "-P", "threads"]


def test_redis_is_private_with_a_password_and_persistence():
    redis = _compose()["services"]["redis"]
    assert "ports" not in redis
    command = redis["command"]
    assert "--requirepass" in command
    # What `producer doctor` requires: an append-only file, and no eviction of the queue.
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "@redis:6379" in _compose()["services"]["worker"]["environment"]["BROKER_URL"]
    # Redis with its password unless .env names another broker (the Sentinels, `ha`).
    assert _compose()["services"]["worker"]["environment"]["BROKER_URL"].startswith(
        "${BROKER_URL:-redis://:")


def test_flower_requires_basic_auth_and_binds_to_loopback():
    flower = _compose()["services"]["flower"]
    assert any(part.startswith("--basic-auth=") for part in flower["command"])
    assert all(p.startswith("127.0.0.1:") for p in flower["ports"])


def test_mock_runs_the_cli_subcommand():
    mock = _compose()["services"]["mock"]
    assert mock["command"][:4] == ["python", "-m", "producer", "mock-llm"]


def test_app_environment_names_are_real_settings():
    known = {name.upper() for name in Settings.model_fields}
    for name in ("worker", "beat", "flower", "producer", "api"):
        env = _compose()["services"][name]["environment"]
        assert set(env) <= known, set(env) - known


def test_beat_runs_with_a_worker_on_the_control_queue_only():
    from examforge.settings import Settings

    beat = _compose()["services"]["beat"]["command"]
    assert beat[:4] == ["celery", "-A", "tasks", "worker"] and "--beat" in beat
    assert beat[beat.index("-Q") + 1] == Settings(_env_file=None).control_queue


def test_app_environment_with_only_its_defaults_is_valid_settings(monkeypatch):
    # What compose hands the app when .env sets nothing optional: ${VAR:-default} becomes the
    # default (an empty one included), ${VAR:?message} a placeholder.
    import re

    env = _compose()["services"]["worker"]["environment"]
    for name, value in env.items():
        # The inner ones first: BROKER_URL's default holds REDIS_PASSWORD's.
        value = re.sub(r"\$\{\w+:\?[^}]*\}", "placeholder", str(value))
        value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.llm_fallback_base_url is None and settings.llm_base_url == "http://mock:8089/v1"
    assert settings.broker_url == "redis://:placeholder@redis:6379/0"
    assert settings.broker_sentinel_master is None


def test_the_ha_profile_adds_a_replica_and_a_sentinel_the_app_can_use(monkeypatch):
    """Issue 34: `COMPOSE_PROFILES=ha` starts a replica of `redis` and a Sentinel watching it;
    the settings docs/how-to/high-availability.md puts in .env make a valid configuration of
    the app's environment, naming the master the Sentinel monitors."""
    import re

    services = _compose()["services"]
    replica, sentinel = services["redis-replica"], services["sentinel"]
    assert replica["profiles"] == ["ha"] and sentinel["profiles"] == ["ha"]
    assert "ports" not in replica and "ports" not in sentinel  # private, as `redis`
    command = replica["command"]
    assert command[command.index("--replicaof") + 1:command.index("--replicaof") + 3] == [
        "redis", "6379"]
    # Promoted, the replica is the broker: the settings doctor requires of `redis`.
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "--masterauth" in command and "--requirepass" in command
    # The Sentinel's configuration, as its start writes it.
    lines = re.findall(r"['\"]([^'\"]+)['\"] \\", sentinel["command"][0])
    monitor = next(line.split() for line in lines if line.startswith("sentinel monitor "))
    assert monitor[2:] == ["examforge", "redis", "6379", "1"]
    assert "sentinel auth-pass examforge $$REDIS_PASSWORD" in lines
    assert "requirepass $$REDIS_PASSWORD" in lines
    assert lines.index("sentinel resolve-hostnames yes") < lines.index(" ".join(monitor))
    # The app's environment with the .env of the docs' page.
    env = services["worker"]["environment"]
    assert {"BROKER_SENTINEL_MASTER", "BROKER_SENTINEL_PASSWORD"} <= set(env)
    dotenv = {"BROKER_URL": "sentinel://:pw@sentinel:26379/0",
              "BROKER_SENTINEL_MASTER": monitor[2], "BROKER_SENTINEL_PASSWORD": "pw"}
    for name, value in env.items():
        value = re.sub(r"\$\{\w+:\?[^}]*\}", "placeholder", str(value))
        value = dotenv.get(name) or re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.broker_url.startswith("sentinel://") and settings.broker_sentinel_master == \
        "examforge"


def test_every_model_setting_reaches_the_containers():
    # Compose passes only what `environment` lists: a price left out would book every call
    # at $0 under compose.
    wanted = {name.upper() for name in Settings.model_fields if name.startswith("llm_")}
    for name in ("worker", "beat", "producer", "api"):
        env = _compose()["services"][name]["environment"]
        assert wanted <= set(env), (name, wanted - set(env))


def test_flower_takes_its_port_in_the_form_flower_accepts():
    # Flower's own option parser refuses `--port 5555`: the value must be joined to the option.
    command = _compose()["services"]["flower"]["command"]
    assert "--port=5555" in command and "--port" not in command
    assert "5555" in _compose()["services"]["flower"]["ports"][0]


def test_workers_log_at_info_so_progress_shows():
    for name in ("worker", "beat"):
        command = _compose()["services"][name]["command"]
        assert command[command.index("--loglevel") + 1] == "INFO", name


def test_api_serves_behind_the_same_auth():
    # Issue 11: serve binds all interfaces in its container, so it must have tokens: without
    # API_TOKENS serve itself refuses to start (below), and it is never given --no-auth. The
    # variable is optional to compose (`:-`, not `:?`): a missing token must stop the api
    # service only, not every service of the file.
    from producer.api.serve import check_binding, is_loopback

    api = _compose()["services"]["api"]
    command = api["command"]
    assert command[:4] == ["python", "-m", "producer", "serve"]
    assert "--no-auth" not in command and "--local" not in command  # enqueues to the workers
    host = command[command.index("--host") + 1]
    assert not is_loopback(host)
    assert api["environment"]["API_TOKENS"] == "${API_TOKENS:-}"
    assert not any("API_TOKENS" in str(svc.get("environment", {}))
                   for name, svc in _compose()["services"].items() if name != "api")
    assert api["environment"]["BROKER_URL"] == _compose()["services"]["worker"]["environment"][
        "BROKER_URL"]
    assert api["environment"]["DATABASE_URL"] == _compose()["services"]["worker"][
        "environment"]["DATABASE_URL"]
    # What serve would decide with the token compose passes, and without one.
    check_binding(Settings(_env_file=None, api_tokens="t"), host, no_auth=False)
    import pytest

    from examforge.errors import ConfigError

    with pytest.raises(ConfigError):
        check_binding(Settings(_env_file=None), host, no_auth=False)
    port = command[command.index("--port") + 1]
    assert all(p.startswith("127.0.0.1:") and p.endswith(f":{port}") for p in api["ports"])
    assert "/healthz" in " ".join(api["healthcheck"]["test"])
