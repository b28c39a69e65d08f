import sys
from pathlib import Path

import pytest

from helpers import migrates_at_once

# Share the unit tier's fake provider.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Every test of this tier talks to the machine's real PostgreSQL or Redis:
    `-m integration` selects them, `-m "not integration"` leaves them out."""
    import pytest
    from helpers import resolved_parents

    here = Path(__file__).resolve().parent
    for item in items:
        if here in resolved_parents(item):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
@migrates_at_once
def store(db_url):  # type: ignore[no-untyped-def]
    """A migrated store on each database (`db_url` runs SQLite and PostgreSQL)."""
    from storage import Store, connect, migrate

    engine = connect(db_url)
    migrate(engine)
    yield Store(engine)
    engine.dispose()
