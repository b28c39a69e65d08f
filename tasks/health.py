"""What the broker's own configuration means for our messages (`producer doctor`, and a
warning when a worker starts)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from celery import Celery

from examforge.settings import Settings
from tasks.broker import is_redis


class Level(str, Enum):
    ok = "ok"
    warn = "warn"
    fail = "fail"


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    message: str
    exit_code: int = 1  # of `producer doctor` when this check fails (2: a database without schema)


def broker_findings(app: Celery, settings: Settings) -> list[Finding]:
    """Eviction policy and persistence of a Redis broker, read with INFO (which managed Redis
    services allow even where CONFIG is disabled)."""
    if not is_redis(settings):
        return [Finding(Level.warn, "broker", "not Redis: eviction and persistence not checked")]
    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        memory = client.info("memory")
        persistence = client.info("persistence")
    policy = str(memory.get("maxmemory_policy", "unknown"))
    findings = []
    if policy == "noeviction":
        findings.append(Finding(Level.ok, "broker eviction",
                                "maxmemory-policy noeviction: Redis refuses writes when full "
                                "instead of dropping queued messages"))
    else:
        findings.append(Finding(
            Level.fail, "broker eviction",
            f"maxmemory-policy {policy}: under memory pressure Redis may evict the queue and "
            "its messages; run Redis with --maxmemory-policy noeviction (the reconciler "
            "re-publishes lost chapters, but only after the loss)"))
    aof = bool(persistence.get("aof_enabled"))
    if aof:
        findings.append(Finding(Level.ok, "broker persistence",
                                "appendonly yes: a Redis restart keeps the queue"))
    else:
        findings.append(Finding(
            Level.warn, "broker persistence",
            "appendonly no: a Redis restart loses every queued message; the reconciler "
            "re-enqueues them from the database, but run Redis with --appendonly yes"))
    return findings
