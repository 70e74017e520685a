"""Structured logs: one JSON object per line on stderr, with whatever context the caller binds, and the fields
of registered context providers (the active span's ``trace_id``/``span_id`` when tracing is on)."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import logging.handlers
import os
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

    Request paths only enqueue the record; formatting and the write happen off the hot path. A forked child (a
    Celery pool process) gets a writer thread of its own: threads do not survive fork, and without one its
    records would pile up, unwritten, in the queue it inherited.
    """
    global _listener
    root = logging.getLogger()
    if _listener is not None:
        return
    # What a line never shows is not gathered for every record (the logging HOWTO's "Optimization"): the caller's
    # file and line (a walk up the stack), its thread and its process.
    logging._srcfile = None  # noqa: SLF001 - the documented switch
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [_start_writer(handler)]
    root.setLevel(level)
    atexit.register(flush_logs)


WRITE_EVERY_S = 0.05
_STOP = object()


class _Writer(logging.handlers.QueueListener):
    """Writes what gathered, at most every ``WRITE_EVERY_S``, instead of waking for each record: a busy process
    pays one thread wake-up per interval rather than one per line (about a tenth of an accept's front CPU). A line
    reaches stderr at most that much later; ``stop()`` still writes everything logged before it."""

    def __init__(self, records: queue.SimpleQueue[Any], *handlers: logging.Handler) -> None:
        super().__init__(records, *handlers, respect_handler_level=False)
        self._records = records

    def enqueue_sentinel(self) -> None:
        self._records.put(_STOP)

    def _monitor(self) -> None:
        while True:
            batch = [self._records.get()]
            time.sleep(WRITE_EVERY_S)
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._records.get_nowait())
            for record in batch:
                if record is _STOP:
                    return
                self.handle(record)


class _Enqueue(logging.handlers.QueueHandler):
    """Puts the record itself on the queue, for the writer's thread to format. QueueHandler would copy and format it
    in the thread that logs (a request's); the record never leaves this process, so nothing needs to be made
    picklable. A message's arguments are read when the line is written, at most ``WRITE_EVERY_S`` later: log
    values, not objects that change."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def _start_writer(*handlers: logging.Handler) -> logging.handlers.QueueHandler:
    global _listener
    records: queue.SimpleQueue[Any] = queue.SimpleQueue()
    _listener = _Writer(records, *handlers)
    _listener.start()
    return _Enqueue(records)


def _writer_after_fork() -> None:
    """In a forked child: our queue handler replaced by one whose writer thread runs here."""
    inherited = _listener
    if inherited is None:
        return
    root = logging.getLogger()
    root.handlers[:] = [
        _start_writer(*inherited.handlers) if getattr(h, "queue", None) is inherited.queue else h for h in root.handlers
    ]


def flush_logs() -> None:
    """Write every record logged so far and stop the writer (at exit; a process may leave without atexit)."""
    if _listener is not None and _listener._thread is not None:  # noqa: SLF001 - stop() is not idempotent
        _listener.stop()


os.register_at_fork(after_in_child=_writer_after_fork)


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


_listener: _Writer | None = None

ContextFields = Callable[[], dict[str, Any]]
_context: list[ContextFields] = []
_base_factory: Callable[..., logging.LogRecord] | None = None


def add_context(fields: ContextFields) -> None:
    """Add ``fields()`` to every log record made from now on (idempotent).

    They are read when the record is made, in the thread that logs: the JSON line is written later by the
    listener's thread, where the caller's span is no longer current. Nothing is added while none is registered.
    """
    global _base_factory
    if fields in _context:
        return
    _context.append(fields)
    if _base_factory is None:
        _base_factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_record_with_context)


def remove_context(fields: ContextFields) -> None:
    if fields in _context:
        _context.remove(fields)


def _record_with_context(*args: Any, **kwargs: Any) -> logging.LogRecord:
    assert _base_factory is not None
    record = _base_factory(*args, **kwargs)
    for fields in _context:
        record.__dict__.update(fields())
    return record
