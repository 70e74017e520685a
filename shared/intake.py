"""Durable intake of writes (the front's half of the outbox) and the worker's claim of them.

A write is *accepted* once its write_intents row commits: the id is assigned, the per-(tenant, butler) sequence
fixes its order, and (tenant, butler, idempotency_key) makes a replay return the same id (a replay with another
payload is refused: its payload hash differs). The broker message that
follows is only a wake-up call; a lost one is re-sent by the redelivery sweep.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import Connection, RowMapping, func, select, text, tuple_, update
from sqlalchemy.exc import IntegrityError

from shared.errors import IdempotencyConflict
from shared.models import write_intents


class ConcurrentReplay(Exception):
    """An idempotency key was accepted before (by another request meanwhile, or earlier when the accept did not
    look the keys up): roll back and accept again, looking the keys up (it will find it)."""


# The unique index on (tenant_id, butler, idempotency_key): a write whose key was accepted before breaks it.
_KEY_INDEX = "uq_write_intents_idempotency"


@dataclass(frozen=True)
class WriteRequest:
    kind: str  # episode | fact | rule
    butler: str  # the shard key's butler
    payload: dict[str, Any]  # the validated write model, as JSON
    idempotency_key: str | None
    key_field: str = "idempotency_key"  # how the caller named the key (e.g. episodes.3.idempotency_key)
    payload_hash: str | None = None  # what a replay must match, if not the payload's own hash (see accept)


@dataclass(frozen=True)
class Accepted:
    id: uuid.UUID
    kind: str
    butler: str
    seq: int
    idempotency_key: str | None
    replayed: bool


def payload_hash(kind: str, payload: dict[str, Any]) -> str:
    """sha256 of the write as accepted (kind and canonical JSON payload): what a replay must match."""
    canonical = json.dumps(
        {"kind": kind, "payload": payload}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def accept(
    conn: Connection,
    *,
    tenant_id: str,
    writes: Sequence[WriteRequest],
    actor: str,
    request_id: str | None,
    trace_context: dict[str, str] | None = None,
) -> list[Accepted]:
    """Record writes durably (in the caller's transaction), in order; replays return their first id.
    ``trace_context`` (the accepting call's W3C context) is stored with each new intent for the worker's trace.

    An idempotency key is scoped to its shard key (tenant, butler): two butlers may use the same key. A replay
    whose payload differs from the first write's is refused with IdempotencyConflict (nothing written). A key
    another request accepts meanwhile raises ConcurrentReplay: roll back and accept again (the look-up finds it).
    The front tries :func:`accept_fresh` first, which writes most calls in one statement without the look-up.
    """
    hashes = [w.payload_hash or payload_hash(w.kind, w.payload) for w in writes]
    existing = _existing(conn, tenant_id=tenant_id, writes=writes)
    fresh: list[WriteRequest] = []
    first: dict[tuple[str, str], int] = {}  # (butler, key) -> index of its first occurrence in this call
    for i, w in enumerate(writes):
        key = (w.butler, w.idempotency_key) if w.idempotency_key else None
        if key is None:
            fresh.append(w)
            continue
        if key in existing:
            prior_hash = existing[key]["payload_hash"]
            if prior_hash is not None and prior_hash != hashes[i]:  # None: accepted before hashes were kept
                raise _conflict(i, writes, f"{existing[key]['kind']} {existing[key]['id']}")
        elif key in first:
            if hashes[first[key]] != hashes[i]:
                raise _conflict(i, writes, f"item {first[key]} of this call")
        else:
            first[key] = i
            fresh.append(w)
    assigned = _assign(
        conn, tenant_id=tenant_id, writes=fresh, actor=actor, request_id=request_id, trace_context=trace_context
    )
    out: list[Accepted] = []
    for i, w in enumerate(writes):
        key = (w.butler, w.idempotency_key) if w.idempotency_key else None
        if key is None:
            out.append(assigned[id(w)])
        elif key in existing:
            prior = existing[key]
            out.append(Accepted(prior["id"], prior["kind"], prior["butler"], prior["seq"], w.idempotency_key, True))
        else:
            a = assigned[key]
            out.append(a if first[key] == i else Accepted(a.id, a.kind, a.butler, a.seq, w.idempotency_key, True))
    return out


def _existing(conn: Connection, *, tenant_id: str, writes: Sequence[WriteRequest]) -> dict[tuple[str, str], RowMapping]:
    """The already-accepted intents of the call's (butler, idempotency_key) pairs (one query)."""
    keys = sorted({(w.butler, w.idempotency_key) for w in writes if w.idempotency_key})
    if not keys:
        return {}
    rows = conn.execute(
        select(
            write_intents.c.id,
            write_intents.c.kind,
            write_intents.c.butler,
            write_intents.c.seq,
            write_intents.c.idempotency_key,
            write_intents.c.payload_hash,
        ).where(
            write_intents.c.tenant_id == tenant_id,
            tuple_(write_intents.c.butler, write_intents.c.idempotency_key).in_(keys),
        )
    ).mappings()
    return {(r["butler"], r["idempotency_key"]): r for r in rows}


def _conflict(index: int, writes: Sequence[WriteRequest], used_by: str) -> IdempotencyConflict:
    write = writes[index]
    return IdempotencyConflict(
        f"{write.key_field}: {write.idempotency_key!r} was already used for a different write ({used_by}); "
        "a retry must send the same arguments, a new write needs a new key",
        field=write.key_field,
    )


# One statement, one round trip per butler: take the next len(batch) numbers of the key's sequence (the upsert
# row-locks the counter until commit, so two accepts of one key cannot interleave) and insert the intents numbered
# from them in the batch's order. A row whose idempotency key was accepted before (by another request meanwhile)
# breaks the key's unique index: the statement fails whole, counter included (ConcurrentReplay). Plain SQL in the
# driver's placeholders, run as is by psycopg on a thread (accept) or on the event loop (accept_fresh): this is
# every accept's statement, and compiling it per call was a fifth of an accept's front CPU. The intents travel as
# one JSON array (one json.dumps) rather than five typed arrays, whose dumping cost the driver ~0.1 ms per accept.
_ASSIGN = """
    WITH seq AS (
        INSERT INTO shard_sequences AS s (tenant_id, butler, last_seq) VALUES (%(tenant_id)s, %(butler)s, %(n)s)
        ON CONFLICT (tenant_id, butler) DO UPDATE SET last_seq = s.last_seq + %(n)s
        RETURNING last_seq
    )
    INSERT INTO write_intents (id, tenant_id, butler, seq, kind, payload, idempotency_key, payload_hash,
                               request_id, actor, created_at, trace_context)
    SELECT w.id, %(tenant_id)s, %(butler)s, seq.last_seq - %(n)s + w.ord, w.kind, w.payload, w.idempotency_key,
           w.payload_hash, %(request_id)s, %(actor)s, clock_timestamp(), CAST(%(trace_context)s AS jsonb)
    FROM seq, ROWS FROM (jsonb_to_recordset(CAST(%(rows)s AS jsonb))
                         AS (id uuid, kind text, payload jsonb, idempotency_key text, payload_hash text))
         WITH ORDINALITY AS w(id, kind, payload, idempotency_key, payload_hash, ord)
    RETURNING id, seq
    """


def fresh_in_one_statement(writes: Sequence[WriteRequest]) -> bool:
    """Whether :func:`accept_fresh` takes ``writes``: one butler, and no idempotency key twice in the call."""
    keys = [w.idempotency_key for w in writes if w.idempotency_key]
    return len({w.butler for w in writes}) == 1 and len(keys) == len(set(keys))


async def accept_fresh(
    conn: psycopg.AsyncConnection[Any],
    *,
    tenant_id: str,
    writes: Sequence[WriteRequest],
    actor: str,
    request_id: str | None,
    trace_context: dict[str, str] | None = None,
) -> list[Accepted]:
    """:func:`accept` in one statement on an async connection in autocommit (the front's accepts, on its event
    loop, with no thread hand-off) for writes :func:`fresh_in_one_statement` takes, assuming that none of their
    keys was accepted before (most writes are not replays: the look-up would cost a round trip). If one was,
    nothing is written and ConcurrentReplay is raised: :func:`accept` then finds the first write."""
    butler = writes[0].butler
    ids, params = _assign_params(tenant_id, butler, writes, actor, request_id, trace_context)
    try:
        cursor = await conn.execute(_ASSIGN, params)
        returned = await cursor.fetchall()
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name == _KEY_INDEX:
            raise ConcurrentReplay("an idempotency key was accepted before") from exc
        raise
    return _assigned(butler, writes, ids, returned)


def _assign(
    conn: Connection,
    *,
    tenant_id: str,
    writes: Sequence[WriteRequest],
    actor: str,
    request_id: str | None,
    trace_context: dict[str, str] | None,
) -> dict[Any, Accepted]:
    """Allocate gap-free sequences per butler and insert the intents (the accept time is the database's clock,
    never the front's: a fact's "is it late?" check, shared.writes.store_fact, orders writes by it)."""
    by_butler: dict[str, list[WriteRequest]] = {}
    for w in writes:
        by_butler.setdefault(w.butler, []).append(w)
    result: dict[Any, Accepted] = {}  # by id() of the request, and by (butler, idempotency key)
    for butler in sorted(by_butler):  # a fixed lock order: two batches can't deadlock on counters
        batch = by_butler[butler]
        ids, params = _assign_params(tenant_id, butler, batch, actor, request_id, trace_context)
        try:
            returned = conn.exec_driver_sql(_ASSIGN, params).all()
        except IntegrityError as exc:
            if getattr(getattr(exc.orig, "diag", None), "constraint_name", None) == _KEY_INDEX:
                raise ConcurrentReplay("an idempotency key was accepted before") from exc
            raise
        for w, accepted in zip(batch, _assigned(butler, batch, ids, returned), strict=True):
            result[id(w)] = accepted
            if w.idempotency_key:
                result[(butler, w.idempotency_key)] = accepted
    return result


def _assign_params(
    tenant_id: str,
    butler: str,
    batch: Sequence[WriteRequest],
    actor: str,
    request_id: str | None,
    trace_context: dict[str, str] | None,
) -> tuple[list[uuid.UUID], dict[str, Any]]:
    """The new intents' ids and :data:`_ASSIGN`'s parameters for one butler's ``batch``."""
    ids = [uuid.uuid4() for _ in batch]
    rows = [
        {
            "id": str(i),
            "kind": w.kind,
            "payload": w.payload,
            "idempotency_key": w.idempotency_key,
            "payload_hash": w.payload_hash or payload_hash(w.kind, w.payload),
        }
        for i, w in zip(ids, batch, strict=True)
    ]
    return ids, {
        "tenant_id": tenant_id,
        "butler": butler,
        "n": len(batch),
        "request_id": request_id,
        "actor": actor,
        "trace_context": json.dumps(trace_context) if trace_context is not None else None,
        "rows": json.dumps(rows),
    }


def _assigned(butler: str, batch: Sequence[WriteRequest], ids: list[uuid.UUID], returned: Any) -> list[Accepted]:
    seqs: dict[uuid.UUID, int] = {row[0]: row[1] for row in returned}
    return [
        Accepted(intent_id, w.kind, butler, seqs[intent_id], w.idempotency_key, False)
        for w, intent_id in zip(batch, ids, strict=True)
    ]


def claim_pending(conn: Connection, *, tenant_id: str, butler: str, limit: int) -> list[RowMapping]:
    """The key's oldest pending intents in sequence order, row-locked (skipping rows another worker holds), up to
    the first one still waiting out its retry backoff: a failed intent holds its key's later intents back until it
    is applied or dead-lettered, so one key's writes apply in the order they were accepted."""
    due = func.coalesce(write_intents.c.next_attempt_at <= func.now(), True).label("due")
    claimed: list[RowMapping] = []
    for row in conn.execute(
        select(write_intents, due)
        .where(
            write_intents.c.tenant_id == tenant_id,
            write_intents.c.butler == butler,
            write_intents.c.status == "pending",
        )
        .order_by(write_intents.c.seq)
        .limit(limit)
        .with_for_update(of=write_intents, skip_locked=True)
    ).mappings():
        if not row["due"]:
            break
        claimed.append(row)
    return claimed


def next_work(conn: Connection, *, tenant_id: str, butler: str) -> tuple[bool, float | None]:
    """(whether the key has work now, else the seconds - database clock - until its first pending intent may be
    tried again, None if it has none), from the key's oldest pending intent, in one statement.

    Locks nothing: a check that row-locked the oldest intent (as claim_pending does) would make the key's holder,
    claiming with SKIP LOCKED meanwhile, apply later ones first."""
    oldest = conn.execute(
        select(func.extract("epoch", write_intents.c.next_attempt_at - func.now()))
        .where(
            write_intents.c.tenant_id == tenant_id,
            write_intents.c.butler == butler,
            write_intents.c.status == "pending",
        )
        .order_by(write_intents.c.seq)
        .limit(1)
    ).first()
    if oldest is None:
        return False, None
    (wait,) = oldest  # None: the intent was never tried, so it is due
    return (True, None) if wait is None or wait <= 0 else (False, float(wait))


def mark_applied(conn: Connection, *, ids: Sequence[uuid.UUID], now: datetime) -> None:
    if ids:
        conn.execute(update(write_intents).where(write_intents.c.id.in_(ids)).values(status="applied", applied_at=now))


# The SQL twin of shared.scoring.backoff_seconds (equal jitter, attempt = attempts + 1), on the database clock so
# fronts and workers with skewed clocks agree on when an intent is due. The exponent is bounded like the twin's.
BACKOFF_SQL = (
    "now() + make_interval(secs => least(CAST(:cap AS float8), CAST(:base AS float8) * "
    "power(2, least(attempts, 1000))) * (0.5 + random() / 2))"
)


def mark_failed(
    conn: Connection,
    *,
    intent_id: uuid.UUID,
    error: str,
    max_attempts: int,
    backoff_base_s: float,
    backoff_max_s: float,
) -> str:
    """Count a failed apply; after ``max_attempts`` the intent is dead-lettered, else it is retried after a
    jittered exponential backoff (``next_attempt_at``). Returns the new status."""
    return conn.execute(
        update(write_intents)
        .where(write_intents.c.id == intent_id)
        .values(
            attempts=write_intents.c.attempts + 1,
            last_error=error[:2000],
            status=text(f"CASE WHEN attempts + 1 >= {int(max_attempts)} THEN 'dead_letter' ELSE 'pending' END"),
            next_attempt_at=text(BACKOFF_SQL).bindparams(base=backoff_base_s, cap=backoff_max_s),
        )
        .returning(write_intents.c.status)
    ).scalar_one()


def stale_pending_keys(conn: Connection, *, older_than: datetime, limit: int = 1000) -> list[tuple[str, str]]:
    """(tenant, butler) keys with a pending intent accepted before ``older_than``: their wake-up may be lost."""
    return [
        (r.tenant_id, r.butler)
        for r in conn.execute(
            select(write_intents.c.tenant_id, write_intents.c.butler)
            .where(
                write_intents.c.status == "pending",
                write_intents.c.created_at < older_than,
                func.coalesce(write_intents.c.next_attempt_at <= func.now(), True),
            )
            .group_by(write_intents.c.tenant_id, write_intents.c.butler)
            .limit(limit)
        )
    ]
