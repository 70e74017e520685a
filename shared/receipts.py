"""Idempotent feedback: a memory_confirm / memory_mark_* call with an ``idempotency_key`` leaves a receipt in the
same transaction as its effect, so a retry (after a timeout, say) answers the first call's result and records no
second confirmation or application. Keys are scoped to (tenant, the caller's butler); a key reused for another
call (other tool, memory or arguments) is refused with IdempotencyConflict.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from shared.errors import IdempotencyConflict
from shared.models import feedback_receipts


@dataclass(frozen=True)
class Receipt:
    """Who asks for an idempotent call, with which key, and what the call is (tool and arguments)."""

    tenant_id: str
    butler: str
    key: str
    tool: str
    entity_id: uuid.UUID
    arguments: dict[str, Any]

    @property
    def payload_hash(self) -> str:
        canonical = json.dumps(
            {"tool": self.tool, "id": str(self.entity_id), "arguments": self.arguments},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            default=str,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def claim(conn: Connection, *, receipt: Receipt) -> dict[str, Any] | None:
    """None if this is the key's first call (do the work, then :func:`record`); else the first call's result.

    A concurrent first call holds the key's row until it commits; this insert waits for it and then sees it.
    """
    digest = receipt.payload_hash
    inserted = conn.execute(
        pg_insert(feedback_receipts)
        .values(
            tenant_id=receipt.tenant_id,
            butler=receipt.butler,
            idempotency_key=receipt.key,
            tool=receipt.tool,
            entity_id=receipt.entity_id,
            payload_hash=digest,
            result={},
            created_at=func.now(),
        )
        .on_conflict_do_nothing()
        .returning(feedback_receipts.c.idempotency_key)
    ).first()
    if inserted is not None:
        return None
    prior = conn.execute(
        select(
            feedback_receipts.c.tool,
            feedback_receipts.c.entity_id,
            feedback_receipts.c.payload_hash,
            feedback_receipts.c.result,
        ).where(
            feedback_receipts.c.tenant_id == receipt.tenant_id,
            feedback_receipts.c.butler == receipt.butler,
            feedback_receipts.c.idempotency_key == receipt.key,
        )
    ).one()
    if prior.payload_hash != digest:
        raise IdempotencyConflict(
            f"idempotency_key: {receipt.key!r} was already used for another call ({prior.tool} on {prior.entity_id}); "
            "a retry must send the same arguments, a new call needs a new key",
            field="idempotency_key",
        )
    return dict(prior.result)


def record(conn: Connection, *, receipt: Receipt, result: dict[str, Any]) -> None:
    """Keep the first call's result (JSON) on its receipt, in the call's transaction."""
    conn.execute(
        update(feedback_receipts)
        .where(
            feedback_receipts.c.tenant_id == receipt.tenant_id,
            feedback_receipts.c.butler == receipt.butler,
            feedback_receipts.c.idempotency_key == receipt.key,
        )
        .values(result=json.loads(json.dumps(result, default=_jsonable)))
    )


def _jsonable(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def prune(conn: Connection, *, before: datetime) -> int:
    """Forget the receipts made before ``before`` (a retry comes within minutes, not days). Returns rows deleted."""
    return conn.execute(delete(feedback_receipts).where(feedback_receipts.c.created_at < before)).rowcount
