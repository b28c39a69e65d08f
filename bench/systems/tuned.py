"""examforge's own Celery app and CLI with some of Celery's settings overridden, for the `shape`
part's A/B of Celery's per-task path (prefetch, the result backend, the serializer).

`BENCH_CELERY_CONF` holds a JSON object applied with `app.conf.update` after `tasks` has set
its own configuration. The workers run `celery -A bench.systems.tuned worker ...` and the
producer `python -m bench.systems.tuned enqueue SLUG`, so that both sides of the broker agree
(a message published as msgpack is only read by a worker that accepts msgpack). Nothing in
examforge reads the variable: it exists only for the benchmark."""

from __future__ import annotations

import json
import os

from tasks import app

CONF_ENV = "BENCH_CELERY_CONF"  # bench.systems.distributed.CELERY_CONF_ENV

app.conf.update(json.loads(os.environ.get(CONF_ENV) or "{}"))

__all__ = ["app", "CONF_ENV"]

if __name__ == "__main__":
    from producer.cli import main

    raise SystemExit(main())
