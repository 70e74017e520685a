"""Dead letters: episodes whose consolidation and write intents whose apply gave up. List, show, redrive, drop.

A redrive moves a dead letter back to pending with its attempts reset (the episode machine's only way out of
dead_letter); the error it had is kept in the redrive's memory_events row. A drop deletes it: the operator gave
up on it (the episode's text, or the write that was never applied, goes with it). Undecided dead letters are
kept past the episode TTL, for ``schedule.dead_letters_retention_days`` (see shared.maintenance). Functions take
a Connection and never commit; redrive and drop are one statement per table, bounded by ``limit``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, text

from shared import repository as repo
from shared.lifecycle import check_transition
from shared.models import episodes, write_intents

PREVIEW_CHARS = 200
# One redrive statement touches at most this many rows; an operator's `--all` repeats until none are left.
REDRIVE_LIMIT = 10_000


@dataclass(frozen=True)
class DeadLetter:
    """An episode or write intent, with what went wrong and how often it was tried."""

    kind: str  # "episode" | "write_intent"
    id: uuid.UUID
    tenant_id: str
    butler: str
    seq: int
    status: str
    attempts: int
    error: str | None
    created_at: datetime
    detail: dict[str, Any]  # episode: {"content"}; write intent: {"kind", "payload"}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "id": str(self.id), "created_at": self.created_at.isoformat()}


@dataclass(frozen=True)
class Redriven:
    kind: str
    id: uuid.UUID
    tenant_id: str
    butler: str


# Everything but the embedding and the search vector.
_EPISODE_COLUMNS = (
    episodes.c.id,
    episodes.c.tenant_id,
    episodes.c.butler,
    episodes.c.seq,
    episodes.c.content,
    episodes.c.consolidation_status,
    episodes.c.consolidation_attempts,
    episodes.c.last_consolidation_error,
    episodes.c.created_at,
)


def _episode(row: Any, *, full: bool) -> DeadLetter:
    content = row.content if full else row.content[:PREVIEW_CHARS]
    return DeadLetter(
        "episode",
        row.id,
        row.tenant_id,
        row.butler,
        row.seq,
        row.consolidation_status,
        row.consolidation_attempts,
        row.last_consolidation_error,
        row.created_at,
        {"content": content},
    )


def _intent(row: Any, *, full: bool) -> DeadLetter:
    payload = row.payload if full else {k: v for k, v in row.payload.items() if k in ("butler", "subject", "predicate")}
    return DeadLetter(
        "write_intent",
        row.id,
        row.tenant_id,
        row.butler,
        row.seq,
        row.status,
        row.attempts,
        row.last_error,
        row.created_at,
        {"kind": row.kind, "payload": payload},
    )


def list_dead_letters(conn: Connection, *, tenant_id: str | None = None, limit: int = 100) -> list[DeadLetter]:
    """The oldest dead letters of both kinds (of one tenant, or all), oldest first, at most ``limit``."""
    ep = select(*_EPISODE_COLUMNS).where(episodes.c.consolidation_status == "dead_letter")
    wi = select(write_intents).where(write_intents.c.status == "dead_letter")
    if tenant_id is not None:
        ep = ep.where(episodes.c.tenant_id == tenant_id)
        wi = wi.where(write_intents.c.tenant_id == tenant_id)
    found = [_episode(r, full=False) for r in conn.execute(ep.order_by(episodes.c.created_at).limit(limit))]
    found += [_intent(r, full=False) for r in conn.execute(wi.order_by(write_intents.c.created_at).limit(limit))]
    return sorted(found, key=lambda d: (d.created_at, d.kind, d.seq))[:limit]


def show_dead_letter(conn: Connection, *, entity_id: uuid.UUID) -> DeadLetter | None:
    """One episode or write intent by id, whatever its state, with its full content or payload."""
    row = conn.execute(select(*_EPISODE_COLUMNS).where(episodes.c.id == entity_id)).first()
    if row is not None:
        return _episode(row, full=True)
    row = conn.execute(select(write_intents).where(write_intents.c.id == entity_id)).first()
    return _intent(row, full=True) if row is not None else None


_REDRIVE_EPISODES = """
WITH dead AS (
    SELECT tenant_id, id, created_at, last_consolidation_error AS error FROM episodes
    WHERE consolidation_status = 'dead_letter' {where} ORDER BY created_at LIMIT :limit FOR UPDATE)
UPDATE episodes e SET consolidation_status = 'pending', consolidation_attempts = 0,
    next_consolidation_retry_at = NULL, last_consolidation_error = NULL
FROM dead WHERE e.tenant_id = dead.tenant_id AND e.id = dead.id AND e.created_at = dead.created_at
RETURNING e.id, e.tenant_id, e.butler, dead.error"""

_REDRIVE_INTENTS = """
WITH dead AS (
    SELECT id, last_error AS error FROM write_intents
    WHERE status = 'dead_letter' {where} ORDER BY created_at LIMIT :limit FOR UPDATE)
UPDATE write_intents w SET status = 'pending', attempts = 0, last_error = NULL, next_attempt_at = NULL
FROM dead WHERE w.id = dead.id
RETURNING w.id, w.tenant_id, w.butler, dead.error"""


def _selection(ids: Sequence[uuid.UUID] | None, tenant_id: str | None, limit: int) -> tuple[str, dict[str, Any]]:
    """The dead letters a redrive or a drop acts on: the given ids, or every one (of the tenant, if given)."""
    where = ""
    params: dict[str, Any] = {"limit": limit}
    if ids is not None:
        where += " AND id = ANY(:ids)"
        params["ids"] = list(ids)
    if tenant_id is not None:
        where += " AND tenant_id = :tenant"
        params["tenant"] = tenant_id
    return where, params


def redrive(
    conn: Connection,
    *,
    ids: Sequence[uuid.UUID] | None = None,
    tenant_id: str | None = None,
    actor: str,
    limit: int = REDRIVE_LIMIT,
) -> list[Redriven]:
    """dead_letter → pending with attempts reset: the given ids, or (ids=None) every dead letter of the tenant/all."""
    check_transition("episode", "dead_letter", "pending")
    where, params = _selection(ids, tenant_id, limit)
    out, events = [], []
    for kind, sql in (("episode", _REDRIVE_EPISODES), ("write_intent", _REDRIVE_INTENTS)):
        for row in conn.execute(text(sql.format(where=where)), params):
            out.append(Redriven(kind, row.id, row.tenant_id, row.butler))
            events.append(
                {
                    "tenant_id": row.tenant_id,
                    "event_type": f"{kind}.redriven",
                    "entity_type": kind,
                    "entity_id": row.id,
                    "actor": actor,
                    "request_id": None,
                    "payload": {"butler": row.butler, "previous_error": row.error},
                }
            )
    repo.record_events(conn, events)
    return out


_DROP = {
    "episode": """DELETE FROM episodes WHERE (tenant_id, id, created_at) IN (
        SELECT tenant_id, id, created_at FROM episodes WHERE consolidation_status = 'dead_letter' {where}
        ORDER BY created_at LIMIT :limit FOR UPDATE)
        RETURNING id, tenant_id, butler""",
    "write_intent": """DELETE FROM write_intents WHERE id IN (
        SELECT id FROM write_intents WHERE status = 'dead_letter' {where}
        ORDER BY created_at LIMIT :limit FOR UPDATE)
        RETURNING id, tenant_id, butler""",
}


def drop(
    conn: Connection,
    *,
    ids: Sequence[uuid.UUID] | None = None,
    tenant_id: str | None = None,
    actor: str,
    limit: int = REDRIVE_LIMIT,
) -> list[Redriven]:
    """Delete dead letters for good: the given ids, or (ids=None) every dead letter of the tenant/all. Only dead
    letters: an id that is not one is left alone (and not returned). One audit event each, without content."""
    where, params = _selection(ids, tenant_id, limit)
    out, events = [], []
    for kind, sql in _DROP.items():
        for row in conn.execute(text(sql.format(where=where)), params):
            out.append(Redriven(kind, row.id, row.tenant_id, row.butler))
            events.append(
                {
                    "tenant_id": row.tenant_id,
                    "event_type": f"{kind}.dropped",
                    "entity_type": kind,
                    "entity_id": row.id,
                    "actor": actor,
                    "request_id": None,
                    "payload": {"butler": row.butler},
                }
            )
    repo.record_events(conn, events)
    return out
