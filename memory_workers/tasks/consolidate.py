"""``memory.consolidate``: turn one shard key's due episodes into facts, rules and links, batch by batch.

Per batch: read the due episodes and the known memory (a short transaction), run the extractor outside any
transaction, embed every new text in one call, then apply it all in one transaction that first re-checks the
batch (:func:`shared.consolidation.apply_run`). The run holds the key's session advisory lock throughout, so
at most one consolidation of a key runs anywhere, two runs of a key never overlap in time, and an extractor
that takes minutes (an LLM) never keeps a transaction open.

If a batch fails (the extractor raised, its answer broke the schema, or the database refused a write), each of
its episodes is extracted alone: a poison episode fails by itself (failed with a retry time, later dead_letter)
and the rest of the key proceeds.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import Engine

from memory_workers.app import CONSOLIDATE_TASK, app, soft_time_limit
from memory_workers.enqueue import recheck_busy, wake_consolidate
from memory_workers.tasks import Embedder, KeyRunSummary, runtime, worker_name
from shared import telemetry, tracing
from shared.config import Settings
from shared.consolidation import (
    Failure,
    RunContext,
    StaleBatch,
    apply_run,
    describe_error,
    fetch_batch,
    has_due,
    key_lock,
)
from shared.consolidation_plan import Batch, DueEpisode, Plan, plan_extraction
from shared.db import unit_of_work
from shared.errors import Unavailable
from shared.extraction import Extractor
from shared.protection import protect_plan

log = logging.getLogger(__name__)

# Batches per task run; then the task re-enqueues itself so one busy key cannot hold a shard queue's worker.
MAX_BATCHES_PER_TASK = 20
# Share of the soft time limit a run spends before it stops taking batches (and isolating failed ones).
BUDGET_SHARE = 0.6
TIMED_OUT = "SoftTimeLimitExceeded: the consolidation ran past the task's soft time limit (a hanging extractor?)"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


@app.task(name=CONSOLIDATE_TASK, bind=True)
def consolidate(self: Any, tenant_id: str, butler: str) -> dict[str, Any]:
    """Consolidate the key's due episodes; re-enqueue itself while some remain."""
    rt = runtime()
    summary = consolidate_key(
        rt.engine,
        extractor=rt.extractor,
        embedder=rt.embedder,
        settings=rt.settings,
        tenant_id=tenant_id,
        butler=butler,
        worker=worker_name(self.request.hostname),
    )
    log.info("consolidated", extra={"tenant_id": tenant_id, "butler": butler, **summary.as_dict()})
    try:
        if summary.more:
            wake_consolidate(tenant_id, butler, settings=rt.settings)
        elif summary.busy:  # the holder re-checks when it lets go, unless it died holding the key
            recheck_busy(tenant_id, butler, task_name=CONSOLIDATE_TASK, settings=rt.settings)
    except Unavailable as exc:  # the backlog sweep wakes the key again
        log.warning("wake-up not sent", extra={"tenant_id": tenant_id, "butler": butler, "error": exc.message})
    return summary.as_dict()


def consolidate_key(
    engine: Engine,
    *,
    extractor: Extractor,
    embedder: Embedder,
    settings: Settings,
    tenant_id: str,
    butler: str,
    worker: str,
    max_batches: int = MAX_BATCHES_PER_TASK,
    budget_s: float | None = None,
    clock: Callable[[], datetime] = _utcnow,
    jitter: Callable[[], float] = random.random,
) -> KeyRunSummary:
    """Consolidate batches of the key while any is due, within ``max_batches`` and ``budget_s`` seconds."""
    if budget_s is None:
        budget_s = soft_time_limit(settings.workers.task_time_limit_seconds) * BUDGET_SHARE
    runner = _Runner(engine, extractor, embedder, settings, worker, clock, jitter, time.monotonic() + budget_s)
    summary = KeyRunSummary()
    with key_lock(engine, tenant_id=tenant_id, butler=butler) as held:
        if not held:
            summary.busy = True
            return summary
        for _ in range(max_batches):
            with unit_of_work(engine) as conn:
                batch = fetch_batch(
                    conn,
                    tenant_id=tenant_id,
                    butler=butler,
                    limit=settings.consolidation.batch_size,
                    now=clock(),
                    max_tokens=settings.consolidation.batch_tokens,
                )
            if batch is None:
                break
            with tracing.span(
                "memory.consolidate_batch", tenant=tenant_id, butler=butler, episodes=len(batch.episodes)
            ):
                summary.counts.update({k: v for k, v in runner.run_batch(batch).items() if isinstance(v, int)})
            summary.batches += 1
            if time.monotonic() > runner.deadline:
                break
    # Checked after the lock is released: a wake-up refused while this run held the key is not lost.
    with unit_of_work(engine) as conn:
        summary.more = has_due(conn, tenant_id=tenant_id, butler=butler, now=clock())
    return summary


@dataclass(frozen=True)
class _Runner:
    engine: Engine
    extractor: Extractor
    embedder: Embedder
    settings: Settings
    worker: str
    clock: Callable[[], datetime]
    jitter: Callable[[], float]
    deadline: float

    def run_batch(self, batch: Batch) -> dict[str, Any]:
        """Extract and apply the whole batch; if anything fails, extract its episodes one at a time.

        A run stopped by the task's soft time limit (a hanging extractor) still counts as an attempt of the
        batch's episodes, so they back off and end in dead_letter instead of looping forever."""
        started, outcome = time.perf_counter(), "error"
        try:
            result = self._run_batch(batch)
            outcome = "stale" if result.get("stale") else "isolated" if result.get("isolated") else "ok"
            return result
        except SoftTimeLimitExceeded:
            outcome = "timed_out"
            self._count_timeout(batch)
            raise
        finally:
            telemetry.CONSOLIDATION_SECONDS.labels(outcome).observe(time.perf_counter() - started)

    def _count_timeout(self, batch: Batch) -> None:
        failures = [Failure(e.id, TIMED_OUT) for e in batch.active]
        try:
            self._apply(batch, [], failures, isolate=True)
        except StaleBatch:
            pass
        except Exception:  # noqa: BLE001 - the time limit is what the caller must see; this is best effort
            log.warning(
                "could not record the timed-out attempt",
                exc_info=True,
                extra={"tenant_id": batch.tenant_id, "butler": batch.butler},
            )

    def _run_batch(self, batch: Batch) -> dict[str, Any]:
        active = batch.active
        try:
            plans = [self._plan(batch, active, group="batch")] if active else []
            return self._apply(batch, plans, [], isolate=False)
        except StaleBatch:
            return {"stale": 1}
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the batch is isolated below
            log.warning(
                "consolidation batch failed; isolating its episodes",
                extra={
                    "tenant_id": batch.tenant_id,
                    "butler": batch.butler,
                    "episodes": len(batch.episodes),
                    "idempotency_key": batch.idempotency_key,
                    "error": describe_error(exc),
                },
            )
            plans, failures = self._isolate(batch, active, describe_error(exc))
        try:
            return {**self._apply(batch, plans, failures, isolate=True), "isolated": 1}
        except StaleBatch:
            return {"stale": 1}

    def _isolate(self, batch: Batch, active: Sequence[DueEpisode], error: str) -> tuple[list[Plan], list[Failure]]:
        """One extraction per episode; a lone episode's batch error is already its own."""
        plans: list[Plan] = []
        failures: list[Failure] = []
        for episode in active:
            if len(active) == 1:
                failures.append(Failure(episode.id, error))
            elif time.monotonic() > self.deadline:
                failures.append(Failure(episode.id, f"not retried alone before the time budget ran out; {error}"))
            else:
                try:
                    plans.append(self._plan(batch, [episode], group=str(episode.id)))
                except SoftTimeLimitExceeded:
                    raise
                except Exception as exc:  # noqa: BLE001 - this episode is the poison
                    failures.append(Failure(episode.id, describe_error(exc)))
        return plans, failures

    def _plan(self, batch: Batch, chosen: Sequence[DueEpisode], *, group: str) -> Plan:
        started, outcome = time.perf_counter(), "error"
        try:
            extraction = self.extractor.extract(batch.request(chosen))
            outcome = "ok"
        finally:
            telemetry.EXTRACTOR_SECONDS.labels(self.extractor.name, outcome).observe(time.perf_counter() - started)
        plan = plan_extraction(
            extraction,
            batch=batch,
            episode_ids=[e.id for e in chosen],
            group=group,
            extractor=self.extractor.name,
            global_predicates=self.settings.consolidation.global_predicates,
        )
        # What an extractor writes is redacted (and sealed) as a caller's write is, before it is embedded.
        return protect_plan(
            plan, tenant_id=batch.tenant_id, redaction=self.settings.redaction, encryption=self.settings.encryption
        )

    def _apply(self, batch: Batch, plans: list[Plan], failures: list[Failure], *, isolate: bool) -> dict[str, Any]:
        texts = [t for plan in plans for t in plan.texts()]
        # One model call for everything the batch creates.
        vectors = self.embedder.embed(texts) if texts else np.zeros((0, 384), dtype=np.float32)
        ctx = RunContext(
            settings=self.settings,
            worker=self.worker,
            extractor=self.extractor.name,
            embedding=self.embedder.version,
            now=self.clock(),
            jitter=self.jitter,
        )
        with unit_of_work(self.engine) as conn:
            return apply_run(
                conn, batch=batch, plans=plans, vectors=vectors, failures=failures, ctx=ctx, isolate=isolate
            )
