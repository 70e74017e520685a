"""Tenant purge, the right to erasure (issue 16, item 7): every row of one tenant goes, in one transaction, and one
tombstone row in ``tenant_purges`` (outside every tenant) records who purged which tenant, when, and how many rows
of each table went. Functions take a Connection and never commit.

The tombstone is written first and left open (finished_at NULL) until the end: an open tombstone of this tenant is
what lets memory_events' append-only trigger delete the tenant's audit rows; no other path can. Other
transactions never see it open (it commits finished).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, text

from shared.errors import InvalidInput, NotFound
from shared.tenancy import NAME_RE

# Children before parents (each also cascades from tenants, but counted one by one for the tombstone).
# tests/integration/test_purge.py checks that no table with a tenant_id column is left holding the tenant's rows.
TENANT_TABLES = (
    "rule_applications",
    "memory_links",
    "memory_events",
    "episode_vectors",
    "episode_terms",
    "consolidation_runs",
    "feedback_receipts",
    "facts",
    "rules",
    "episodes",
    "write_intents",
    "shard_sequences",
    "api_tokens",
)


def purge_tenant(conn: Connection, *, tenant_id: str, actor: str) -> dict[str, Any]:
    """Delete every row of ``tenant_id`` and the tenant itself; return the tombstone (id, counts)."""
    if not NAME_RE.match(tenant_id):
        raise InvalidInput(f"tenant: {tenant_id!r} is not a tenant id", field="tenant")
    # Lock the tenant row: a concurrent purge of the same tenant waits, then finds nothing.
    if conn.execute(text("SELECT 1 FROM tenants WHERE id = :t FOR UPDATE"), {"t": tenant_id}).first() is None:
        raise NotFound(f"tenant: no tenant {tenant_id!r}", field="tenant")
    purge_id: int = conn.execute(
        text("INSERT INTO tenant_purges (tenant_id, requested_by) VALUES (:t, :a) RETURNING id"),
        {"t": tenant_id, "a": actor},
    ).scalar_one()
    counts = {
        table: conn.execute(text(f"DELETE FROM {table} WHERE tenant_id = :t"), {"t": tenant_id}).rowcount
        for table in TENANT_TABLES
    }
    counts["tenants"] = conn.execute(text("DELETE FROM tenants WHERE id = :t"), {"t": tenant_id}).rowcount
    finished = conn.execute(
        text(
            "UPDATE tenant_purges SET finished_at = clock_timestamp(), counts = CAST(:c AS jsonb) WHERE id = :id "
            "RETURNING started_at, finished_at"
        ),
        {"id": purge_id, "c": json.dumps(counts)},
    ).one()
    return {
        "purge_id": purge_id,
        "tenant": tenant_id,
        "requested_by": actor,
        "counts": counts,
        "started_at": finished.started_at.isoformat(),
        "finished_at": finished.finished_at.isoformat(),
    }
