"""The Celery app: `celery -A tasks worker -P threads -c 32`, `celery -A tasks beat`,
`celery -A tasks flower`."""

from tasks.app import app, generate_chapter, reconcile

__all__ = ["app", "generate_chapter", "reconcile"]
