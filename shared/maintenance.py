"""Daily sweeps, set-based: confidence decay (facts, rules), anti-pattern inversion and episode cleanup.

Each batch is one SQL statement whose data-modifying CTEs change the rows and append their
memory_events together, so a change without its audit row cannot commit. Functions taking a
Connection never commit; the looping entry points run each batch in its own short transaction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from shared import episode_partitions, partitions, receipts
from shared.config import FactSettings, RuleSettings, Settings
from shared.db import sqlstate
from shared.lifecycle import (
    ANTI_PATTERN_BODY_CHARS,
    ANTI_PATTERN_PREFIX,
    ANTI_PATTERN_REASONS_CHARS,
    DEFAULT_HARM_REASON,
    RULE_MAX_CHARS,
    check_transition,
)
from shared.scoring import effective_confidence_sql

log = logging.getLogger(__name__)

# Evidence (tests/bench/bench_decay.py; embedded PostgreSQL 18 on 2 cores shared with other work, every schema
# index incl. HNSW, ~11% of rows changing band). One batch, interleaved 5x and rolled back, at 200k facts:
# 1,000 -> 84 us/row, 5,000 -> 66 us/row (0.33 s a batch), 20,000 -> 94 us/row, because near ~10% of the
# table the planner swaps the per-id index probes for a hash join over a seq scan of facts, every batch.
# Whole first sweep of 1M facts: 98 s at 5,000, 129 s at 1,000; a re-run with nothing to change: 11 s.
# Profiled (EXPLAIN ANALYZE BUFFERS, 200k facts, issue 17 §4): ~75% of a batch was HNSW inserts of the rows it
# changed (~465 buffer hits each); migration 0016 keeps expired/superseded/retracted rows out of that index, and
# the UPDATE now reaches its rows by tuple id (5,000 buffer hits a batch instead of 20,000). Size kept at 5,000.
DECAY_BATCH = 5_000
# Evidence (bench_decay.py --facts 0 --episodes 200000; 10 tenants, 50k expired, 40k over capacity): 45 s at
# 1,000, 8.2 s at 5,000, 5.5 s at 20,000 — each capacity batch re-counts and re-ranks every episode, so fewer,
# larger batches win; the rows it locks are expired or old consolidated ones that no writer touches.
CLEANUP_BATCH = 20_000
NIL_ID = uuid.UUID(int=0)
SWEEP_ACTOR = "decay_sweep"
CLEANUP_ACTOR = "episode_cleanup"
# A batch that deadlocks with a writer (who locked two of its rows in the other order) is simply run again.
DEADLOCK_RETRIES = 3

Kind = Literal["fact", "rule"]
T = TypeVar("T")

# Every state change a sweep makes; rule validity follows the fact validity machine (as writes.confirm does).
SWEEP_TRANSITIONS: tuple[tuple[str, str, str], ...] = (
    ("fact", "active", "fading"),
    ("fact", "active", "expired"),
    ("fact", "fading", "expired"),
    ("rule", "candidate", "anti_pattern"),
    ("rule", "established", "anti_pattern"),
    ("rule", "proven", "anti_pattern"),
)
for _machine, _from, _to in SWEEP_TRANSITIONS:  # fail at import, not at 3 a.m., if the tables change
    check_transition(_machine, _from, _to)

DECAYS = "({eff} < :expiry OR ({t}.validity = 'active' AND {eff} < :retrieval))"
NEW_VALIDITY = (
    "CASE WHEN {eff} < :expiry THEN 'expired' WHEN {t}.validity = 'active' AND {eff} < :retrieval "
    "THEN 'fading' ELSE {t}.validity END"
)
# The page carries each row's tuple id: the UPDATE goes straight to the version the page read (a TID scan) instead
# of a second primary-key descent per row. A row a writer changed meanwhile no longer has that tuple id and is
# skipped (left to the next sweep), never overwritten.
PAGE = """page AS (
    SELECT ctid AS tid, id, validity{extra} FROM {table}
    WHERE id > CAST(:after_id AS uuid) AND validity IN ('active', 'fading') ORDER BY id LIMIT :batch)"""
TAIL = """
SELECT (SELECT id FROM page ORDER BY id DESC LIMIT 1) AS last_id, (SELECT count(*) FROM page) AS scanned,
       (SELECT coalesce(jsonb_object_agg(event_type, n), '{{}}') FROM
           (SELECT event_type, count(*) AS n FROM events GROUP BY event_type) c) AS changes"""

FACT_SQL = (
    "WITH "
    + PAGE.format(table="facts", extra="")
    + """,
changed AS (
    UPDATE facts f SET validity = {new_validity}
    FROM page p WHERE f.ctid = p.tid AND f.validity IN ('active', 'fading') AND {decays}
    RETURNING f.id, f.tenant_id, p.validity AS from_state, f.validity AS to_state, {eff_f} AS eff),
events AS (
    INSERT INTO memory_events (tenant_id, event_type, entity_type, entity_id, actor, payload)
    SELECT tenant_id, 'fact.' || to_state, 'fact', id, :actor, jsonb_build_object(
        'from', from_state, 'to', to_state, 'effective_confidence', round(eff::numeric, 6))
    FROM changed RETURNING event_type)"""
    + TAIL
)

# The SQL twin of shared.lifecycle.anti_pattern_content: strip, drop trailing dots, lower a capitalised
# first word, cut to the body bound, then the newest trimmed harmful reasons that fit the reasons budget joined
# with "; " (oldest first), or the default. Bounded like the Python function, so the result always fits the column.
_WS = "E' \\t\\n\\r\\f\\v'"
_BODY = f"rtrim(rtrim(btrim(f.content, {_WS}), '.'), {_WS})"
_REASON = f"left(btrim(a.reason, {_WS}), {ANTI_PATTERN_REASONS_CHARS})"
ANTI_PATTERN_SQL = f"""CASE WHEN upper(btrim(f.content, {_WS})) LIKE '{ANTI_PATTERN_PREFIX}%'
    THEN left(btrim(f.content, {_WS}), {RULE_MAX_CHARS})
    ELSE '{ANTI_PATTERN_PREFIX} Do NOT ' || (SELECT left(CASE
            WHEN length(b) >= 2 AND substr(b, 2, 1) <> upper(substr(b, 2, 1)) THEN lower(left(b, 1)) || substr(b, 2)
            ELSE b END, {ANTI_PATTERN_BODY_CHARS}) FROM (SELECT {_BODY} AS b) body)
        || '. This caused problems because: ' || coalesce((
            SELECT string_agg(r, '; ' ORDER BY occurred_at, id) FROM (
                SELECT {_REASON} AS r, a.occurred_at, a.id,
                       sum(length({_REASON}) + 2) OVER (ORDER BY a.occurred_at DESC, a.id DESC) AS used
                FROM rule_applications a
                WHERE a.rule_id = f.id AND a.outcome = 'harmful' AND btrim(a.reason, {_WS}) <> '') reasons
            WHERE used <= {ANTI_PATTERN_REASONS_CHARS + 2}),
            '{DEFAULT_HARM_REASON}') END"""
INVERTS = (
    "(f.harmful_count >= :min_harmful AND f.effectiveness_score < :max_effectiveness AND f.maturity <> 'anti_pattern')"
)

RULE_SQL = (
    "WITH "
    + PAGE.format(table="rules", extra=", maturity")
    + """,
changed AS (
    UPDATE rules f SET validity = {new_validity},
        maturity = CASE WHEN {inverts} THEN 'anti_pattern' ELSE f.maturity END,
        content = CASE WHEN {inverts} THEN {anti} ELSE f.content END,
        content_tokens = CASE WHEN {inverts} THEN NULL ELSE f.content_tokens END,  -- counted when read
        metadata = CASE WHEN {inverts} THEN f.metadata || jsonb_build_object('original_content', f.content)
                   ELSE f.metadata END
    FROM page p WHERE f.ctid = p.tid AND f.validity IN ('active', 'fading') AND ({decays} OR {inverts})
    RETURNING f.id, f.tenant_id, p.validity AS from_state, f.validity AS to_state, p.maturity AS from_maturity,
              f.maturity AS to_maturity, f.content, {eff_f} AS eff),
events AS (
    INSERT INTO memory_events (tenant_id, event_type, entity_type, entity_id, actor, payload)
    SELECT c.tenant_id, e.event_type, 'rule', c.id, :actor, e.payload FROM changed c CROSS JOIN LATERAL (VALUES
        (CASE WHEN c.to_state <> c.from_state THEN 'rule.' || c.to_state END, jsonb_build_object(
            'from', c.from_state, 'to', c.to_state, 'effective_confidence', round(c.eff::numeric, 6))),
        (CASE WHEN c.to_maturity <> c.from_maturity THEN 'rule.inverted' END, jsonb_build_object(
            'from', c.from_maturity, 'to', c.to_maturity, 'content', c.content))
    ) AS e(event_type, payload) WHERE e.event_type IS NOT NULL
    RETURNING event_type)"""
    + TAIL
)


def _render(template: str, **extra: str) -> str:
    eff_f = effective_confidence_sql("f")
    return template.format(
        new_validity=NEW_VALIDITY.format(eff=eff_f, t="f"), decays=DECAYS.format(eff=eff_f, t="f"), eff_f=eff_f, **extra
    )


DECAY_STATEMENTS: dict[str, str] = {
    "fact": _render(FACT_SQL),
    "rule": _render(RULE_SQL, inverts=INVERTS, anti=ANTI_PATTERN_SQL),
}


def decay_sweep_batch(
    conn: Connection,
    *,
    kind: Kind = "fact",
    after_id: uuid.UUID | None,
    batch: int,
    now: datetime,
    facts_cfg: FactSettings,
    rules_cfg: RuleSettings,
) -> tuple[uuid.UUID | None, dict[str, int]]:
    """One statement: the next ``batch`` live rows after ``after_id`` move to their band, each with its event."""
    harm = rules_cfg.harmful_to_antipattern
    # A batch lost in a crash is lost with its events (one transaction) and redone by the next run: no need to
    # wait for the WAL flush at each of a million-row sweep's hundreds of commits.
    conn.execute(text("SET LOCAL synchronous_commit = off"))
    row = conn.execute(
        text(DECAY_STATEMENTS[kind]),
        {
            "after_id": str(after_id or NIL_ID),
            "batch": batch,
            "now": now,
            "actor": SWEEP_ACTOR,
            "retrieval": facts_cfg.retrieval_confidence_threshold,
            "expiry": facts_cfg.expiry_confidence_threshold,
            "min_harmful": harm.min_harmful,
            "max_effectiveness": harm.max_effectiveness,
        },
    ).one()
    summary = {f"{kind}s_scanned": row.scanned, **row.changes}
    return row.last_id, summary


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for a named sweep (blake2b, never hash())."""
    return int.from_bytes(hashlib.blake2b(f"memory_butler:{name}".encode(), digest_size=8).digest(), "big", signed=True)


@contextmanager
def exclusive(engine: Engine, name: str) -> Iterator[bool]:
    """Hold a session advisory lock for the block; yields False at once if another process holds it."""
    with engine.connect() as conn:
        got: bool = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(name)}).scalar_one()
        conn.commit()
        try:
            yield bool(got)
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key(name)})
                conn.commit()


def in_transaction(engine: Engine, step: Callable[[Connection], T]) -> T:
    """``step(conn)`` in a transaction of its own, re-run (bounded) if PostgreSQL chose it as a deadlock victim."""
    retrying = Retrying(
        retry=retry_if_exception(lambda exc: isinstance(exc, DBAPIError) and sqlstate(exc) == "40P01"),
        stop=stop_after_attempt(DEADLOCK_RETRIES),
        reraise=True,
        before_sleep=lambda state: log.warning(
            "sweep batch deadlocked; running it again", extra={"attempt": state.attempt_number}
        ),
    )
    for attempt in retrying:
        with attempt, engine.begin() as conn:
            return step(conn)
    raise AssertionError("unreachable")


class _Progress:
    """Logs at most every ``every`` seconds so a million-row sweep writes a handful of lines."""

    def __init__(self, name: str, every: float = 10.0) -> None:
        self.name, self.every, self.started = name, every, time.monotonic()
        self.last = self.started

    def tick(self, totals: Counter[str]) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s progress", self.name, extra=dict(totals))

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 3)


def decay_sweep(engine: Engine, *, now: datetime, settings: Settings, batch: int = DECAY_BATCH) -> dict[str, Any]:
    """Classify every live fact and rule once, a batch per transaction; a concurrent second run is skipped."""
    with exclusive(engine, "decay_sweep") as got:
        if not got:
            return {"skipped": "already running"}
        totals: Counter[str] = Counter()
        progress = _Progress("decay_sweep")
        for kind in ("fact", "rule"):
            after: uuid.UUID | None = None
            while True:
                after, summary = in_transaction(
                    engine,
                    partial(
                        decay_sweep_batch,
                        kind=kind,
                        after_id=after,
                        batch=batch,
                        now=now,
                        facts_cfg=settings.memory.facts,
                        rules_cfg=settings.memory.rules,
                    ),
                )
                totals.update({**summary, "batches": 1})
                progress.tick(totals)
                if summary[f"{kind}s_scanned"] < batch:  # a short page is the last one
                    break
        result = {**totals, "seconds": progress.elapsed()}
        log.info("decay_sweep done", extra=result)
        return result


# A dead-lettered episode is not deleted at its TTL: it waits for a redrive or a drop until dead_before. The victims
# carry the whole key (tenant, id, accept time): the delete reaches each row in its own month's partition.
EXPIRED_SQL = f"""
WITH victims AS (
    SELECT tenant_id, id, created_at FROM episodes WHERE {episode_partitions.DELETABLE}
    ORDER BY expires_at LIMIT :batch FOR UPDATE SKIP LOCKED),
deleted AS (DELETE FROM episodes e USING victims v
            WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at RETURNING e.tenant_id),
events AS (
    INSERT INTO memory_events (tenant_id, event_type, entity_type, actor, payload)
    SELECT tenant_id, 'episodes.cleaned', 'episode', :actor,
           jsonb_build_object('count', count(*), 'reason', 'expired')
    FROM deleted GROUP BY tenant_id RETURNING 1)
SELECT count(*) FROM deleted"""

# Only consolidated episodes are evicted for capacity, oldest first, just enough to bring each tenant's
# total down to max_entries; pending, failed and dead-letter episodes wait for their expiry.
CAPACITY_SQL = """
WITH over AS (
    SELECT tenant_id, count(*) - :max_entries AS excess FROM episodes
    GROUP BY tenant_id HAVING count(*) > :max_entries),
ranked AS (
    SELECT e.tenant_id, e.id, e.created_at, o.excess,
           row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.created_at, e.id) AS rn
    FROM episodes e JOIN over o USING (tenant_id) WHERE e.consolidation_status = 'consolidated'),
victims AS (
    SELECT tenant_id, id, created_at FROM episodes WHERE (tenant_id, id, created_at) IN (
        SELECT tenant_id, id, created_at FROM ranked WHERE rn <= excess ORDER BY rn LIMIT :batch)
    FOR UPDATE SKIP LOCKED),
deleted AS (DELETE FROM episodes e USING victims v
            WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at RETURNING e.tenant_id),
events AS (
    INSERT INTO memory_events (tenant_id, event_type, entity_type, actor, payload)
    SELECT tenant_id, 'episodes.cleaned', 'episode', :actor,
           jsonb_build_object('count', count(*), 'reason', 'capacity', 'max_entries', :max_entries)
    FROM deleted GROUP BY tenant_id RETURNING 1)
SELECT count(*) FROM deleted"""


# The outbox's retention: applied intents after intents_retention_days, dead-lettered ones (never applied) after
# dead_letters_retention_days. Their payload is the write's text; nothing else needs them once applied.
INTENTS_SQL = """
WITH victims AS (
    SELECT id FROM write_intents
    WHERE (status = 'applied' AND applied_at < :applied_before)
       OR (status = 'dead_letter' AND created_at < :dead_before)
    LIMIT :batch FOR UPDATE SKIP LOCKED),
deleted AS (DELETE FROM write_intents w USING victims v WHERE w.id = v.id RETURNING w.tenant_id, w.status),
events AS (
    INSERT INTO memory_events (tenant_id, event_type, entity_type, actor, payload)
    SELECT tenant_id, 'write_intents.cleaned', 'write_intent', :actor,
           jsonb_build_object('count', count(*), 'dead_letters', count(*) FILTER (WHERE status = 'dead_letter'))
    FROM deleted GROUP BY tenant_id RETURNING 1)
SELECT count(*) FROM deleted"""


def delete_expired_batch(conn: Connection, *, now: datetime, batch: int, dead_before: datetime) -> int:
    """Delete up to ``batch`` episodes whose expires_at has passed (a dead letter only once it was accepted before
    ``dead_before``); one event per tenant."""
    return conn.execute(
        text(EXPIRED_SQL), {"now": now, "batch": batch, "actor": CLEANUP_ACTOR, "dead_before": dead_before}
    ).scalar_one()


def delete_old_intents_batch(conn: Connection, *, applied_before: datetime, dead_before: datetime, batch: int) -> int:
    """Delete up to ``batch`` write intents applied before ``applied_before`` or dead-lettered and accepted
    before ``dead_before``; pending ones are never touched. One event per tenant."""
    return conn.execute(
        text(INTENTS_SQL),
        {"applied_before": applied_before, "dead_before": dead_before, "batch": batch, "actor": CLEANUP_ACTOR},
    ).scalar_one()


def evict_over_capacity_batch(conn: Connection, *, max_entries: int, batch: int) -> int:
    """Delete up to ``batch`` of the oldest consolidated episodes of tenants holding more than ``max_entries``."""
    return conn.execute(
        text(CAPACITY_SQL), {"max_entries": max_entries, "batch": batch, "actor": CLEANUP_ACTOR}
    ).scalar_one()


def _drain(engine: Engine, step: Callable[[Connection], int], *, batch: int) -> tuple[int, int]:
    """Run ``step(conn)`` in fresh transactions until it deletes less than a full batch; (rows, batches)."""
    rows = batches = 0
    while True:
        n = in_transaction(engine, step)
        rows, batches = rows + n, batches + 1
        if n < batch:
            return rows, batches


def episode_cleanup(engine: Engine, *, now: datetime, settings: Settings, batch: int = CLEANUP_BATCH) -> dict[str, Any]:
    """Expired episodes go (dead letters only after their own retention): a month all of which has expired as a
    partition, the rest row by row; then the oldest consolidated beyond max_entries, then write intents past their
    retention; unexpired unconsolidated episodes stay."""
    with exclusive(engine, "episode_cleanup") as got:
        if not got:
            return {"skipped": "already running"}
        started = time.monotonic()
        dead_before = now - timedelta(days=settings.schedule.dead_letters_retention_days)
        months = episode_partitions.drop_expired_months(
            engine, now=now, dead_before=dead_before, batch=batch, actor=CLEANUP_ACTOR
        )
        expired, b1 = _drain(
            engine, lambda c: delete_expired_batch(c, now=now, batch=batch, dead_before=dead_before), batch=batch
        )
        max_entries = settings.memory.episodes.max_entries
        evicted, b2 = _drain(
            engine, lambda c: evict_over_capacity_batch(c, max_entries=max_entries, batch=batch), batch=batch
        )
        applied_before = now - timedelta(days=settings.schedule.intents_retention_days)
        intents, b3 = _drain(
            engine,
            lambda c: delete_old_intents_batch(c, applied_before=applied_before, dead_before=dead_before, batch=batch),
            batch=batch,
        )
        with engine.begin() as conn:
            runs = conn.execute(
                text("DELETE FROM maintenance_runs WHERE started_at < CAST(:before AS timestamptz)"),
                {"before": now - timedelta(days=settings.schedule.runs_retention_days)},
            ).rowcount
            kept_for = timedelta(days=settings.api.feedback_key_retention_days)
            feedback_keys = receipts.prune(conn, before=now - kept_for)
        result = {
            "expired_months_dropped": months["months"],
            "expired_month_rows": months["rows"],
            "expired_month_lock_timeouts": months["lock_timeouts"],
            "expired_deleted": expired,
            "capacity_deleted": evicted,
            "intents_deleted": intents,
            "batches": b1 + b2 + b3,
            "maintenance_runs_deleted": runs,
            "feedback_receipts_deleted": feedback_keys,
            "seconds": round(time.monotonic() - started, 3),
        }
        log.info("episode_cleanup done", extra=result)
        return result


def event_partitions(engine: Engine, *, now: datetime, settings: Settings) -> dict[str, Any]:
    """memory_events' partitions: the coming months created, the months past the retention dropped whole."""
    with exclusive(engine, "event_partitions") as got:
        if not got:
            return {"skipped": "already running"}
        started = time.monotonic()
        result = {
            **partitions.maintain(engine, now=now, settings=settings),
            "seconds": round(time.monotonic() - started, 3),
        }
        # "created" is a LogRecord attribute: the months go under other names
        log.info("event_partitions done", extra={f"partitions_{k}": v for k, v in result.items()})
        return result


def claim_tick(conn: Connection, *, task: str, tick: str) -> int | None:
    """Insert the (task, tick) run row; None when another process claimed this tick first."""
    return conn.execute(
        text(
            "INSERT INTO maintenance_runs (task, tick) VALUES (:task, :tick) ON CONFLICT (task, tick) DO NOTHING "
            "RETURNING id"
        ),
        {"task": task, "tick": tick},
    ).scalar_one_or_none()


def finish_run(conn: Connection, *, run_id: int, summary: dict[str, Any]) -> None:
    """Record a claimed run's outcome for the dashboard."""
    conn.execute(
        text("UPDATE maintenance_runs SET finished_at = clock_timestamp(), summary = CAST(:s AS jsonb) WHERE id = :id"),
        {"id": run_id, "s": json.dumps(summary, default=str)},
    )
