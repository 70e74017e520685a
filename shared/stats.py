"""Health numbers read from Postgres: the dashboard's stats and per-shard-key gauges for /metrics.

Our own gauges are exported from the database because Flower (and the broker) only see messages,
not the durable state: a lost message still leaves its pending row here. Everything is read-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from shared.config import Settings
from shared.lifecycle import EPISODE_STATES, FACT_STATES, RULE_MATURITIES
from shared.scoring import PERMANENCE_LEVELS, effective_confidence_sql

RULE_VALIDITIES = ("active", "fading", "expired", "retracted")
# Labels of the dashboard's confidence bands over active facts (upper bounds inclusive, as the seed's colours).
BANDS = ("above_0.8", "0.5_to_0.8", "0.2_to_0.5", "below_0.2")
EFF = effective_confidence_sql("facts")
SCOPED = "tenant_id = :t AND (CAST(:scope AS text) IS NULL OR scope IN ('global', CAST(:scope AS text)))"
BUTLER = "tenant_id = :t AND (CAST(:scope AS text) IS NULL OR butler = CAST(:scope AS text))"

FACTS_SQL = f"""
SELECT validity, permanence, count(*) AS n,
       count(*) FILTER (WHERE validity = 'active' AND {EFF} > 0.8) AS "above_0.8",
       count(*) FILTER (WHERE validity = 'active' AND {EFF} BETWEEN 0.5 AND 0.8) AS "0.5_to_0.8",
       count(*) FILTER (WHERE validity = 'active' AND {EFF} >= 0.2 AND {EFF} < 0.5) AS "0.2_to_0.5",
       count(*) FILTER (WHERE validity = 'active' AND {EFF} < 0.2) AS "below_0.2"
FROM facts WHERE {SCOPED} GROUP BY validity, permanence"""

RULES_SQL = f"""
SELECT maturity, validity, count(*) AS n,
       count(*) FILTER (WHERE success_count + harmful_count > 0) AS rated,
       sum(effectiveness_score) FILTER (WHERE success_count + harmful_count > 0) AS eff_sum,
       count(*) FILTER (WHERE success_count + harmful_count > 0 AND effectiveness_score >= :helping) AS helping
FROM rules WHERE {SCOPED} GROUP BY maturity, validity"""

EPISODES_SQL = f"""
SELECT consolidation_status AS status, count(*) AS n,
       extract(epoch FROM CAST(:now AS timestamptz) - min(created_at)) AS oldest_age
FROM episodes WHERE {BUTLER} GROUP BY consolidation_status"""

INTENTS_SQL = f"SELECT count(*) FROM write_intents WHERE status = 'dead_letter' AND {BUTLER}"
LAST_CONSOLIDATION_SQL = f"SELECT max(finished_at) FROM consolidation_runs WHERE {BUTLER}"
MAINTENANCE_SQL = """
SELECT DISTINCT ON (task) task, tick, started_at, finished_at, summary
FROM maintenance_runs ORDER BY task, started_at DESC"""


def _zeros(keys: Iterable[str]) -> dict[str, int]:
    return {k: 0 for k in keys}


def _facts(conn: Connection, params: Mapping[str, Any]) -> dict[str, Any]:
    by_validity, by_permanence, bands = _zeros(FACT_STATES), _zeros(PERMANENCE_LEVELS), _zeros(BANDS)
    for r in conn.execute(text(FACTS_SQL), params).mappings():
        by_validity[r["validity"]] += r["n"]
        if r["validity"] in ("active", "fading"):  # what the agents and the dashboard still show
            by_permanence[r["permanence"]] += r["n"]
        for band in BANDS:
            bands[band] += r[band]
    return {
        "total": sum(by_validity.values()),
        "by_validity": by_validity,
        "live_by_permanence": by_permanence,
        "active_confidence_bands": bands,
    }


def _rules(conn: Connection, params: Mapping[str, Any]) -> dict[str, Any]:
    by_maturity, by_validity = _zeros(RULE_MATURITIES), _zeros(RULE_VALIDITIES)
    rated = helping = 0
    eff_sum = 0.0
    for r in conn.execute(text(RULES_SQL), params).mappings():
        by_maturity[r["maturity"]] += r["n"]
        by_validity[r["validity"]] += r["n"]
        # Effectiveness of advice: live rules with feedback; anti-patterns are warnings, counted apart.
        if r["validity"] in ("active", "fading") and r["maturity"] != "anti_pattern":
            rated, helping, eff_sum = rated + r["rated"], helping + r["helping"], eff_sum + float(r["eff_sum"] or 0)
    return {
        "total": sum(by_validity.values()),
        "by_maturity": by_maturity,
        "by_validity": by_validity,
        "effectiveness": {
            "rated": rated,
            "avg": round(eff_sum / rated, 4) if rated else None,
            "helping": helping,
            "helping_share": round(helping / rated, 4) if rated else None,
            "anti_patterns": by_maturity["anti_pattern"],
        },
    }


def _episodes(conn: Connection, params: Mapping[str, Any]) -> dict[str, Any]:
    by_status, oldest = _zeros(EPISODE_STATES), {}
    for r in conn.execute(text(EPISODES_SQL), params).mappings():
        by_status[r["status"]] = r["n"]
        oldest[r["status"]] = float(r["oldest_age"])
    last = conn.execute(text(LAST_CONSOLIDATION_SQL), params).scalar()
    return {
        "total": sum(by_status.values()),
        "by_status": by_status,
        "backlog": {
            "count": by_status["pending"] + by_status["failed"],
            "oldest_pending_age_seconds": oldest.get("pending"),
            "last_consolidation_at": last.isoformat() if last else None,
        },
    }


def last_maintenance_runs(conn: Connection) -> dict[str, dict[str, Any]]:
    """The newest run of each maintenance task (finished_at None: running, or died mid-run). Fleet-wide: the
    operator's view (/metrics with an operator token), never a tenant's."""
    return {
        r["task"]: {
            "tick": r["tick"],
            "started_at": r["started_at"].isoformat(),
            "finished_at": r["finished_at"].isoformat() if r["finished_at"] else None,
            "summary": r["summary"],
        }
        for r in conn.execute(text(MAINTENANCE_SQL)).mappings()
    }


def stats(conn: Connection, *, tenant_id: str, scope: str | None, now: datetime, settings: Settings) -> dict[str, Any]:
    """One tenant's counts and distributions; ``scope`` narrows facts/rules to global+scope and episodes to it."""
    params = {
        "t": tenant_id,
        "scope": scope,
        "now": now,
        "helping": settings.memory.rules.promote_to_established.min_effectiveness,
    }
    episodes = _episodes(conn, params)
    return {
        "tenant_id": tenant_id,
        "scope": scope,
        "as_of": now.isoformat(),
        "facts": _facts(conn, params),
        "rules": _rules(conn, params),
        "episodes": episodes,
        "dead_letters": {
            "episodes": episodes["by_status"]["dead_letter"],
            "write_intents": conn.execute(text(INTENTS_SQL), params).scalar_one(),
        },
    }


GAUGES_SQL = """
WITH ep AS (
    SELECT tenant_id, butler,
           count(*) FILTER (WHERE consolidation_status IN ('pending', 'failed')) AS backlog,
           min(created_at) FILTER (WHERE consolidation_status = 'pending') AS oldest_pending,
           count(*) FILTER (WHERE consolidation_status = 'dead_letter') AS dead_letters,
           percentile_disc(0.05) WITHIN GROUP (ORDER BY created_at)
               FILTER (WHERE consolidation_status IN ('pending', 'failed')) AS p95_created
    FROM episodes WHERE consolidation_status <> 'consolidated'
      AND (CAST(:tenant AS text) IS NULL OR tenant_id = :tenant) GROUP BY tenant_id, butler),
wi AS (
    SELECT tenant_id, butler, count(*) FILTER (WHERE status = 'pending') AS pending_intents,
           min(created_at) FILTER (WHERE status = 'pending') AS oldest_intent,
           count(*) FILTER (WHERE status = 'dead_letter') AS dead_intents
    FROM write_intents WHERE status <> 'applied'
      AND (CAST(:tenant AS text) IS NULL OR tenant_id = :tenant) GROUP BY tenant_id, butler)
SELECT k.tenant_id, k.butler, coalesce(ep.backlog, 0) AS backlog,
       coalesce(extract(epoch FROM CAST(:now AS timestamptz) - ep.oldest_pending), 0) AS oldest_pending_seconds,
       coalesce(extract(epoch FROM CAST(:now AS timestamptz) - ep.p95_created), 0) AS backlog_age_p95_seconds,
       coalesce(ep.dead_letters, 0) AS dead_letter_episodes, coalesce(wi.dead_intents, 0) AS dead_letter_intents,
       coalesce(wi.pending_intents, 0) AS pending_intents,
       coalesce(extract(epoch FROM CAST(:now AS timestamptz) - wi.oldest_intent), 0) AS oldest_intent_seconds
FROM shard_sequences k LEFT JOIN ep USING (tenant_id, butler) LEFT JOIN wi USING (tenant_id, butler)
WHERE CAST(:tenant AS text) IS NULL OR k.tenant_id = :tenant
ORDER BY k.tenant_id, k.butler"""


def gauges(conn: Connection, *, now: datetime, tenant_id: str | None = None) -> list[dict[str, Any]]:
    """One row per shard key that ever wrote (so a drained key reads 0 rather than vanishing): ``tenant_id``'s
    keys, or every tenant's (None: the operator's view)."""
    return [
        {
            **r,
            "oldest_pending_seconds": max(0.0, float(r["oldest_pending_seconds"])),
            "backlog_age_p95_seconds": max(0.0, float(r["backlog_age_p95_seconds"])),
            "oldest_intent_seconds": max(0.0, float(r["oldest_intent_seconds"])),
        }
        for r in conn.execute(text(GAUGES_SQL), {"now": now, "tenant": tenant_id}).mappings()
    ]


MAINTENANCE_TIMES_SQL = """
SELECT task, extract(epoch FROM max(started_at)) AS started_at,
       extract(epoch FROM (array_agg(finished_at ORDER BY started_at DESC))[1]) AS finished_at,
       extract(epoch FROM max(finished_at)) AS succeeded_at
FROM maintenance_runs GROUP BY task"""


def maintenance_times(conn: Connection) -> dict[str, dict[str, float | None]]:
    """Per maintenance task (Unix times): its newest start, that run's finish (None: running or died) and the
    newest finish of any run. Fleet-wide: for the operator's /metrics only."""
    return {
        r["task"]: {k: None if r[k] is None else float(r[k]) for k in ("started_at", "finished_at", "succeeded_at")}
        for r in conn.execute(text(MAINTENANCE_TIMES_SQL)).mappings()
    }


DB_CONNECTIONS_SQL = """
SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS connections,
       current_setting('max_connections')::int AS max_connections"""


def db_connections(conn: Connection) -> dict[str, float]:
    """Client connections on the server and its max_connections (DB saturation, fleet-wide)."""
    row = conn.execute(text(DB_CONNECTIONS_SQL)).mappings().one()
    return {"connections": float(row["connections"]), "max_connections": float(row["max_connections"])}


# Eligible for consolidation: pending, or failed with its retry backoff elapsed (forgotten ones never are).
BACKLOG_KEYS_SQL = """
SELECT tenant_id, butler FROM episodes
WHERE forgotten_at IS NULL AND (consolidation_status = 'pending' OR (consolidation_status = 'failed'
      AND coalesce(next_consolidation_retry_at, '-infinity') <= CAST(:now AS timestamptz)))
GROUP BY tenant_id, butler
HAVING count(*) >= coalesce(CAST(:min_eligible AS int), 2147483647)
    OR (CAST(:retries_due AS boolean) AND bool_or(consolidation_status = 'failed'))
    OR min(created_at) FILTER (WHERE consolidation_status = 'pending') < CAST(:pending_before AS timestamptz)
ORDER BY min(created_at) LIMIT :limit"""


def backlog_keys(
    conn: Connection,
    *,
    now: datetime,
    min_eligible: int | None = 1,
    retries_due: bool = False,
    pending_before: datetime | None = None,
    limit: int = 10_000,
) -> list[tuple[str, str]]:
    """Keys (oldest backlog first) with >= min_eligible eligible episodes, a retry due, or a pending one too old.

    Each criterion is off when its argument is None/False; eligible means pending, or failed with the retry due.
    """
    rows = conn.execute(
        text(BACKLOG_KEYS_SQL),
        {
            "now": now,
            "min_eligible": min_eligible,
            "retries_due": retries_due,
            "pending_before": pending_before,
            "limit": limit,
        },
    )
    return [(r.tenant_id, r.butler) for r in rows]
