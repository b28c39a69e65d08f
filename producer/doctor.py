"""`producer doctor`: what in this deployment's configuration could lose or stall work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from examforge.errors import DatabaseCorrupt, ExamforgeError, NoSchema
from examforge.settings import Settings
from storage import open_existing_store
from storage.db import READ_ONLY
from tasks.app import app_for
from tasks.broker import check_broker
from tasks.health import (Finding, Level, broker_findings, limiter_finding,
                           sentinel_findings)

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


# The first lines of a failed quick_check shown; it stops after this many problems.
_QUICK_CHECK_LINES = 3
_QUICK_CHECK_MAX = 20
DAMAGED = "database integrity"  # the check whose failure is exit 4, as a damaged database


def run_checks(settings: Settings) -> list[Finding]:
    findings = _database(settings)
    findings += _broker(settings)
    findings.append(_model_endpoint(settings))
    return findings


def _database(settings: Settings) -> list[Finding]:
    try:  # only reads: a doctor pointed at the wrong database must not create a schema there
        store = open_existing_store(settings.database_url, pool_size=1)
    except DatabaseCorrupt as exc:
        return [Finding(Level.fail, DAMAGED, str(exc))]
    except NoSchema as exc:
        return [Finding(Level.fail, "database", str(exc), exit_code=exc.exit_code)]
    except ExamforgeError as exc:
        return [Finding(Level.fail, "database", str(exc))]
    try:
        # The id every task message carries: a worker whose database has another one leaves
        # the message alone and says so (compare it with a worker's `doctor`).
        found = Finding(Level.ok, "database", f"{store.database_label()} reachable, schema up "
                        f"to date, database id {store.database_id()}")
        integrity = _integrity(store.engine)
    except DatabaseCorrupt as exc:
        return [Finding(Level.fail, DAMAGED, str(exc))]
    finally:
        store.engine.dispose()
    return [found, integrity]


def _integrity(engine: Engine) -> Finding:
    """SQLite's `PRAGMA quick_check`: every page and b-tree readable and well-formed, in time
    linear in the file's size (0.3 to 0.8 s for 200 MB in the page cache; `integrity_check`
    also matches each index against its table, and is slower). PostgreSQL checks its own pages as it reads
    them (and with data checksums, when the cluster has them); pg_amcheck checks them all."""
    if engine.dialect.name != "sqlite":
        return Finding(Level.ok, DAMAGED, "PostgreSQL: not checked here; pg_amcheck checks "
                                          "every table and index")
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        rows = [str(row[0]) for row in conn.exec_driver_sql(
            f"PRAGMA quick_check({_QUICK_CHECK_MAX})")]
    # A row may hold several lines, the first naming the schema ("*** in database main ***").
    lines = [line.strip() for row in rows for line in row.splitlines()
             if line.strip() and not line.startswith("***")]
    if rows == ["ok"]:
        return Finding(Level.ok, DAMAGED, "quick_check ok")
    shown = "; ".join(lines[:_QUICK_CHECK_LINES])
    more = f" (+{len(lines) - _QUICK_CHECK_LINES} more)" if len(lines) > _QUICK_CHECK_LINES \
        else ""
    return Finding(Level.fail, DAMAGED, f"quick_check failed: {shown}{more}; stop the workers "
                   "and restore the last backup (docs/how-to/backup-and-restore.md)")


def _broker(settings: Settings) -> list[Finding]:
    # Each Sentinel first (issue 34): when the broker fails, they say why.
    sentinels = sentinel_findings(settings)
    app = app_for(settings)
    try:
        check_broker(app, settings)
        return [*sentinels, Finding(Level.ok, "broker", "reachable"),
                *broker_findings(app, settings), limiter_finding(settings)]
    except ExamforgeError as exc:
        # The limiter's client would only fail the same way, after redis-py's retries.
        return [*sentinels, Finding(Level.fail, "broker", str(exc))]


def _model_endpoint(settings: Settings) -> Finding:
    key = settings.llm_api_key.get_secret_value()
    try:
        response = httpx.get(settings.llm_base_url.rstrip("/") + "/models", timeout=5,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as exc:
        hint = ""
        if httpx.URL(settings.llm_base_url).host in ("127.0.0.1", "localhost", "::1"):
            # The usual case on a laptop: the bundled mock (or Ollama) is not running.
            hint = (" (is the model server running? the bundled mock: python -m producer "
                    "mock-llm --port PORT)")
        return Finding(Level.fail, "model endpoint",
                       f"{settings.llm_base_url} unreachable: {type(exc).__name__}{hint}")
    if response.status_code in (401, 403):
        return Finding(Level.fail, "model endpoint",
                       f"{settings.llm_base_url} rejected LLM_API_KEY (HTTP {response.status_code})")
    if response.status_code >= 400:
        return Finding(Level.warn, "model endpoint",
                       f"{settings.llm_base_url}/models answered HTTP {response.status_code} "
                       "(some servers do not list models; calls may still work)")
    return Finding(Level.ok, "model endpoint", f"{settings.llm_base_url} reachable")
