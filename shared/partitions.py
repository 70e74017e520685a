"""memory_events' monthly partitions (migration 0016): created ahead, dropped whole once past the retention.

A partition is named ``memory_events_pYYYY_MM`` and holds [the month's first instant, the next month's) in UTC;
the name alone gives its bounds. Dropping a partition is the events' cleanup: no row-by-row DELETE (which the
append-only trigger refuses anyway), and a month goes only when every instant of it is older than the retention.
Rows that fell into the DEFAULT partition (a month nobody created in time) stay there: they are never dropped
and they block creating their month (reported, see docs/partitions.md). Each DDL runs in its own short
transaction with a lock timeout, so a long reader delays one month's step to the next run, never the writers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from shared.config import Settings
from shared.db import sqlstate

log = logging.getLogger(__name__)
T = TypeVar("T")

PARENT = "memory_events"
DEFAULT_PARTITION = "memory_events_default"
NAME_RE = re.compile(r"^memory_events_p(\d{4})_(\d{2})$")
# DDL on the parent waits at most this long for its lock: behind it, every insert of events would queue.
LOCK_TIMEOUT = "5s"


def month_start(t: datetime) -> datetime:
    """The first instant (UTC) of ``t``'s month."""
    t = t.astimezone(UTC)
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def add_months(month: datetime, n: int) -> datetime:
    """``month`` (a month start) moved by ``n`` months."""
    index = month.year * 12 + month.month - 1 + n
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def partition_name(month: datetime) -> str:
    return f"{PARENT}_p{month:%Y_%m}"


def partition_month(name: str) -> datetime | None:
    """The month a partition's name covers; None for any other table (the DEFAULT partition included)."""
    match = NAME_RE.match(name)
    return datetime(int(match[1]), int(match[2]), 1, tzinfo=UTC) if match else None


def months_ahead(*, now: datetime, ahead: int) -> list[datetime]:
    """The months that must exist: this one and the next ``ahead``."""
    first = month_start(now)
    return [add_months(first, i) for i in range(ahead + 1)]


def expired(names: list[str], *, now: datetime, retention_days: float) -> list[str]:
    """Partitions whose whole month is older than ``retention_days`` (0 keeps all), oldest first."""
    if retention_days <= 0:
        return []
    cutoff = now - timedelta(days=retention_days)
    months = sorted((m, n) for n in names if (m := partition_month(n)) is not None)
    return [name for month, name in months if add_months(month, 1) <= cutoff]


def existing(conn: Connection) -> list[str]:
    """The names of memory_events' partitions."""
    return list(
        conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST(:parent AS regclass) ORDER BY c.relname"
            ),
            {"parent": PARENT},
        ).scalars()
    )


def create_month(conn: Connection, *, month: datetime) -> str:
    """Create and attach ``month``'s partition; "created", or "blocked" when the DEFAULT partition holds its rows."""
    lower, upper = month, add_months(month, 1)
    bounds = {"lo": lower, "hi": upper}
    if conn.execute(
        text(f"SELECT EXISTS (SELECT 1 FROM {DEFAULT_PARTITION} WHERE occurred_at >= :lo AND occurred_at < :hi)"),
        bounds,
    ).scalar_one():
        return "blocked"
    name = partition_name(month)
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    # Created apart then attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent (reads and inserts go on),
    # CREATE ... PARTITION OF would take ACCESS EXCLUSIVE. The partition gets the indexes, FK and trigger.
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
    literal = conn.execute(
        text("SELECT quote_literal(CAST(:lo AS timestamptz)), quote_literal(CAST(:hi AS timestamptz))"), bounds
    ).one()
    conn.execute(
        text(f'ALTER TABLE {PARENT} ATTACH PARTITION "{name}" FOR VALUES FROM ({literal[0]}) TO ({literal[1]})')
    )
    return "created"


def drop_partition(conn: Connection, *, name: str) -> int:
    """Drop one partition whole (no row trigger fires); returns its estimated row count."""
    if partition_month(name) is None:
        raise ValueError(f"not a monthly memory_events partition: {name!r}")
    rows: int = conn.execute(
        text("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = CAST(:n AS regclass)"), {"n": name}
    ).scalar_one()
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    conn.execute(text(f'DROP TABLE "{name}"'))
    return int(rows)


def _step(engine: Engine, action: Callable[[Connection], T], outcome: dict[str, list[str]], name: str) -> T | None:
    """Run one DDL step in its own transaction; a lock timeout is recorded and left to the next run."""
    try:
        with engine.begin() as conn:
            return action(conn)
    except DBAPIError as exc:
        if sqlstate(exc) != "55P03":
            raise
        log.warning("event partition step timed out on its lock; the next run retries", extra={"partition": name})
        outcome["lock_timeouts"].append(name)
        return None


def maintain(engine: Engine, *, now: datetime, settings: Settings) -> dict[str, Any]:
    """Create this month's and the next months' partitions, then drop the months past the retention."""
    s = settings.schedule
    outcome: dict[str, list[str]] = {"created": [], "blocked": [], "dropped": [], "lock_timeouts": []}
    with engine.connect() as conn:
        names = existing(conn)
    dropped_rows = 0
    for month in months_ahead(now=now, ahead=s.events_partitions_ahead_months):
        name = partition_name(month)
        if name not in names:
            result = _step(engine, partial(create_month, month=month), outcome, name)
            if result:
                outcome[result].append(name)
    for name in expired(names, now=now, retention_days=s.events_retention_days):
        rows = _step(engine, partial(drop_partition, name=name), outcome, name)
        if rows is not None:
            outcome["dropped"].append(name)
            dropped_rows += rows
    if outcome["blocked"]:
        log.error(
            "the DEFAULT events partition holds rows of a month to create; see docs/partitions.md",
            extra={"months": outcome["blocked"]},
        )
    return {**outcome, "dropped_rows_estimate": dropped_rows}
