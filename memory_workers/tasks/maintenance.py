"""The scheduled maintenance tasks: each claims its tick in maintenance_runs first, so a tick runs at most once.

A second beat (or a redelivered message) publishing the same tick finds the (task, tick) row taken and
returns ``{"skipped": ...}``. The work itself is idempotent too: sweeps are set-based and converge, and
wake-ups only ask a shard key's worker to look at work that is already durable in Postgres.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from memory_workers.app import app
from memory_workers.enqueue import wake_apply, wake_consolidate
from memory_workers.schedule import (
    BACKLOG_TRIGGER,
    CONSOLIDATE_ALL,
    DECAY_SWEEP,
    EPISODE_CLEANUP,
    EVENT_PARTITIONS,
    PUBLISHED_AT_HEADER,
    REDELIVERY_SWEEP,
    tick_id,
)
from memory_workers.tasks import Runtime, runtime
from shared import intake, maintenance, stats
from shared.db import unit_of_work
from shared.errors import Unavailable

log = logging.getLogger(__name__)

# An accepted write whose intent is still pending after this lost its wake-up (apply takes milliseconds).
STALE_INTENT = timedelta(seconds=30)
# An episode pending this long lost its consolidation wake-up: ingest wakes consolidation on every applied
# batch, so a healthy key's pending episodes are seconds old; 5 minutes leaves room for a slow extractor.
STUCK_PENDING = timedelta(minutes=5)
# The seed's SLO: a daily sweep completes within 30 minutes. Past it the sweep stops (its batches so far are
# committed) and the run records the error; the worker-wide limit (10 min) would cut a large tenant base short.
SWEEP_SOFT_LIMIT_S = 1800
SWEEP_HARD_LIMIT_S = SWEEP_SOFT_LIMIT_S + 60

Body = Callable[[Runtime, datetime], dict[str, Any]]


def run_ticked(task: str, request: Any, tick: str | None, body: Body) -> dict[str, Any]:
    """Claim (task, tick), run ``body``, record its summary (or error); a tick claimed before is skipped."""
    rt = runtime()
    now = datetime.now(UTC)
    published = request.get(PUBLISHED_AT_HEADER) if request is not None else None
    tick = tick or tick_id(task, published_at=float(published or now.timestamp()), settings=rt.settings)
    with unit_of_work(rt.engine) as conn:
        run_id = maintenance.claim_tick(conn, task=task, tick=tick)
    if run_id is None:
        log.info("maintenance tick already claimed", extra={"task": task, "tick": tick})
        return {"skipped": "tick already claimed", "tick": tick}
    try:
        summary = body(rt, now)
    except Exception as exc:
        with unit_of_work(rt.engine) as conn:
            maintenance.finish_run(conn, run_id=run_id, summary={"error": f"{type(exc).__name__}: {exc}"[:1000]})
        raise
    with unit_of_work(rt.engine) as conn:
        maintenance.finish_run(conn, run_id=run_id, summary=summary)
    log.info("maintenance tick done", extra={"task": task, "tick": tick, **summary})
    return {"tick": tick, **summary}


def wake_all(wake: Callable[..., None], keys: list[tuple[str, str]], rt: Runtime) -> dict[str, int]:
    """Send one wake-up per key; a broker failure stops the round (the next tick sends them again)."""
    sent = 0
    for tenant_id, butler in keys:
        try:
            wake(tenant_id, butler, settings=rt.settings)
        except Unavailable as exc:
            log.warning("wake-ups not sent", extra={"lost": len(keys) - sent, "error": exc.message})
            break
        sent += 1
    return {"keys": len(keys), "woken": sent}


def _consolidate_all(rt: Runtime, now: datetime) -> dict[str, Any]:
    with unit_of_work(rt.engine) as conn:
        keys = stats.backlog_keys(conn, now=now, min_eligible=1)
    return wake_all(wake_consolidate, keys, rt)


def _backlog_trigger(rt: Runtime, now: datetime) -> dict[str, Any]:
    # Fresh episodes were woken by ingest; this catches bursts over one batch and failed episodes whose retry is due.
    with unit_of_work(rt.engine) as conn:
        keys = stats.backlog_keys(conn, now=now, min_eligible=rt.settings.consolidation.batch_size, retries_due=True)
    return wake_all(wake_consolidate, keys, rt)


def _redelivery_sweep(rt: Runtime, now: datetime) -> dict[str, Any]:
    with unit_of_work(rt.engine) as conn:
        intents = intake.stale_pending_keys(conn, older_than=now - STALE_INTENT)
        stuck = stats.backlog_keys(conn, now=now, min_eligible=None, pending_before=now - STUCK_PENDING)
    applied = wake_all(wake_apply, intents, rt)
    consolidated = wake_all(wake_consolidate, stuck, rt)
    return {
        "intent_keys": applied["keys"],
        "apply_woken": applied["woken"],
        "stuck_keys": consolidated["keys"],
        "consolidate_woken": consolidated["woken"],
    }


@app.task(name=CONSOLIDATE_ALL, bind=True)
def consolidate_all(self: Any, tick: str | None = None) -> dict[str, Any]:
    """Wake consolidation for every key with eligible episodes (the seed's 6-hourly pass)."""
    return run_ticked(CONSOLIDATE_ALL, self.request, tick, _consolidate_all)


@app.task(name=DECAY_SWEEP, bind=True, soft_time_limit=SWEEP_SOFT_LIMIT_S, time_limit=SWEEP_HARD_LIMIT_S)
def decay_sweep(self: Any, tick: str | None = None) -> dict[str, Any]:
    """Move decayed facts and rules to fading/expired and invert harmful rules, once per tick."""
    return run_ticked(
        DECAY_SWEEP,
        self.request,
        tick,
        lambda rt, now: maintenance.decay_sweep(rt.engine, now=now, settings=rt.settings),
    )


@app.task(name=EPISODE_CLEANUP, bind=True, soft_time_limit=SWEEP_SOFT_LIMIT_S, time_limit=SWEEP_HARD_LIMIT_S)
def episode_cleanup(self: Any, tick: str | None = None) -> dict[str, Any]:
    """Delete expired episodes and enforce max_entries (consolidated ones only), once per tick."""
    return run_ticked(
        EPISODE_CLEANUP,
        self.request,
        tick,
        lambda rt, now: maintenance.episode_cleanup(rt.engine, now=now, settings=rt.settings),
    )


@app.task(name=EVENT_PARTITIONS, bind=True)
def event_partitions(self: Any, tick: str | None = None) -> dict[str, Any]:
    """Create memory_events' partitions ahead and drop the months past their retention, once per tick."""
    return run_ticked(
        EVENT_PARTITIONS,
        self.request,
        tick,
        lambda rt, now: maintenance.event_partitions(rt.engine, now=now, settings=rt.settings),
    )


@app.task(name=BACKLOG_TRIGGER, bind=True)
def backlog_trigger(self: Any, tick: str | None = None) -> dict[str, Any]:
    """Wake consolidation where a burst or a due retry waits, once per tick."""
    return run_ticked(BACKLOG_TRIGGER, self.request, tick, _backlog_trigger)


@app.task(name=REDELIVERY_SWEEP, bind=True)
def redelivery_sweep(self: Any, tick: str | None = None) -> dict[str, Any]:
    """Re-send lost wake-ups: stale pending intents (apply) and long-pending episodes (consolidate)."""
    return run_ticked(REDELIVERY_SWEEP, self.request, tick, _redelivery_sweep)
