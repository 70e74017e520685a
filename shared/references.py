"""Reference bumps off the hot path: reads enqueue (type, id); a background thread flushes them in batches.

One UPDATE per memory type per flush (not one per hit, and never inside the read's transaction). Bumps are a
soft signal: the few in memory when a process dies are lost, which only makes those memories look a bit older.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone

from sqlalchemy import Engine, text

log = logging.getLogger(__name__)

TABLES = {"episode": "episodes", "fact": "facts", "rule": "rules"}


def flush_bumps(conn, counts: Counter[tuple[str, uuid.UUID]], now: datetime) -> int:  # noqa: ANN001 - Connection
    """Apply accumulated bumps: one statement per type. Returns rows touched."""
    touched = 0
    for kind, table in TABLES.items():
        ids = [str(i) for (k, i) in counts if k == kind]
        if not ids:
            continue
        incs = [counts[(kind, uuid.UUID(i))] for i in ids]
        touched += conn.execute(text(
            f"UPDATE {table} t SET reference_count = t.reference_count + b.n, last_referenced_at = :now "
            "FROM unnest(CAST(:ids AS uuid[]), CAST(:incs AS int[])) AS b(id, n) WHERE t.id = b.id"
        ), {"ids": ids, "incs": incs, "now": now}).rowcount
    return touched


class ReferenceBumper:
    """Collects bumps from request threads; a daemon thread writes them every ``interval`` seconds."""

    def __init__(self, engine: Engine, *, interval: float = 1.0) -> None:
        self._engine = engine
        self._interval = interval
        self._pending: Counter[tuple[str, uuid.UUID]] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reference-bumper", daemon=True)
        self._thread.start()

    def add(self, items: Iterable[tuple[str, uuid.UUID]]) -> None:
        with self._lock:
            self._pending.update(items)

    def flush(self) -> int:
        with self._lock:
            batch, self._pending = self._pending, Counter()
        if not batch:
            return 0
        try:
            with self._engine.begin() as conn:
                return flush_bumps(conn, batch, datetime.now(timezone.utc))
        except Exception:  # a bump is never worth failing for; keep the counts for the next try
            log.warning("reference bump flush failed", exc_info=True, extra={"pending": len(batch)})
            with self._lock:
                self._pending.update(batch)
            return 0

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
