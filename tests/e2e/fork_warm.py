"""Imported once by the tests' forkserver (forks.py), before it forks any process: what a
Celery worker, a beat and a mock server import, and the tokenizer. Nothing of the project
that reads the environment or the settings (`tasks`, `examforge.settings.load_settings()`)
is imported or called here: each fork reads its own."""

import importlib

for _module in (
    # Celery and its command line, with the plugins its CLI loads (Flower, Tornado).
    "celery", "celery.bin.celery", "celery.apps.worker", "celery.apps.beat", "celery.beat",
    "celery.worker", "celery.worker.consumer", "celery.concurrency.thread",
    "celery.app.trace", "kombu.transport.redis", "redis",
    # The project's libraries.
    "sqlalchemy", "sqlmodel", "pydantic", "pydantic_settings", "httpx", "psycopg",
    "tiktoken", "numpy",
    # The project's modules that read nothing at import.
    "examforge.tokens", "examforge.llm", "storage", "runner.pipeline", "runner.heartbeat",
    # The mock's server (mockproc.py).
    "mockllm.server", "mockllm.service",
):
    importlib.import_module(_module)

from examforge.tokens import encoding_for  # noqa: E402
from mockllm import MODEL_ID  # noqa: E402

encoding_for(MODEL_ID)
