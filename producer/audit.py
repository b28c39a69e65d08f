"""The audit as the CLI and the API show it: `producer audit`, GET /audit."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from examforge.errors import BadCursor
from producer.prune import parse_duration_s
from producer.words import when


# What the API's `?since=` takes, exactly (the document states it, and a time it matches is
# one Python reads): a duration (prune's: a whole number and s, m, h or d), or an ISO 8601
# date of the years 1000-2999 (a real day: no 31 April, 29 February of leap years only), with
# an optional time (hours and minutes, optional seconds and fraction) and offset (Z or
# +HH:MM). The CLI's --since reads whatever datetime.fromisoformat reads.
_DAY = (r"(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
        r"|02-(0[1-9]|1[0-9]|2[0-8])")
_LEAP = r"[12][0-9](0[48]|[2468][048]|[13579][26])|(1[26]|2[048])00"
_DATE = rf"([12][0-9]{{3}}-({_DAY})|({_LEAP})-02-29)"
_TIME = r"T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?"
SINCE_PATTERN = rf"^([0-9]{{1,9}}[smhd]|{_DATE}({_TIME})?)$"


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
