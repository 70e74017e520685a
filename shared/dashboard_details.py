"""The dashboard's detail views: one memory with its provenance (source episodes, links in and out, the full
supersession chain of a fact, a rule's application history, the audit events about it).

Visibility is checked by :func:`shared.writes.load_visible` (NotFound / Pending / PermissionDenied); rows the caller
may not see (another butler's episode) are left out of the provenance rather than revealed.
Functions take a Connection and never commit.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from shared import repository as repo
from shared.dashboard_queries import EPISODE_COLUMNS, FACT_COLUMNS
from shared.scoring import effective_confidence_sql
from shared.writes import Visibility, load_visible

CHAIN_LIMIT = 200  # supersession hops followed each way; a longer chain is cut (and says so)
HISTORY_LIMIT = 100  # rule applications and audit events shown with one memory

CHAIN_SQL = f"""
WITH RECURSIVE back(id, depth) AS (
    SELECT CAST(:id AS uuid), 0
    UNION ALL SELECT f.supersedes_id, b.depth + 1 FROM back b JOIN facts f ON f.id = b.id
    WHERE f.supersedes_id IS NOT NULL AND f.tenant_id = :t AND b.depth < :hops),
fwd(id, depth) AS (
    SELECT CAST(:id AS uuid), 0
    UNION ALL SELECT f.superseded_by_id, w.depth + 1 FROM fwd w JOIN facts f ON f.id = w.id
    WHERE f.superseded_by_id IS NOT NULL AND f.tenant_id = :t AND w.depth < :hops)
SELECT {FACT_COLUMNS}, {effective_confidence_sql("f")} AS effective_confidence
FROM facts f WHERE f.tenant_id = :t AND f.id IN (SELECT id FROM back UNION SELECT id FROM fwd)
ORDER BY f.created_at, f.id"""

EVENTS_SQL = """
SELECT id, event_type, entity_type, entity_id, occurred_at, actor, request_id, payload FROM memory_events
WHERE entity_type = :kind AND entity_id = :id AND tenant_id = :t ORDER BY id DESC LIMIT :limit"""

APPLICATIONS_SQL = """
SELECT id, outcome, reason, actor, request_id, occurred_at FROM rule_applications
WHERE rule_id = :id AND tenant_id = :t ORDER BY occurred_at DESC, id DESC LIMIT :limit"""

DERIVED_SQL = {
    "fact": f"SELECT {FACT_COLUMNS}, {effective_confidence_sql('f')} AS effective_confidence FROM facts f "
    "WHERE f.tenant_id = :t AND f.source_episode_id = :id ORDER BY f.created_at, f.id LIMIT :limit",
    "rule": "SELECT r.id, r.content, r.scope, r.maturity, r.validity, r.created_at FROM rules r "
    "WHERE r.tenant_id = :t AND r.source_episode_id = :id ORDER BY r.created_at, r.id LIMIT :limit",
}


def _events(conn: Connection, *, tenant_id: str, kind: str, entity_id: uuid.UUID) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in conn.execute(
            text(EVENTS_SQL), {"kind": kind, "id": entity_id, "t": tenant_id, "limit": HISTORY_LIMIT}
        ).mappings()
    ]


def _episodes(
    conn: Connection, *, tenant_id: str, ids: list[uuid.UUID], visibility: Visibility
) -> list[dict[str, Any]]:
    """The source episodes among ``ids`` that the caller may see."""
    if not ids:
        return []
    rows = conn.execute(
        text(
            f"SELECT {EPISODE_COLUMNS} FROM episodes e WHERE e.tenant_id = :t AND e.id = ANY(:ids) "
            "ORDER BY e.created_at, e.id"
        ),
        {"t": tenant_id, "ids": ids},
    ).mappings()
    return [dict(r) for r in rows if visibility.allows("episode", r)]


def _provenance(
    conn: Connection, *, tenant_id: str, kind: str, row: dict[str, Any], visibility: Visibility
) -> dict[str, Any]:
    """Links in and out, source episodes (the column and ``derived_from`` links), and the audit events."""
    links = [dict(r) for r in repo.links_of(conn, tenant_id=tenant_id, entity_type=kind, entity_id=row["id"])]
    sources = [row["source_episode_id"]] if row.get("source_episode_id") else []
    sources += [
        link["target_id"]
        for link in links
        if link["source_id"] == row["id"] and link["target_type"] == "episode" and link["target_id"] not in sources
    ]
    return {
        "links_out": [link for link in links if link["source_id"] == row["id"]],
        "links_in": [link for link in links if link["target_id"] == row["id"]],
        "source_episodes": _episodes(conn, tenant_id=tenant_id, ids=sources, visibility=visibility),
        "events": _events(conn, tenant_id=tenant_id, kind=kind, entity_id=row["id"]),
    }


def fact_detail(
    conn: Connection, *, tenant_id: str, fact_id: uuid.UUID, visibility: Visibility, now: datetime
) -> dict[str, Any]:
    """A fact, its effective confidence, provenance and its whole supersession chain (oldest first)."""
    load_visible(conn, kind="fact", tenant_id=tenant_id, entity_id=fact_id, visibility=visibility)
    chain = [
        dict(r)
        for r in conn.execute(
            text(CHAIN_SQL), {"id": fact_id, "t": tenant_id, "now": now, "hops": CHAIN_LIMIT}
        ).mappings()
    ]
    fact = next(r for r in chain if r["id"] == fact_id)
    return {
        "fact": fact,
        "supersession_chain": chain,
        **_provenance(conn, tenant_id=tenant_id, kind="fact", row=fact, visibility=visibility),
    }


def rule_detail(conn: Connection, *, tenant_id: str, rule_id: uuid.UUID, visibility: Visibility) -> dict[str, Any]:
    """A rule with its application history (newest first) and provenance."""
    row = dict(load_visible(conn, kind="rule", tenant_id=tenant_id, entity_id=rule_id, visibility=visibility))
    row.pop("tenant_id", None)
    applications = [
        dict(r)
        for r in conn.execute(
            text(APPLICATIONS_SQL), {"id": rule_id, "t": tenant_id, "limit": HISTORY_LIMIT}
        ).mappings()
    ]
    return {
        "rule": row,
        "applications": applications,
        **_provenance(conn, tenant_id=tenant_id, kind="rule", row=row, visibility=visibility),
    }


def episode_detail(
    conn: Connection, *, tenant_id: str, episode_id: uuid.UUID, visibility: Visibility, now: datetime
) -> dict[str, Any]:
    """An episode with the facts and rules consolidated from it."""
    row = dict(load_visible(conn, kind="episode", tenant_id=tenant_id, entity_id=episode_id, visibility=visibility))
    for key in ("tenant_id", "metadata"):
        row.pop(key, None)
    derived = {}
    for kind, sql in DERIVED_SQL.items():
        found = conn.execute(
            text(sql), {"t": tenant_id, "id": episode_id, "now": now, "limit": HISTORY_LIMIT}
        ).mappings()
        derived[f"{kind}s"] = [dict(r) for r in found if visibility.allows(kind, r)]
    return {
        "episode": row,
        **derived,
        "events": _events(conn, tenant_id=tenant_id, kind="episode", entity_id=episode_id),
    }
