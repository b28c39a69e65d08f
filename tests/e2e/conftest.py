from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import Deployment  # noqa: E402


@pytest.fixture
def mock() -> Iterator[Any]:
    from mockllm import MockConfig, MockServer

    server = MockServer(MockConfig(latency_s=0.05))
    server.base_url = server.start()
    yield server
    server.stop()


@pytest.fixture
def deploy(tmp_path: Path, redis_url: str, mock: Any, request: pytest.FixtureRequest):
    """deploy(database="sqlite"|"postgres", **settings) -> a Deployment, torn down after."""
    made: list[Deployment] = []

    def make(database: str = "sqlite", **settings: Any) -> Deployment:
        url = settings.pop("database_url", None) or (
            f"sqlite:///{tmp_path / 'examforge.db'}" if database == "sqlite"
            else request.getfixturevalue("pg_url"))
        broker = settings.pop("broker_url", redis_url)
        dep = Deployment.create(tmp_path, url, broker, mock, **settings)
        made.append(dep)
        return dep

    yield make
    for dep in made:
        dep.stop_all()
