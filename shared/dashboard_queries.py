"""The dashboard's read queries: filtered, paginated, deterministically ordered lists of facts, rules and episodes.

Every list is bounded by tenant and by the caller's Visibility (scopes for facts/rules, butlers for episodes), like
the retrieval path, and fetches ``limit + 1`` rows so the caller knows whether a next page exists without a count.
Functions take a Connection and never commit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from shared.scoring import effective_confidence_sql
from shared.writes import Visibility

FACT_COLUMNS = (
    "f.id, f.subject, f.predicate, f.content, f.scope, f.permanence, f.validity, f.confidence, "
    "f.importance, f.source_butler, f.source_episode_id, f.supersedes_id, f.superseded_by_id, "
    "f.superseded_at, f.created_at, f.last_confirmed_at, f.reference_count, f.tags"
)
RULE_COLUMNS = (
    "r.id, r.content, r.scope, r.maturity, r.validity, r.confidence, r.importance, r.permanence, "
    "r.effectiveness_score, r.applied_count, r.success_count, r.harmful_count, r.source_butler, "
    "r.source_episode_id, r.created_at, r.last_applied_at, r.last_confirmed_at, r.tags"
)
EPISODE_COLUMNS = (
    "e.id, e.butler, e.seq, e.session_id, e.content, e.importance, e.consolidation_status, "
    "e.consolidation_attempts, e.last_consolidation_error, e.created_at, e.expires_at, "
    "e.forgotten_at, e.reference_count"
)
# The playbook's reading order: the most trusted advice first, warnings last.
MATURITY_RANK = "CASE r.maturity WHEN 'proven' THEN 0 WHEN 'established' THEN 1 WHEN 'candidate' THEN 2 ELSE 3 END"


@dataclass(frozen=True)
class Page:
    """One page of a list; ``next_offset`` is None on the last page."""

    items: list[dict[str, Any]]
    next_offset: int | None


@contextmanager
def read_transaction(source: Engine | Connection, *, timeout_ms: int) -> Iterator[Connection]:
    """A read-only transaction bounded by ``statement_timeout`` (one snapshot for a page and its details), on a new
    connection of ``source`` or on the connection given (closed at the end)."""
    connection = source.connect() if isinstance(source, Engine) else source
    with connection.execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        conn.execute(
            text(
                f"SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = {int(timeout_ms)}; "
                "SET LOCAL plan_cache_mode = auto"  # on a read pool's connection, the session prefers generic plans
            )
        )
        yield conn


def _page(conn: Connection, sql: str, params: dict[str, Any], *, limit: int, offset: int) -> Page:
    rows = [
        dict(r)
        for r in conn.execute(
            text(f"{sql} LIMIT :limit OFFSET :offset"), {**params, "limit": limit + 1, "offset": offset}
        ).mappings()
    ]
    more = len(rows) > limit
    return Page(items=rows[:limit], next_offset=offset + limit if more else None)


def _scoped(alias: str, visibility: Visibility, params: dict[str, Any]) -> list[str]:
    clauses = [f"{alias}.tenant_id = :t"]
    if visibility.scopes is not None:
        clauses.append(f"{alias}.scope = ANY(:scopes)")
        params["scopes"] = list(visibility.scopes)
    return clauses


def list_facts(
    conn: Connection,
    *,
    tenant_id: str,
    visibility: Visibility,
    now: datetime,
    limit: int,
    offset: int,
    subject: str | None = None,
    q: str | None = None,
    min_confidence: float | None = None,
    permanence: str | None = None,
    source_butler: str | None = None,
    validity: Sequence[str] | None = None,
) -> Page:
    """Facts grouped for reading: by subject, predicate, newest first within a key, then id (deterministic)."""
    eff = effective_confidence_sql("f")
    params: dict[str, Any] = {"t": tenant_id, "now": now}
    where = _scoped("f", visibility, params)
    optional = (
        ("subject", subject, "f.subject = :subject"),
        ("q", q, "f.search_vector @@ plainto_tsquery('english', :q)"),
        ("min_confidence", min_confidence, f"{eff} >= :min_confidence"),
        ("permanence", permanence, "f.permanence = :permanence"),
        ("source_butler", source_butler, "f.source_butler = :source_butler"),
        ("validity", list(validity) if validity else None, "f.validity = ANY(:validity)"),
    )
    for name, value, clause in optional:
        if value is not None:
            where.append(clause)
            params[name] = value
    sql = (
        f"SELECT {FACT_COLUMNS}, {eff} AS effective_confidence FROM facts f WHERE {' AND '.join(where)} "
        "ORDER BY f.subject, f.predicate, f.created_at DESC, f.id"
    )
    return _page(conn, sql, params, limit=limit, offset=offset)


def list_rules(
    conn: Connection,
    *,
    tenant_id: str,
    visibility: Visibility,
    limit: int,
    offset: int,
    maturity: str | None = None,
    q: str | None = None,
    validity: Sequence[str] | None = None,
) -> Page:
    """Rules in playbook order: proven, established, candidate, anti-pattern; then effectiveness, age, id."""
    params: dict[str, Any] = {"t": tenant_id}
    where = _scoped("r", visibility, params)
    if maturity is not None:
        where.append("r.maturity = :maturity")
        params["maturity"] = maturity
    if q is not None:
        where.append("r.search_vector @@ plainto_tsquery('english', :q)")
        params["q"] = q
    if validity:
        where.append("r.validity = ANY(:validity)")
        params["validity"] = list(validity)
    sql = (
        f"SELECT {RULE_COLUMNS} FROM rules r WHERE {' AND '.join(where)} "
        f"ORDER BY {MATURITY_RANK}, r.effectiveness_score DESC, r.created_at DESC, r.id"
    )
    return _page(conn, sql, params, limit=limit, offset=offset)


def list_episodes(
    conn: Connection,
    *,
    tenant_id: str,
    visibility: Visibility,
    limit: int,
    offset: int,
    butler: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    status: str | None = None,
    include_forgotten: bool = False,
) -> Page:
    """Episodes newest first (then id, descending); forgotten ones only when asked for."""
    params: dict[str, Any] = {"t": tenant_id}
    where = ["e.tenant_id = :t"]
    if visibility.butlers is not None:
        where.append("e.butler = ANY(:butlers)")
        params["butlers"] = list(visibility.butlers)
    optional = (
        ("butler", butler, "e.butler = :butler"),
        ("start", start, "e.created_at >= :start"),
        ("end", end, "e.created_at < :end"),
        ("status", status, "e.consolidation_status = :status"),
    )
    for name, value, clause in optional:
        if value is not None:
            where.append(clause)
            params[name] = value
    if not include_forgotten:
        where.append("e.forgotten_at IS NULL")
    sql = f"SELECT {EPISODE_COLUMNS} FROM episodes e WHERE {' AND '.join(where)} ORDER BY e.created_at DESC, e.id DESC"
    return _page(conn, sql, params, limit=limit, offset=offset)


KNOWN_BUTLERS_SQL = "SELECT butler FROM shard_sequences WHERE tenant_id = :t ORDER BY butler"


def known_butlers(conn: Connection, *, tenant_id: str) -> list[str]:
    """Butlers that ever wrote to this tenant: every accepted write has a (tenant, butler) shard key."""
    return list(conn.execute(text(KNOWN_BUTLERS_SQL), {"t": tenant_id}).scalars())
