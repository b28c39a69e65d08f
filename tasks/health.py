"""What the broker's own configuration means for our messages (`producer doctor`, and a
warning when a worker starts)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from celery import Celery

from examforge.settings import Settings, is_sentinel_url
from tasks.broker import broker_redis, is_redis, sentinel_report, sentinel_verdict


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


def sentinel_findings(settings: Settings) -> list[Finding]:
    """Each Sentinel of a sentinel:// BROKER_URL: reachable, and where it says the master is
    (issue 34). One Sentinel alone is a warning: it is the single point of failure that
    Sentinel is there to remove, and it cannot be outvoted when it is wrong."""
    if not is_sentinel_url(settings.broker_url):
        return []
    report = sentinel_report(settings)
    findings = [Finding(Level.ok if master else Level.fail, f"broker sentinel {where}", said)
                for where, master, said in report]
    masters = {master for _, master, _ in report if master}
    if len(masters) > 1:
        findings.append(Finding(Level.fail, "broker sentinels",
                                f"disagree on the master: {', '.join(sorted(masters))}"))
    if len(report) == 1:
        findings.append(Finding(Level.warn, "broker sentinels",
                                "BROKER_URL lists one Sentinel: list every Sentinel (at least "
                                "three, on separate machines), so that losing one loses "
                                "nothing"))
    return findings


def limiter_finding(settings: Settings) -> Finding:
    """The shared rate limiter and the provider's holds reach the broker's Redis through
    redis-py, not kombu: the client the workers build (tasks.broker.broker_redis) is asked
    for its server's role, which must be a master (a replica refuses the limiter's writes)."""
    if not is_redis(settings):
        return Finding(Level.warn, "rate limiter", "broker is not Redis: each worker applies "
                       "LLM_RPM/LLM_TPM and the provider's holds on its own")
    client = broker_redis(settings)
    try:
        role = client.execute_command("ROLE")
    except Exception as exc:  # noqa: BLE001 (redis-py's and Sentinel's errors alike)
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if is_sentinel_url(settings.broker_url):  # redis-py's message repeats every client
            text = sentinel_verdict(settings) or text
        return Finding(Level.fail, "rate limiter", f"the broker's Redis unreachable: {text}")
    finally:
        client.close()
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    if kind != "master":
        return Finding(Level.fail, "rate limiter",
                       f"the broker's Redis is a replica ({kind}): the limiter's and the "
                       "queue's writes are refused; point BROKER_URL at the master, or at "
                       "the Sentinels")
    via = " through Sentinel" if is_sentinel_url(settings.broker_url) else ""
    return Finding(Level.ok, "rate limiter", f"reaches the broker's master{via} (the shared "
                   "limits and the provider's holds)")
