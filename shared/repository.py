"""Write-side queries and lookups. Every function takes a Connection and never commits (the caller owns the transaction)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from shared.embedding import ModelVersion
from shared.models import (
    MEMORY_TABLES,
    facts,
    embedding_versions,
    memory_events,
    memory_links,
    rule_applications,
    write_intents,
)

LINK_RELATIONS = ("derived_from", "supports", "contradicts", "supersedes", "related_to")


def record_event(
    conn: Connection,
    *,
    tenant_id: str,
    event_type: str,
    entity_type: str,
    entity_id: uuid.UUID | None,
    actor: str,
    request_id: str | None,
    payload: dict[str, Any] | None = None,
) -> None:
    """Append one audit row (memory_events is append-only in the database)."""
    conn.execute(
        insert(memory_events).values(
            tenant_id=tenant_id,
            event_type=event_type,
            entity_type=entity_type,
            entity_id=entity_id,
            actor=actor,
            request_id=request_id,
            payload=payload or {},
        )
    )


def record_events(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Append many audit rows in one statement."""
    if rows:
        conn.execute(insert(memory_events), [{"payload": {}, **r} for r in rows])


def add_links(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    """Insert provenance edges; an edge that exists already is left as is (links are append-oriented)."""
    rows = list(rows)
    if rows:
        conn.execute(pg_insert(memory_links).on_conflict_do_nothing(), rows)


def links_of(conn: Connection, *, tenant_id: str, entity_type: str, entity_id: uuid.UUID) -> list[RowMapping]:
    """Edges touching one memory, outbound and inbound."""
    return list(
        conn.execute(
            select(memory_links)
            .where(
                memory_links.c.tenant_id == tenant_id,
                ((memory_links.c.source_type == entity_type) & (memory_links.c.source_id == entity_id))
                | ((memory_links.c.target_type == entity_type) & (memory_links.c.target_id == entity_id)),
            )
            .order_by(memory_links.c.created_at, memory_links.c.relation)
        ).mappings()
    )


# Kept for search and the context builder, not part of a memory as callers see it.
INTERNAL_COLUMNS = ("embedding", "search_vector", "content_tokens", "content_sealed")


def get_row(
    conn: Connection, *, kind: str, tenant_id: str, entity_id: uuid.UUID, lock: bool = False
) -> RowMapping | None:
    table = MEMORY_TABLES[kind]
    query = select(*[c for c in table.c if c.name not in INTERNAL_COLUMNS]).where(
        table.c.tenant_id == tenant_id, table.c.id == entity_id
    )
    if lock:
        query = query.with_for_update()
    return conn.execute(query).mappings().first()


def intent_status(conn: Connection, *, tenant_id: str, entity_id: uuid.UUID) -> str | None:
    """Status of the accepted write that creates ``entity_id`` (pending, applied, dead_letter), if any."""
    return conn.execute(
        select(write_intents.c.status).where(write_intents.c.tenant_id == tenant_id, write_intents.c.id == entity_id)
    ).scalar()


def update_row(
    conn: Connection, *, kind: str, entity_id: uuid.UUID, values: dict[str, Any], tenant_id: str | None = None
) -> None:
    """Update one row by id; an episode's update names its tenant (by id alone it would probe every partition's
    index only through a skip scan of the tenant-first key)."""
    table = MEMORY_TABLES[kind]
    where = [table.c.id == entity_id] + ([table.c.tenant_id == tenant_id] if tenant_id is not None else [])
    conn.execute(update(table).where(*where).values(**values))


def lock_fact_key(conn: Connection, *, tenant_id: str, scope: str, subject: str, predicate: str) -> None:
    """Serialise writers of one (tenant, scope, subject, predicate) until the transaction ends."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
        {"k": "\x1f".join(("fact", tenant_id, scope, subject, predicate))},
    )


def current_facts_for_key(
    conn: Connection, *, tenant_id: str, scope: str, subject: str, predicate: str
) -> list[RowMapping]:
    """Active or fading facts for the key, newest first, locked for update."""
    from shared.models import facts

    return list(
        conn.execute(
            select(facts.c.id, facts.c.validity, facts.c.content, facts.c.created_at)
            .where(
                facts.c.tenant_id == tenant_id,
                facts.c.scope == scope,
                facts.c.subject == subject,
                facts.c.predicate == predicate,
                facts.c.validity.in_(("active", "fading")),
            )
            .order_by(facts.c.created_at.desc(), facts.c.id)
            .with_for_update()
        ).mappings()
    )


def database_now(conn: Connection) -> datetime:
    """The database's clock: what orders writes that fronts stamp (their own clocks may differ)."""
    return conn.execute(select(func.clock_timestamp())).scalar_one()


def exists(conn: Connection, *, kind: str, entity_id: uuid.UUID) -> bool:
    table = MEMORY_TABLES[kind]
    return conn.execute(select(func.count()).where(table.c.id == entity_id)).scalar_one() > 0


def existing_ids(conn: Connection, *, kind: str, tenant_id: str, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``ids`` exist already in the tenant (one query for the batch, on the tenant-first key)."""
    table = MEMORY_TABLES[kind]
    query = select(table.c.id).where(table.c.tenant_id == tenant_id, table.c.id.in_(list(ids)))
    return set(conn.execute(query).scalars()) if ids else set()


def insert_rows(conn: Connection, *, kind: str, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        conn.execute(insert(MEMORY_TABLES[kind]), list(rows))


def add_rule_application(
    conn: Connection,
    *,
    tenant_id: str,
    rule_id: uuid.UUID,
    outcome: str,
    reason: str | None,
    actor: str,
    request_id: str | None,
    now: datetime,
) -> None:
    conn.execute(
        insert(rule_applications).values(
            tenant_id=tenant_id,
            rule_id=rule_id,
            outcome=outcome,
            reason=reason,
            actor=actor,
            request_id=request_id,
            occurred_at=now,
        )
    )


def move_rule_applications(conn: Connection, *, tenant_id: str, from_ids: Sequence[uuid.UUID], to_id: uuid.UUID) -> int:
    """Re-point the applications of ``from_ids`` at ``to_id`` (a merge of rules that say the same thing)."""
    return conn.execute(
        update(rule_applications)
        .where(rule_applications.c.tenant_id == tenant_id, rule_applications.c.rule_id.in_(list(from_ids)))
        .values(rule_id=to_id)
    ).rowcount


def rule_applications_of(conn: Connection, *, rule_id: uuid.UUID, limit: int = 1000) -> list[RowMapping]:
    """The rule's latest ``limit`` applications (outcome, reason, actor, occurred_at), newest first."""
    return list(
        conn.execute(
            select(
                rule_applications.c.outcome,
                rule_applications.c.reason,
                rule_applications.c.actor,
                rule_applications.c.occurred_at,
            )
            .where(rule_applications.c.rule_id == rule_id)
            .order_by(rule_applications.c.occurred_at.desc(), rule_applications.c.id.desc())
            .limit(limit)
        ).mappings()
    )


def harmful_reasons(conn: Connection, *, rule_id: uuid.UUID) -> list[str]:
    return list(
        conn.execute(
            select(rule_applications.c.reason)
            .where(
                rule_applications.c.rule_id == rule_id,
                rule_applications.c.outcome == "harmful",
                rule_applications.c.reason.is_not(None),
            )
            .order_by(rule_applications.c.occurred_at, rule_applications.c.id)
        ).scalars()
    )


def embedding_version_id(conn: Connection, version: ModelVersion) -> int:
    """Id of the (model, revision) row, created on first use (looked up first: every apply and consolidation
    batch asks, and the row nearly always exists)."""
    query = select(embedding_versions.c.id).where(
        embedding_versions.c.model == version.model, embedding_versions.c.revision == version.revision
    )
    found = conn.execute(query).scalar()
    if found is not None:
        return int(found)
    conn.execute(
        pg_insert(embedding_versions)
        .values(model=version.model, revision=version.revision, dimensions=version.dimensions)
        .on_conflict_do_nothing()
    )
    return int(conn.execute(query).scalar_one())


def sealed_contents(conn: Connection, *, tenant_id: str, ids: Sequence[uuid.UUID]) -> list[RowMapping]:
    """The sealed content, key id and predicate of the facts among ``ids`` that are sealed (this tenant's only)."""
    return list(
        conn.execute(
            select(facts.c.id, facts.c.predicate, facts.c.content_sealed, facts.c.content_key_id).where(
                facts.c.tenant_id == tenant_id, facts.c.id.in_(list(ids)), facts.c.content_sealed.is_not(None)
            )
        ).mappings()
    )
