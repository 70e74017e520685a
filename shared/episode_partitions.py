"""The episode cleanup's partition path (migration 0018): a month of episodes goes whole once the expiry cleanup
would delete every row of it.

A month qualifies when it is over (no accept lands in it any more) and each of its episodes is past its TTL and is
not a dead letter still waiting for a redrive (the same rule the row-by-row cleanup applies, ``DELETABLE``). It then
goes in three steps, each in its own short transaction, resumable where it stopped:

1. **Detach.** Under an EXCLUSIVE lock on the month (writes to that month wait, reads go on) the rule is checked
   again, and the month is detached from ``episodes`` and renamed ``episodes_expired_pYYYY_MM``. The detach holds
   ``episodes`` ACCESS EXCLUSIVE for a catalog change only, waiting at most the lock timeout for it.
2. **References.** Detached, its episodes no longer exist for any read or write; their references are cleaned
   in batches as the delete trigger would (vectors and postings deleted, facts' and rules' sources set NULL), with
   the same ``episodes.cleaned`` event per tenant as the row-by-row cleanup (and the month's name).
3. **Drop** of the emptied table: its files go at once, nothing left for VACUUM, no HNSW or GIN entry to remove.

A detached month found at the start of a run (the last one stopped between the steps) is finished first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from shared import partitions
from shared.db import sqlstate

log = logging.getLogger(__name__)
T = TypeVar("T")

# The expiry cleanup's rule for one episode (shared/maintenance.py's EXPIRED_SQL uses the same text): past its TTL,
# and a dead letter only once it was accepted before ``dead_before`` (it waits for a redrive or a drop until then).
DELETABLE = "expires_at < :now AND (consolidation_status <> 'dead_letter' OR created_at < :dead_before)"
DETACHED_PREFIX = "episodes_expired_p"
DETACHED_RE = re.compile(r"^episodes_expired_p\d{4}_\d{2}$")
# The statement a writer would wait behind (a lock on the month, then on episodes) waits at most this long.
LOCK_TIMEOUT = partitions.LOCK_TIMEOUT

# One batch of a detached month: its rows leave the table (so a stopped run resumes exactly), their references go
# as the episodes_references_delete trigger would take them, and one event per tenant records the count.
CLEAN_BATCH_SQL = """
WITH gone AS (
    DELETE FROM "{table}" WHERE ctid = ANY(ARRAY(SELECT ctid FROM "{table}" LIMIT :batch))
    RETURNING tenant_id, id),
vectors AS (DELETE FROM episode_vectors x USING gone g WHERE x.episode_id = g.id RETURNING 1),
terms AS (DELETE FROM episode_terms x USING gone g WHERE x.episode_id = g.id RETURNING 1),
facts AS (UPDATE facts x SET source_episode_id = NULL FROM gone g
          WHERE x.source_episode_id = g.id AND x.tenant_id = g.tenant_id RETURNING 1),
rules AS (UPDATE rules x SET source_episode_id = NULL FROM gone g
          WHERE x.source_episode_id = g.id AND x.tenant_id = g.tenant_id RETURNING 1),
events AS (
    INSERT INTO memory_events (tenant_id, event_type, entity_type, actor, payload)
    SELECT tenant_id, 'episodes.cleaned', 'episode', :actor,
           jsonb_build_object('count', count(*), 'reason', 'expired', 'partition', CAST(:month AS text))
    FROM gone GROUP BY tenant_id RETURNING 1)
SELECT count(*) FROM gone"""


def ended_months(names: list[str], *, now: datetime) -> list[str]:
    """The monthly episode partitions whose month is over at ``now``, oldest first (never the DEFAULT one)."""
    months = sorted((m, n) for n in names if (m := partitions.partition_month(n, partitions.EPISODES)) is not None)
    return [name for month, name in months if partitions.add_months(month, 1) <= now]


def detached_name(name: str) -> str:
    """``episodes_pYYYY_MM`` -> ``episodes_expired_pYYYY_MM``."""
    return DETACHED_PREFIX + name.removeprefix("episodes_p")


def month_name(detached_table: str) -> str:
    """``episodes_expired_pYYYY_MM`` -> ``episodes_pYYYY_MM`` (the inverse of :func:`detached_name`)."""
    return "episodes_p" + detached_table.removeprefix(DETACHED_PREFIX)


def all_deletable(conn: Connection, *, name: str, now: datetime, dead_before: datetime) -> bool:
    """True when the expiry cleanup would delete every episode of partition ``name`` (an empty month included)."""
    return bool(
        conn.execute(
            text(f'SELECT NOT EXISTS (SELECT 1 FROM "{name}" WHERE NOT ({DELETABLE}))'),
            {"now": now, "dead_before": dead_before},
        ).scalar_one()
    )


def detach_month(conn: Connection, *, name: str, now: datetime, dead_before: datetime) -> str | None:
    """Detach month ``name`` if, under its lock, every episode is still deletable; the detached table's name."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    # EXCLUSIVE: an insert into this month, a status change (a dead letter) or a source check waits; reads go on.
    conn.execute(text(f'LOCK TABLE "{name}" IN EXCLUSIVE MODE'))
    if not all_deletable(conn, name=name, now=now, dead_before=dead_before):
        return None
    target = detached_name(name)
    conn.execute(text(f'ALTER TABLE {partitions.EPISODES.parent} DETACH PARTITION "{name}"'))
    conn.execute(text(f'ALTER TABLE "{name}" RENAME TO "{target}"'))
    return target


def clean_batch(conn: Connection, *, table: str, batch: int, actor: str) -> int:
    """Take up to ``batch`` episodes out of a detached month with their references; returns how many."""
    if not DETACHED_RE.match(table):
        raise ValueError(f"not a detached episodes month: {table!r}")
    month = month_name(table)
    return int(
        conn.execute(
            text(CLEAN_BATCH_SQL.format(table=table)), {"batch": batch, "actor": actor, "month": month}
        ).scalar_one()
    )


def detached(conn: Connection) -> list[str]:
    """Detached months still to finish (a run stopped between detach and drop)."""
    names: list[str] = list(
        conn.execute(
            text("SELECT relname FROM pg_class WHERE relname LIKE 'episodes\\_expired\\_p%' AND relkind = 'r'")
        ).scalars()
    )
    return sorted(n for n in names if DETACHED_RE.match(n))


def _unless_locked_out(step: Callable[[], T], *, name: str, outcome: dict[str, Any], retry: str) -> T | None:
    """``step()``; None if it ran into a lock timeout, or a deadlock with a writer that touched the month meanwhile
    (logged with ``retry`` and noted in ``outcome``: the next run tries again)."""
    try:
        return step()
    except DBAPIError as exc:
        if sqlstate(exc) not in {"55P03", "40P01"}:
            raise
        log.warning(retry, extra={"partition": name})
        outcome["lock_timeouts"].append(name)
        return None


def drop_expired_months(
    engine: Engine, *, now: datetime, dead_before: datetime, batch: int, actor: str
) -> dict[str, Any]:
    """Every month all of whose episodes are past the TTL goes whole: detached, references cleaned, dropped."""
    outcome: dict[str, Any] = {"months": [], "rows": 0, "lock_timeouts": []}
    with engine.connect() as conn:
        todo = detached(conn)
        candidates = [
            n
            for n in ended_months(partitions.existing(conn, partitions.EPISODES), now=now)
            if all_deletable(conn, name=n, now=now, dead_before=dead_before)
        ]

    def detach(name: str) -> str | None:
        with engine.begin() as conn:
            return detach_month(conn, name=name, now=now, dead_before=dead_before)

    for name in candidates:
        target = _unless_locked_out(
            partial(detach, name),
            name=name,
            outcome=outcome,
            retry="episodes month not detached (lock); the next run retries",
        )
        if target is not None:
            todo.append(target)
    for table in todo:
        rows = _unless_locked_out(
            partial(_finish, engine, table=table, batch=batch, actor=actor),
            name=table,
            outcome=outcome,
            retry="detached episodes month left for the next run",
        )
        if rows is not None:
            outcome["rows"] += rows
            outcome["months"].append(month_name(table))
    return outcome


def _finish(engine: Engine, *, table: str, batch: int, actor: str) -> int:
    """Clean a detached month's references batch by batch, then drop it; returns its rows."""
    rows = 0
    while True:
        with engine.begin() as conn:
            n = clean_batch(conn, table=table, batch=batch, actor=actor)
        rows += n
        if n < batch:
            break
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        conn.execute(text(f'DROP TABLE "{table}"'))
    return rows
