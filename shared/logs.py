"""Structured logs: one JSON object per line on stderr, with whatever context the caller binds."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from pathlib import Path

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


class _Terminal(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"memory-butler: {record.levelname.lower()}: {record.getMessage()}"


def _not_library_warnings(record: logging.LogRecord) -> bool:
    return record.name != "py.warnings"


def configure_cli_logging(log_file: Path | None, level: str = "INFO") -> None:
    """A one-shot command's logs: every record as JSON to ``log_file`` (None: nowhere); on the terminal only
    warnings and errors, one plain line each. Python warnings raised inside libraries go to the file only.

    So a command's stdout is its answer and its stderr is empty unless something needs the user's attention.
    """
    root = logging.getLogger()
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel(logging.WARNING)
    terminal.setFormatter(_Terminal())
    terminal.addFilter(_not_library_warnings)
    handlers: list[logging.Handler] = [terminal]
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            to_file = logging.FileHandler(log_file, encoding="utf-8", delay=True)
        except OSError:
            to_file = None  # a read-only data dir: the terminal still shows what matters
        if to_file is not None:
            to_file.setFormatter(JsonFormatter())
            handlers.append(to_file)
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(True)


_listener: logging.handlers.QueueListener | None = None
