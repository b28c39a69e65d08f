"""The audit as the CLI and the API show it: `producer audit`, GET /audit."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from examforge.errors import BadCursor
from producer.prune import parse_duration_s
from producer.words import when


def since_epoch_s(since: str | None, store: Any) -> float | None:
    """`--since` / `?since=`: an ISO 8601 time (no zone: UTC), or a duration before the
    database's clock now (30m, 12h, 7d). BadCursor (422, exit 2) for anything else."""
    if since is None:
        return None
    text = since.strip()
    try:
        return store.database_now() - parse_duration_s(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadCursor(f"since: {since[:64]!r} is neither an ISO 8601 time "
                        "(2026-12-01T09:00Z) nor a duration (30m, 12h, 7d)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return at.timestamp()


def audit_dict(row: Any) -> dict[str, Any]:
    return {"id": row.id, "at": when(row.at), "actor": row.actor, "action": row.action,
            "exam": row.exam, "details": row.details, "outcome": row.outcome}
