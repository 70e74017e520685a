"""What a load test measures: every accepted write, every call's latency, every read, and a time series.

Times are seconds since the run's start (``time.monotonic()`` based). The sampler polls the database every
0.5 s in a thread (the event loop keeps driving clients meanwhile); a sample the database could not answer
(a drill stopped it) is recorded with ``None`` for the database figures, never dropped.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
from sqlalchemy import Engine, text

SAMPLE_INTERVAL_S = 0.5
# A sample is a handful of index-only counts; if one takes longer the database is in trouble (or stopped).
SAMPLE_STATEMENT_TIMEOUT_MS = 2000

SAMPLE_SQL = text("""
SELECT
  (SELECT count(*) FROM write_intents WHERE tenant_id = ANY(:t) AND status = 'pending') AS pending_intents,
  (SELECT count(*) FROM episodes WHERE tenant_id = ANY(:t)) AS stored,
  (SELECT count(*) FROM episodes WHERE tenant_id = ANY(:t)
     AND consolidation_status IN ('pending', 'failed')) AS unconsolidated
""")


@dataclass
class Accept:
    """One accepted episode: where it went, its place in its client's send order, and how long accepting took."""

    tenant_id: str
    butler: str
    client: int
    position: int
    id: str
    idempotency_key: str
    first_sent_at: float
    accepted_at: float
    latency_ms: float  # the call that answered "accepted"
    total_ms: float  # first attempt to "accepted", retries included
    attempts: int
    replayed: bool


@dataclass
class Recorder:
    """Everything the clients observe, appended from the event loop (so no locks)."""

    started: float = field(default_factory=time.monotonic)
    accepts: list[Accept] = field(default_factory=list)
    calls: list[tuple[float, float, int]] = field(default_factory=list)  # (t, ms, episodes) of accept calls
    reads: list[tuple[float, float, bool]] = field(default_factory=list)  # (t, ms, degraded)
    counts: Counter[str] = field(default_factory=Counter)
    samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # drill milestones
    burst_ended: float | None = None

    def now(self) -> float:
        return time.monotonic() - self.started

    def event(self, name: str, **detail: Any) -> None:
        self.events.append({"t": round(self.now(), 3), "event": name, **detail})

    def window(self, name: str) -> tuple[float, float] | None:
        """(start, end) of a drill's outage from its ``<name>_down`` / ``<name>_restoring`` events."""
        times = {e["event"]: e["t"] for e in self.events}
        down, back = times.get(f"{name}_down"), times.get(f"{name}_restoring")
        return (down, back) if down is not None and back is not None else None

    def accepted_within(self, window: tuple[float, float]) -> int:
        """Accepts whose successful call started and finished inside ``window`` (must be 0 while the DB is down)."""
        start, end = window
        return sum(1 for a in self.accepts if a.accepted_at - a.latency_ms / 1000 >= start and a.accepted_at <= end)

    def accepts_json(self) -> list[dict[str, Any]]:
        return [asdict(a) for a in self.accepts]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def latency_summary(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


def sample_database(engine: Engine, tenant_ids: list[str]) -> dict[str, int] | None:
    """(pending intents, stored episodes, unconsolidated episodes) of the run's tenants; None if unreachable."""
    try:
        with engine.connect() as conn:
            conn.execute(text(f"SET statement_timeout = {SAMPLE_STATEMENT_TIMEOUT_MS}"))
            row = conn.execute(SAMPLE_SQL, {"t": tenant_ids}).mappings().one()
            conn.rollback()
        return dict(row)
    except Exception:  # noqa: BLE001 - a drill may have stopped the database: the gap is the measurement
        return None


async def run_sampler(
    recorder: Recorder, engine: Engine | None, tenant_ids: list[str], *, baseline: int, stop: asyncio.Event
) -> None:
    """Append one sample every SAMPLE_INTERVAL_S until ``stop`` is set (and once more after)."""
    read_seen = 0
    while True:
        db = await asyncio.to_thread(sample_database, engine, tenant_ids) if engine is not None else None
        reads = recorder.reads[read_seen:]
        read_seen += len(reads)
        stored = db["stored"] - baseline if db else None
        recorder.samples.append(
            {
                "t": round(recorder.now(), 3),
                "accepted": len(recorder.accepts),
                "stored": stored,
                "pending_intents": db["pending_intents"] if db else None,
                "unconsolidated": db["unconsolidated"] if db else None,
                "backlog": db["pending_intents"] + db["unconsolidated"] if db else None,
                "read_p50_ms": percentile([r[1] for r in reads], 50),
                "read_max_ms": max((r[1] for r in reads), default=None),
                "reads": len(reads),
            }
        )
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), SAMPLE_INTERVAL_S)
        except TimeoutError:
            pass


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process and its children (a worker's pool, PostgreSQL's backends)."""
    out = {}
    for name, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            own = proc.cpu_times()
            total = own.user + own.system + own.children_user + own.children_system  # + exited children
            for child in proc.children(recursive=True):
                try:
                    times = child.cpu_times()
                    total += times.user + times.system
                except psutil.Error:
                    continue
            out[name] = total
        except psutil.Error:
            continue
    return out


def cpu_used(before: dict[str, float], after: dict[str, float], *, seconds: float, episodes: int) -> dict[str, Any]:
    """Per process: cores busy on average over ``seconds``, and CPU milliseconds per accepted episode."""
    names = [n for n in before if n in after]
    return {
        n: {
            "cores": round((after[n] - before[n]) / max(seconds, 1e-6), 3),
            "ms_per_episode": round(1000 * (after[n] - before[n]) / max(episodes, 1), 3),
        }
        for n in names
    }
