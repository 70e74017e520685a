"""Reference bumps off the hot path: reads enqueue (type, id); a background thread flushes them in batches.

One UPDATE per memory type per flush (not one per hit, and never inside the read's transaction). Bumps are a
soft signal: the few in memory when a process dies are lost, which only makes those memories look a bit older.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, TextClause, text

log = logging.getLogger(__name__)

TABLES = {"episode": "episodes", "fact": "facts", "rule": "rules"}


# An anti-pattern warning that is still being matched (found by a search or recall, or shown in a context block)
# is still doing its job: the match confirms it, so it does not decay away while the mistake it warns about keeps
# coming up. One unmatched for its decay period fades as any rule does (issue 16, item 14).
ANTI_PATTERN_KEEP = (
    ", last_confirmed_at = CASE WHEN t.maturity = 'anti_pattern' AND t.validity = 'active' "
    "THEN greatest(t.last_confirmed_at, :now) ELSE t.last_confirmed_at END"
)

Bump = tuple[str, uuid.UUID, bool]  # (type, id, recent): ``recent`` also makes the memory count as just used


def flush_bumps(conn: Connection, counts: Counter[Bump], now: datetime) -> Counter[Bump]:
    """Apply accumulated bumps: one statement per type. Returns the bumps left for the next flush.

    Every bump adds to ``reference_count``; only a use (search, recall, get) moves ``last_referenced_at``. Being
    shown in a context block does not: recency weighs in the block's own ranking, so a memory shown yesterday
    would otherwise outrank a better match today only because it was shown (a rich-get-richer loop).

    A row another transaction holds (a worker consolidating or re-contextualising it) is skipped, never waited
    for, and its bumps are left for the next flush (a deleted row's are dropped). A flush that waited took its
    rows in another order than the worker takes them, and the two deadlocked: 44 times in an evening of
    contract bursts, each broken by PostgreSQL only after deadlock_timeout (1 s) of the worker waiting."""
    left: Counter[Bump] = Counter()
    for kind, table in TABLES.items():
        mine = [(i, recent, n) for (k, i, recent), n in counts.items() if k == kind]
        if not mine:
            continue
        params = {
            "ids": [str(i) for i, _, _ in mine],
            "recent": [r for _, r, _ in mine],
            "incs": [n for _, _, n in mine],
            "now": now,
        }
        done: set[uuid.UUID] = set(conn.execute(_bump_statement(kind, table), params).scalars())
        skipped = {i for i, _, _ in mine if i not in done}
        if skipped:
            still_there: set[uuid.UUID] = set(
                conn.execute(text(f"SELECT id FROM {table} WHERE id = ANY(:ids)"), {"ids": list(skipped)}).scalars()
            )
            left.update({b: n for b, n in counts.items() if b[0] == kind and b[1] in still_there})
    return left


def _bump_statement(kind: str, table: str) -> TextClause:
    return text(
        f"WITH b AS (SELECT id, sum(n)::int AS n, bool_or(recent) AS recent FROM unnest(CAST(:ids AS uuid[]), "
        "CAST(:recent AS boolean[]), CAST(:incs AS int[])) AS u(id, recent, n) GROUP BY id), "
        f"free AS (SELECT t.id FROM {table} t JOIN b ON b.id = t.id ORDER BY t.id FOR UPDATE OF t SKIP LOCKED) "
        f"UPDATE {table} t SET reference_count = t.reference_count + b.n, "
        "last_referenced_at = CASE WHEN b.recent THEN greatest(t.last_referenced_at, :now) "
        f"ELSE t.last_referenced_at END{ANTI_PATTERN_KEEP if kind == 'rule' else ''} "
        "FROM b JOIN free ON free.id = b.id WHERE t.id = b.id RETURNING t.id"
    )


class ReferenceBumper:
    """Collects bumps from request threads; a daemon thread writes them in batches: a use's (search, recall, get:
    it moves recency) every ``interval`` seconds, a context block's (shown, not used: a count only) every
    ``shown_interval``.

    Context blocks are the hot read path, and each bump rewrites a whole row: an episode's (its text, vectors and
    tsvectors) cannot be updated in place, so PostgreSQL writes a new version into every index, the HNSW graph
    included. Flushed every second, the contract burst rewrote each episode ~18 times a minute (0.2 of a core
    of PostgreSQL); a block's bumps gathered for ``shown_interval`` write each shown row once per interval."""

    def __init__(self, engine: Engine, *, interval: float = 1.0, shown_interval: float = 30.0) -> None:
        self._engine = engine
        self._interval = interval
        self._shown_interval = shown_interval
        self._used: Counter[Bump] = Counter()
        self._shown: Counter[Bump] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reference-bumper", daemon=True)
        self._thread.start()

    def add(self, items: Iterable[tuple[str, uuid.UUID]], *, recent: bool = True) -> None:
        """Count a reference to each (type, id); ``recent``: it was used, not only shown (see flush_bumps)."""
        with self._lock:
            (self._used if recent else self._shown).update((kind, i, recent) for kind, i in items)

    def flush(self, *, shown: bool = True) -> int:
        """Write what is pending (the shown bumps too, unless ``shown`` is False); returns how many bumps were
        written (the rest wait for the next flush)."""
        with self._lock:
            batch, self._used = self._used, Counter()
            if shown:
                batch.update(self._shown)
                self._shown = Counter()
        if not batch:
            return 0
        try:
            with self._engine.begin() as conn:
                left = flush_bumps(conn, batch, datetime.now(timezone.utc))
        except Exception:  # a bump is never worth failing for; keep the counts for the next try
            log.warning("reference bump flush failed", exc_info=True, extra={"pending": len(batch)})
            left = batch
        if left:
            with self._lock:
                for bump, n in left.items():
                    (self._used if bump[2] else self._shown)[bump] += n
        return len(batch) - len(left)

    def _run(self) -> None:
        shown_due = time.monotonic() + self._shown_interval
        while not self._stop.wait(self._interval):
            shown = time.monotonic() >= shown_due
            if shown:
                shown_due = time.monotonic() + self._shown_interval
            self.flush(shown=shown)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
