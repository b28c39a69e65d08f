"""Log lines with structured fields: `extra={...}` values are appended as key=value."""

from __future__ import annotations

import logging
import sys

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD
                  and not k.startswith("_")}
        if not fields:
            return base
        return base + " " + " ".join(f"{k}={v}" for k, v in fields.items())


def setup_logging(level: str | int = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx logs every request at INFO; the call ledger in the database is the record.
    logging.getLogger("httpx").setLevel(logging.WARNING)
