"""Talking to the broker from the producer side: fail fast, publish chapters, broker epoch."""

from __future__ import annotations

import uuid
from typing import Sequence

from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError

from examforge.errors import BrokerUnavailable
from examforge.settings import Settings

EPOCH_KEY = "examforge:broker-epoch"
CHAPTER_TASK = "examforge.generate_chapter"


def task_id(exam: str, chapter_id: str) -> str:
    """The deterministic task id of a chapter (slug and id are both [a-z0-9-])."""
    return f"examforge:{exam}:{chapter_id}"


def _redacted(url: str) -> str:
    from kombu.utils.url import maybe_sanitize_url

    return maybe_sanitize_url(url)


def check_broker(app: Celery, settings: Settings) -> None:
    """Raise BrokerUnavailable within about `broker_connect_timeout_s` when it is down.

    Celery would otherwise retry the connection for a long time; a CLI must answer at once.
    """
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                   timeout=settings.broker_connect_timeout_s)
    except Exception as exc:  # kombu raises many types here, all meaning "not reachable"
        raise BrokerUnavailable(
            f"broker {_redacted(settings.broker_url)} unreachable: {exc}".splitlines()[0]
        ) from None


def broker_epoch(app: Celery, settings: Settings) -> str | None:
    """An id that lives in the broker itself: when Redis loses its data (restart without
    persistence, FLUSHALL) the id changes, and the reconciler knows every queued message of the
    old epoch is gone. None for brokers other than Redis."""
    if not settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
        return None
    try:
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            client.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
            value = client.get(EPOCH_KEY)
    except Exception as exc:
        raise BrokerUnavailable(f"broker epoch unreadable: {exc}".splitlines()[0]) from None
    return value.decode() if isinstance(value, bytes) else value


def publish_chapters(app: Celery, exam: str, chapter_ids: Sequence[str]) -> None:
    """One message per chapter, with the chapter's deterministic task id."""
    try:
        with app.producer_or_acquire() as producer:
            for chapter_id in chapter_ids:
                app.send_task(
                    CHAPTER_TASK, (exam, chapter_id), task_id=task_id(exam, chapter_id),
                    producer=producer,
                    retry=True, retry_policy={"max_retries": 2, "interval_start": 0.2,
                                              "interval_step": 0.5, "interval_max": 1},
                )
    except (KombuOperationalError, OSError) as exc:
        raise BrokerUnavailable(f"publishing to the broker failed: {exc}".splitlines()[0]) from None
