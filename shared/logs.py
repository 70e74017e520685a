"""Structured logs: one JSON object per line on stderr, with whatever context the caller binds."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time

_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO") -> None:
    """Route the root logger to stderr as JSON lines, written by a background thread (idempotent).

    Request paths only enqueue the record; formatting and the write happen off the hot path.
    """
    global _listener
    root = logging.getLogger()
    if _listener is not None:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, handler, respect_handler_level=False)
    _listener.start()
    atexit.register(_listener.stop)
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level)


_listener: logging.handlers.QueueListener | None = None
