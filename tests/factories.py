"""Rows written straight into the database for tests that need crafted states (no model, no worker)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import text

VEC = "[" + ",".join(["0.1"] * 384) + "]"  # a constant embedding: these tests are not about similarity


def next_seq(conn, tenant: str, butler: str) -> int:  # noqa: ANN001
    """The next gap-free seq of a (tenant, butler) key, as the intake assigns it."""
    return conn.execute(
        text(
            "INSERT INTO shard_sequences VALUES (:t, :b, 1) ON CONFLICT (tenant_id, butler) "
            "DO UPDATE SET last_seq = shard_sequences.last_seq + 1 RETURNING last_seq"
        ),
        {"t": tenant, "b": butler},
    ).scalar()


def insert_episode(
    conn,
    tenant: str,
    *,
    butler: str,
    status: str,
    created_at: datetime,  # noqa: ANN001
    expires_at: datetime,
) -> uuid.UUID:
    """An episode with the next seq of its (tenant, butler) key, in the given consolidation state."""
    eid = uuid.uuid4()
    seq = next_seq(conn, tenant, butler)
    conn.execute(
        text(
            "INSERT INTO episodes (id, tenant_id, butler, seq, content, embedding, consolidation_status, created_at, "
            "expires_at) VALUES (:id, :t, :b, :seq, 'e', CAST(:e AS vector), :st, :c, :x)"
        ),
        {"id": eid, "t": tenant, "b": butler, "seq": seq, "e": VEC, "st": status, "c": created_at, "x": expires_at},
    )
    return eid
