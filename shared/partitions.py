"""Monthly partitions of memory_events (migration 0016, by ``occurred_at``) and episodes (0018, by ``created_at``):
created ahead; the events' months are dropped whole once past their retention (the episodes' months go by their
TTL, in shared/episode_partitions.py).

A partition is named ``<table>_pYYYY_MM`` and holds [the month's first instant, the next month's) in UTC;
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from shared.config import Settings
from shared.db import sqlstate

log = logging.getLogger(__name__)
T = TypeVar("T")

# DDL on the parent waits at most this long for its lock: behind it, every insert into the table would queue.
LOCK_TIMEOUT = "5s"


@dataclass(frozen=True)
class Partitioned:
    """A table partitioned by month on ``key``; ``like`` is what a month's table copies from it before attaching."""

    parent: str
    key: str
    like: str

    @property
    def default(self) -> str:
        return f"{self.parent}_default"

    @property
    def name_re(self) -> re.Pattern[str]:
        return re.compile(rf"^{self.parent}_p(\d{{4}})_(\d{{2}})$")


EVENTS = Partitioned("memory_events", "occurred_at", "INCLUDING DEFAULTS INCLUDING CONSTRAINTS")
# An episode's tsvectors are generated columns and its vector is stored PLAIN (0017): a month's table must match.
EPISODES = Partitioned(
    "episodes", "created_at", "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING STORAGE"
)


def month_start(t: datetime) -> datetime:
    """The first instant (UTC) of ``t``'s month."""
    t = t.astimezone(UTC)
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def add_months(month: datetime, n: int) -> datetime:
    """``month`` (a month start) moved by ``n`` months."""
    index = month.year * 12 + month.month - 1 + n
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def partition_name(month: datetime, table: Partitioned = EVENTS) -> str:
    return f"{table.parent}_p{month:%Y_%m}"


def partition_month(name: str, table: Partitioned = EVENTS) -> datetime | None:
    """The month a partition's name covers; None for any other table (the DEFAULT partition included)."""
    match = table.name_re.match(name)
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


def existing(conn: Connection, table: Partitioned = EVENTS) -> list[str]:
    """The names of ``table``'s partitions."""
    return list(
        conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST(:parent AS regclass) ORDER BY c.relname"
            ),
            {"parent": table.parent},
        ).scalars()
    )


def create_month(conn: Connection, *, month: datetime, table: Partitioned = EVENTS) -> str:
    """Create and attach ``month``'s partition; "created", or "blocked" when the DEFAULT partition holds its rows."""
    lower, upper = month, add_months(month, 1)
    bounds = {"lo": lower, "hi": upper}
    key = table.key
    if conn.execute(
        text(f"SELECT EXISTS (SELECT 1 FROM {table.default} WHERE {key} >= :lo AND {key} < :hi)"), bounds
    ).scalar_one():
        return "blocked"
    name = partition_name(month, table)
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    # Created apart then attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent (reads and inserts go on),
    # CREATE ... PARTITION OF would take ACCESS EXCLUSIVE. The partition gets the indexes, FKs and row triggers.
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE {table.parent} {table.like})'))
    literal = conn.execute(
        text("SELECT quote_literal(CAST(:lo AS timestamptz)), quote_literal(CAST(:hi AS timestamptz))"), bounds
    ).one()
    conn.execute(
        text(f'ALTER TABLE {table.parent} ATTACH PARTITION "{name}" FOR VALUES FROM ({literal[0]}) TO ({literal[1]})')
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
        log.warning("partition step timed out on its lock; the next run retries", extra={"partition": name})
        outcome["lock_timeouts"].append(name)
        return None


def create_ahead(
    engine: Engine, *, table: Partitioned, now: datetime, ahead: int, outcome: dict[str, list[str]]
) -> list[str]:
    """Create ``table``'s missing months from this one to ``ahead`` months on (noted in ``outcome``); returns
    the partitions that existed before."""
    with engine.connect() as conn:
        names = existing(conn, table)
    for month in months_ahead(now=now, ahead=ahead):
        name = partition_name(month, table)
        if name not in names:
            result = _step(engine, partial(create_month, month=month, table=table), outcome, name)
            if result:
                outcome[result].append(name)
    return names


def maintain(engine: Engine, *, now: datetime, settings: Settings) -> dict[str, Any]:
    """Create this month's and the next months' partitions of events and episodes, then drop the events' months
    past the retention (the episodes' months go with the episode cleanup, by TTL)."""
    s = settings.schedule
    outcome: dict[str, list[str]] = {"created": [], "blocked": [], "dropped": [], "lock_timeouts": []}
    names = create_ahead(engine, table=EVENTS, now=now, ahead=s.events_partitions_ahead_months, outcome=outcome)
    create_ahead(engine, table=EPISODES, now=now, ahead=s.episodes_partitions_ahead_months, outcome=outcome)
    dropped_rows = 0
    for name in expired(names, now=now, retention_days=s.events_retention_days):
        rows = _step(engine, partial(drop_partition, name=name), outcome, name)
        if rows is not None:
            outcome["dropped"].append(name)
            dropped_rows += rows
    if outcome["blocked"]:
        log.error(
            "a DEFAULT partition holds rows of a month to create; see docs/partitions.md",
            extra={"months": outcome["blocked"]},
        )
    return {**outcome, "dropped_rows_estimate": dropped_rows}
