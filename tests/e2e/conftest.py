from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import Deployment  # noqa: E402


@pytest.fixture
def mock() -> Iterator[Any]:
    """The mock model server, in a process of its own (mockproc.py): nothing the test
    process does can delay its replies."""
    from mockproc import MockProcess

    with MockProcess(latency_s=0.05) as server:
        yield server


@pytest.fixture
def deploy(tmp_path: Path, redis_url: str, mock: Any, request: pytest.FixtureRequest):
    """deploy(database="sqlite"|"postgres", migrated=True, **settings) -> a Deployment, torn
    down after.

    The database comes migrated to head, from the test process's replay of the migrated schema
    (tests/schema_template.py, 20 ms) rather than by Alembic in the deployment's first CLI or
    worker process (0.2 s of CPU on SQLite, 0.4 s on PostgreSQL, about 200 times a run).
    `migrated=False` leaves it empty, for the tests of a first start, whose processes migrate.
    """
    made: list[Deployment] = []

    def make(database: str = "sqlite", *, migrated: bool = True, **settings: Any) -> Deployment:
        url = settings.pop("database_url", None) or (
            f"sqlite:///{tmp_path / 'examforge.db'}" if database == "sqlite"
            else request.getfixturevalue("pg_url"))
        broker = settings.pop("broker_url", redis_url)
        if migrated:
            from storage.db import connect, migrate

            engine = connect(url)
            try:
                migrate(engine)
            finally:
                engine.dispose()
        dep = Deployment.create(tmp_path, url, broker, mock, **settings)
        made.append(dep)
        return dep

    yield make
    for dep in made:
        dep.stop_all()
