"""`producer doctor`: what in this deployment's configuration could lose or stall work."""

from __future__ import annotations

import httpx

from examforge.errors import ExamforgeError
from examforge.settings import Settings
from tasks.health import Finding, Level, broker_findings


def run_checks(settings: Settings) -> list[Finding]:
    findings = [_database(settings)]
    findings += _broker(settings)
    findings.append(_model_endpoint(settings))
    return findings


def _database(settings: Settings) -> Finding:
    from storage import NoSchema, open_existing_store

    try:  # only reads: a doctor pointed at the wrong database must not create a schema there
        store = open_existing_store(settings.database_url, pool_size=1)
    except NoSchema as exc:
        return Finding(Level.fail, "database", str(exc), exit_code=exc.exit_code)
    except ExamforgeError as exc:
        return Finding(Level.fail, "database", str(exc))
    # The id every task message carries: a worker whose database has another one leaves
    # the message alone and says so (compare it with a worker's `doctor`).
    found = Finding(Level.ok, "database", f"{store.database_label()} reachable, schema up to "
                    f"date, database id {store.database_id()}")
    store.engine.dispose()
    return found


def _broker(settings: Settings) -> list[Finding]:
    from tasks import app
    from tasks.broker import check_broker

    try:
        check_broker(app, settings)
        return [Finding(Level.ok, "broker", "reachable"), *broker_findings(app, settings)]
    except ExamforgeError as exc:
        return [Finding(Level.fail, "broker", str(exc))]


def _model_endpoint(settings: Settings) -> Finding:
    key = settings.llm_api_key.get_secret_value()
    try:
        response = httpx.get(settings.llm_base_url.rstrip("/") + "/models", timeout=5,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as exc:
        return Finding(Level.fail, "model endpoint",
                       f"{settings.llm_base_url} unreachable: {type(exc).__name__}")
    if response.status_code in (401, 403):
        return Finding(Level.fail, "model endpoint",
                       f"{settings.llm_base_url} rejected LLM_API_KEY (HTTP {response.status_code})")
    if response.status_code >= 400:
        return Finding(Level.warn, "model endpoint",
                       f"{settings.llm_base_url}/models answered HTTP {response.status_code} "
                       "(some servers do not list models; calls may still work)")
    return Finding(Level.ok, "model endpoint", f"{settings.llm_base_url} reachable")
