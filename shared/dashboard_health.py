"""The dashboard's health charts: memory_stats (the same numbers the tool answers, whose confidence bands are the
confidence chart) plus the rules' effectiveness histogram, and the newest-first activity feed. Read-only; functions
take a Connection and never commit.

No finer confidence histogram: it costs another pass over every fact (74 ms of a 230 ms page at 100k facts,
measured), and seed 000 asks for the bands."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, text

from shared.config import Settings
from shared.models import memory_events
from shared.reads import _about_scope
from shared.stats import stats

BINS = 10  # tenths of [0, 1]: fine enough to see a slope, few enough to read at a glance
SCOPED = "tenant_id = :t AND (CAST(:scope AS text) IS NULL OR scope IN ('global', CAST(:scope AS text)))"

# Rules with feedback only (no feedback = no evidence); anti-patterns are warnings, not advice, so left out.
# width_bucket puts exactly 1.0 in bucket BINS + 1; least() folds it into the top bin.
EFFECTIVENESS_SQL = f"""
SELECT least(width_bucket(effectiveness_score, 0, 1, {BINS}), {BINS}) AS bin, count(*) AS n
FROM rules WHERE validity IN ('active', 'fading') AND maturity <> 'anti_pattern'
  AND success_count + harmful_count > 0 AND {SCOPED} GROUP BY 1"""


def _histogram(conn: Connection, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    counts = {int(r["bin"]): int(r["n"]) for r in conn.execute(text(sql), params).mappings()}
    return [
        {"from": round((i - 1) / BINS, 2), "to": round(i / BINS, 2), "count": counts.get(i, 0)}
        for i in range(1, BINS + 1)
    ]


def health(conn: Connection, *, tenant_id: str, scope: str | None, now: datetime, settings: Settings) -> dict[str, Any]:
    """memory_stats for ``scope`` (None: the tenant) with the rated rules' effectiveness histogram."""
    params = {"t": tenant_id, "scope": scope}
    numbers = stats(conn, tenant_id=tenant_id, scope=scope, now=now, settings=settings)
    return {**numbers, "charts": {"effectiveness_histogram": _histogram(conn, EFFECTIVENESS_SQL, params)}}


def activity(
    conn: Connection,
    *,
    tenant_id: str,
    before: int | None,
    limit: int,
    scope: str | None,
    entity_types: list[str] | None = None,
    event_type: str | None = None,
) -> list[dict[str, Any]]:
    """memory_events newest first, strictly before the ``before`` cursor (an event id); scoped like the tool."""
    events = memory_events.c
    query = select(*[c for c in memory_events.c if c.name != "tenant_id"]).where(events.tenant_id == tenant_id)
    if before is not None:
        query = query.where(events.id < before)
    if entity_types:
        query = query.where(events.entity_type.in_(entity_types))
    if event_type is not None:
        query = query.where(events.event_type == event_type)
    if scope is not None:
        query = query.where(_about_scope(scope))
    return [dict(r) for r in conn.execute(query.order_by(events.id.desc()).limit(limit)).mappings()]
