"""Durable intake of writes (the front's half of the outbox) and the worker's claim of them.

A write is *accepted* once its write_intents row commits: the id is assigned, the per-(tenant, butler) sequence
fixes its order, and (tenant, idempotency_key) makes a replay return the same id. The broker message that
follows is only a wake-up call; a lost one is re-sent by the redelivery sweep.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, exists, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from shared.models import shard_sequences, write_intents


class ConcurrentReplay(Exception):
    """Another request inserted the same idempotency key meanwhile; retry the whole accept (it will find it)."""


@dataclass(frozen=True)
class WriteRequest:
    kind: str                    # episode | fact | rule
    butler: str                  # the shard key's butler
    payload: dict[str, Any]      # the validated write model, as JSON
    idempotency_key: str | None


@dataclass(frozen=True)
class Accepted:
    id: uuid.UUID
    kind: str
    butler: str
    seq: int
    idempotency_key: str | None
    replayed: bool


def accept(
    conn: Connection, *, tenant_id: str, writes: Sequence[WriteRequest], actor: str, request_id: str | None,
    now: datetime,
) -> list[Accepted]:
    """Record writes durably (in the caller's transaction), in order; replays return their first id."""
    keys = [w.idempotency_key for w in writes if w.idempotency_key]
    existing = {
        r["idempotency_key"]: r for r in conn.execute(
            select(write_intents.c.id, write_intents.c.kind, write_intents.c.butler, write_intents.c.seq,
                   write_intents.c.idempotency_key)
            .where(write_intents.c.tenant_id == tenant_id, write_intents.c.idempotency_key.in_(keys))
        ).mappings()
    } if keys else {}
    fresh: list[WriteRequest] = []
    first: dict[str, int] = {}  # idempotency key -> index of its first occurrence in this call
    for i, w in enumerate(writes):
        key = w.idempotency_key
        if key and (key in existing or key in first):
            continue
        if key:
            first[key] = i
        fresh.append(w)
    assigned = _assign(conn, tenant_id=tenant_id, writes=fresh, actor=actor, request_id=request_id, now=now)
    out: list[Accepted] = []
    for i, w in enumerate(writes):
        key = w.idempotency_key
        if key and key in existing:
            prior = existing[key]
            out.append(Accepted(prior["id"], prior["kind"], prior["butler"], prior["seq"], key, True))
        elif key and first[key] != i:
            a = assigned[key]
            out.append(Accepted(a.id, a.kind, a.butler, a.seq, key, True))
        else:
            out.append(assigned[key] if key else assigned[id(w)])
    return out


def _assign(
    conn: Connection, *, tenant_id: str, writes: Sequence[WriteRequest], actor: str, request_id: str | None,
    now: datetime,
) -> dict[Any, Accepted]:
    """Allocate gap-free sequences per butler (row-locking the counter until commit) and insert the intents."""
    by_butler: dict[str, list[WriteRequest]] = {}
    for w in writes:
        by_butler.setdefault(w.butler, []).append(w)
    rows, result = [], {}
    for butler in sorted(by_butler):  # a fixed lock order: two batches can't deadlock on counters
        batch = by_butler[butler]
        last = conn.execute(
            pg_insert(shard_sequences).values(tenant_id=tenant_id, butler=butler, last_seq=len(batch))
            .on_conflict_do_update(index_elements=["tenant_id", "butler"],
                                   set_={"last_seq": shard_sequences.c.last_seq + len(batch)})
            .returning(shard_sequences.c.last_seq)
        ).scalar_one()
        for offset, w in enumerate(batch):
            accepted = Accepted(uuid.uuid4(), w.kind, butler, last - len(batch) + 1 + offset, w.idempotency_key, False)
            result[id(w)] = accepted
            if w.idempotency_key:
                result[w.idempotency_key] = accepted
            rows.append({"id": accepted.id, "tenant_id": tenant_id, "butler": butler, "seq": accepted.seq,
                         "kind": w.kind, "payload": w.payload, "idempotency_key": w.idempotency_key,
                         "request_id": request_id, "actor": actor, "created_at": now})
    if rows:
        inserted = conn.execute(
            pg_insert(write_intents).values(rows).on_conflict_do_nothing(
                index_elements=["tenant_id", "idempotency_key"],
                index_where=write_intents.c.idempotency_key.is_not(None),
            ).returning(write_intents.c.id)
        ).all()
        if len(inserted) != len(rows):
            raise ConcurrentReplay("an idempotency key was accepted concurrently")
    return result


def claim_pending(conn: Connection, *, tenant_id: str, butler: str, limit: int) -> list[RowMapping]:
    """The key's oldest pending intents in sequence order, row-locked; skip rows another worker holds."""
    return list(conn.execute(
        select(write_intents).where(
            write_intents.c.tenant_id == tenant_id, write_intents.c.butler == butler,
            write_intents.c.status == "pending",
        ).order_by(write_intents.c.seq).limit(limit).with_for_update(skip_locked=True)
    ).mappings())


def has_pending(conn: Connection, *, tenant_id: str, butler: str) -> bool:
    """Whether the key has a pending intent. Locks nothing: a check that row-locked the oldest intent (as
    claim_pending does) would make the key's holder, claiming with SKIP LOCKED meanwhile, apply later ones first."""
    return bool(conn.execute(select(exists().where(
        write_intents.c.tenant_id == tenant_id, write_intents.c.butler == butler,
        write_intents.c.status == "pending"))).scalar_one())


def mark_applied(conn: Connection, *, ids: Sequence[uuid.UUID], now: datetime) -> None:
    if ids:
        conn.execute(update(write_intents).where(write_intents.c.id.in_(ids)).values(status="applied", applied_at=now))


def mark_failed(conn: Connection, *, intent_id: uuid.UUID, error: str, max_attempts: int) -> str:
    """Count a failed apply; after ``max_attempts`` the intent is dead-lettered. Returns the new status."""
    return conn.execute(
        update(write_intents).where(write_intents.c.id == intent_id).values(
            attempts=write_intents.c.attempts + 1, last_error=error[:2000],
            status=text(f"CASE WHEN attempts + 1 >= {int(max_attempts)} THEN 'dead_letter' ELSE 'pending' END"),
        ).returning(write_intents.c.status)
    ).scalar_one()


def stale_pending_keys(conn: Connection, *, older_than: datetime, limit: int = 1000) -> list[tuple[str, str]]:
    """(tenant, butler) keys with a pending intent accepted before ``older_than``: their wake-up may be lost."""
    return [(r.tenant_id, r.butler) for r in conn.execute(
        select(write_intents.c.tenant_id, write_intents.c.butler)
        .where(write_intents.c.status == "pending", write_intents.c.created_at < older_than)
        .group_by(write_intents.c.tenant_id, write_intents.c.butler).limit(limit)
    )]
