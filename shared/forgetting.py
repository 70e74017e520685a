"""What a forget takes with it (seed 001 §7.1, §10; issue 16 item 5). Functions take a Connection and never commit:
they run inside the forget's or the restore's own transaction.

- the memory's applied write intent loses its payload at once (the ids, kind, sequence and key stay, so a replay
  of the same idempotency key still answers the same id instead of writing the text again);
- its audit events keep their ids and transition names but no content (``memory_events_scrubbed`` in the
  database: the append-only trigger allows that update and no other);
- a fact or rule whose every source episode is forgotten becomes retracted, with a ``<kind>.retracted`` event
  naming the episode; restoring one of those episodes brings such memories back (and only those: a memory
  someone forgot on purpose after that stays forgotten).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, text

from shared import repository as repo
from shared.lifecycle import check_transition

SCRUBBED_PAYLOAD = '{"scrubbed": true}'
RETRACTED_CAUSE = "sources_forgotten"
RESTORED_CAUSE = "source_restored"

_SCRUB_INTENT = """
UPDATE write_intents SET payload = CAST(:scrubbed AS jsonb)
WHERE tenant_id = :t AND id = :id AND status = 'applied' AND payload <> CAST(:scrubbed AS jsonb)"""

_SCRUB_EVENTS = """
UPDATE memory_events SET payload = memory_events_scrubbed(payload)
WHERE entity_type = :kind AND entity_id = :id AND tenant_id = :t AND payload <> memory_events_scrubbed(payload)"""

# The facts and rules derived from one episode (by a derived_from link or their source_episode_id), each with
# whether any of its source episodes is still remembered. A source deleted by expiry counts as remembered: what
# was learned from it stays knowledge; only forgetting takes it back.
_DERIVED = """
WITH derived AS (
    SELECT source_type AS kind, source_id AS id FROM memory_links
    WHERE tenant_id = :t AND target_type = 'episode' AND target_id = :e AND relation = 'derived_from'
      AND source_type IN ('fact', 'rule')
    UNION SELECT 'fact', id FROM facts WHERE tenant_id = :t AND source_episode_id = :e
    UNION SELECT 'rule', id FROM rules WHERE tenant_id = :t AND source_episode_id = :e)
SELECT d.kind, d.id, EXISTS (
    SELECT 1 FROM (
        SELECT target_id AS episode_id FROM memory_links
        WHERE tenant_id = :t AND source_type = d.kind AND source_id = d.id AND target_type = 'episode'
          AND relation = 'derived_from'
        UNION SELECT source_episode_id FROM facts WHERE d.kind = 'fact' AND id = d.id
        UNION SELECT source_episode_id FROM rules WHERE d.kind = 'rule' AND id = d.id) s
    LEFT JOIN episodes ep ON ep.tenant_id = :t AND ep.id = s.episode_id
    WHERE s.episode_id IS NOT NULL AND (ep.id IS NULL OR ep.forgotten_at IS NULL)) AS remembered
FROM derived d ORDER BY d.kind, d.id"""

# The entity's latest lifecycle event: a memory is brought back by a restore of its source only if the last
# thing that happened to it was the retraction that forgetting its sources caused.
_LAST_LIFECYCLE = """
SELECT event_type, payload->>'cause' AS cause FROM memory_events
WHERE entity_type = :kind AND entity_id = :id AND tenant_id = :t AND event_type IN (:forgotten, :retracted, :restored)
ORDER BY id DESC LIMIT 1"""


def scrub_traces(conn: Connection, *, tenant_id: str, kind: str, entity_id: uuid.UUID) -> dict[str, int]:
    """Remove a forgotten memory's content from its applied write intent and its audit events."""
    params = {"t": tenant_id, "kind": kind, "id": entity_id, "scrubbed": SCRUBBED_PAYLOAD}
    intents = conn.execute(text(_SCRUB_INTENT), params).rowcount
    events = conn.execute(text(_SCRUB_EVENTS), params).rowcount
    return {"intents_scrubbed": intents, "events_scrubbed": events}


def _derived(conn: Connection, *, tenant_id: str, episode_id: uuid.UUID) -> Sequence[tuple[str, uuid.UUID, bool]]:
    """The facts and rules derived from the episode: (kind, id, whether a source of it is still remembered)."""
    return conn.execute(text(_DERIVED), {"t": tenant_id, "e": episode_id}).all()


def retract_derived(
    conn: Connection, *, tenant_id: str, episode_id: uuid.UUID, actor: str, request_id: str | None
) -> list[str]:
    """Retract every live or historic fact and rule none of whose source episodes is remembered any more."""
    out = []
    for kind, entity_id, remembered in _derived(conn, tenant_id=tenant_id, episode_id=episode_id):
        row = repo.get_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, lock=True)
        if remembered or row is None or row["validity"] == "retracted":
            continue
        check_transition("fact", row["validity"], "retracted")  # rule validity follows the fact machine
        repo.update_row(conn, kind=kind, entity_id=entity_id, values={"validity": "retracted"})
        repo.record_event(
            conn,
            tenant_id=tenant_id,
            event_type=f"{kind}.retracted",
            entity_type=kind,
            entity_id=entity_id,
            actor=actor,
            request_id=request_id,
            payload={"from_validity": row["validity"], "cause": RETRACTED_CAUSE, "episodes": [str(episode_id)]},
        )
        out.append(str(entity_id))
    return out


def restore_derived(
    conn: Connection, *, tenant_id: str, episode_id: uuid.UUID, actor: str, request_id: str | None
) -> dict[str, list[str]]:
    """Bring back what forgetting this episode retracted: a fact to its history if it was superseded, else active
    unless another fact now holds its key (then it stays retracted, listed under ``kept``)."""
    restored, kept = [], []
    for kind, entity_id, remembered in _derived(conn, tenant_id=tenant_id, episode_id=episode_id):
        row = repo.get_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, lock=True)
        if (
            not remembered
            or row is None
            or row["validity"] != "retracted"
            or not _retracted_by_sources(conn, tenant_id=tenant_id, kind=kind, entity_id=entity_id)
        ):
            continue
        target = "superseded" if kind == "fact" and row["superseded_by_id"] is not None else "active"
        if target == "active" and kind == "fact" and _key_taken(conn, tenant_id=tenant_id, row=row):
            kept.append(str(entity_id))
            continue
        check_transition("fact", "retracted", target)
        repo.update_row(conn, kind=kind, entity_id=entity_id, values={"validity": target})
        repo.record_event(
            conn,
            tenant_id=tenant_id,
            event_type=f"{kind}.restored",
            entity_type=kind,
            entity_id=entity_id,
            actor=actor,
            request_id=request_id,
            payload={"to": target, "cause": RESTORED_CAUSE, "episodes": [str(episode_id)]},
        )
        restored.append(str(entity_id))
    return {"restored": restored, "kept": kept}


def _retracted_by_sources(conn: Connection, *, tenant_id: str, kind: str, entity_id: uuid.UUID) -> bool:
    last = conn.execute(
        text(_LAST_LIFECYCLE),
        {
            "t": tenant_id,
            "kind": kind,
            "id": entity_id,
            "forgotten": f"{kind}.forgotten",
            "retracted": f"{kind}.retracted",
            "restored": f"{kind}.restored",
        },
    ).first()
    return last is not None and last.event_type == f"{kind}.retracted" and last.cause == RETRACTED_CAUSE


def _key_taken(conn: Connection, *, tenant_id: str, row: Any) -> bool:
    repo.lock_fact_key(
        conn, tenant_id=tenant_id, scope=row["scope"], subject=row["subject"], predicate=row["predicate"]
    )
    return any(
        r["id"] != row["id"] and r["validity"] == "active"
        for r in repo.current_facts_for_key(
            conn, tenant_id=tenant_id, scope=row["scope"], subject=row["subject"], predicate=row["predicate"]
        )
    )
