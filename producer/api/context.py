"""What every handler needs, built once per app: its own module so that the handlers'
modules (routes, runs, events) and the app that builds it import it, not each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examforge.settings import Settings
from producer.api.metrics import StoreMetrics
from producer.api.work import Work


@dataclass
class Context:
    """What every handler needs, built once per app."""

    settings: Settings
    store: Any
    work: Work
    auth: bool = True  # bearer tokens checked (each client's Idempotency-Keys its own)
    metrics: StoreMetrics | None = None  # GET /metrics's figures, kept across scrapes
