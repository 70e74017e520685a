"""Management and ops tools: stats, the activity stream, dead letters."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field, StringConstraints

from memory_api.tools import access
from memory_api.tools.params import MAX_ACTIVITY, Lineage, MemoryType, ReadScope
from memory_api.tools.results import Activity, DeadLetters, Event, Stats
from memory_api.tools.runtime import Call, current_call, tool_call
from memory_api.tools.services import opened
from shared.db import unit_of_work
from shared.deadletters import Redriven, drop, list_dead_letters, redrive, show_dead_letter
from shared.errors import InvalidInput, NotFound

DEFAULT_ACTIVITY = 100
# An ISO-8601 time or a cursor's digits fit in far less; a longer value is refused before it is parsed (a 1 MB
# "since" was echoed back whole in the error, and 5,000 digits passed isdigit() and crashed int()).
MAX_SINCE = 64


@tool_call
async def memory_stats(ctx: Context, scope: ReadScope | None = None, request_context: Lineage | None = None) -> Stats:
    """Health of memory: episode backlog (awaiting consolidation) and its age, fact confidence distribution,
    rule maturity and effectiveness, dead letters. Scope: a butler your token covers (default: your first
    butler); the whole tenant needs an admin token (scope '*' or omitted)."""
    call = current_call()
    scope_ = access.stats_scope(call.principal, scope)
    reader = call.reader()

    def work() -> dict[str, Any]:
        return reader.stats(tenant_id=call.tenant, scope=scope_)

    numbers, reason = await call.read_or_degrade(work, dict[str, Any]())  # typed: a bare {} would be dict[Never, Never]
    return Stats(scope=scope_, stats=numbers, degraded=reason is not None, reason=reason, request_id=call.request_id)


def parse_since(since: str | int) -> datetime | int:
    """An event-id cursor (an integer, or digits) or an ISO-8601 time (UTC when it has no offset)."""
    if isinstance(since, int) or (since.strip().isascii() and since.strip().isdigit()):
        cursor = int(since)
        if cursor < 0:
            raise InvalidInput("since: an event cursor is >= 0", field="since")
        return cursor
    try:
        when = datetime.fromisoformat(since.strip())
    except ValueError:
        raise InvalidInput(f"since: not an event cursor or an ISO-8601 time: {since!r}", field="since") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


@tool_call
async def memory_activity_stream(
    ctx: Context,
    since: Annotated[
        Annotated[str, StringConstraints(max_length=MAX_SINCE)] | int,
        Field(
            description=(
                "Where to start: next_cursor from the previous call (an event id), or an ISO-8601 time such as "
                "'2026-01-31T09:00:00Z'. Use 0 for the beginning."
            )
        ),
    ],
    scope: ReadScope | None = None,
    types: Annotated[
        list[MemoryType],
        Field(min_length=1, max_length=3, description=("Only events about these memory types (default: all).")),
    ]
    | None = None,
    limit: Annotated[int, Field(ge=1, le=MAX_ACTIVITY, description="Events per page, 1 to 1000; default 100.")]
    | None = None,
    request_context: Lineage | None = None,
) -> Activity:
    """The tenant's audit trail (memory_events), oldest first: stores, supersessions, confirmations, feedback,
    forgets, consolidation, maturity changes, with actor and request_id. For dashboards and ops (admin token).
    Scope: omitted or '*' for the whole tenant; a butler (or 'global') keeps the events about facts and rules in
    global + that scope and about that butler's episodes. Page with next_cursor."""
    call = current_call()
    access.require_admin(call.principal, "memory_activity_stream (the tenant's audit trail)")
    cursor = parse_since(since)
    reader = call.reader()
    rows, reason = await call.read_or_degrade(
        lambda: reader.activity(
            tenant_id=call.tenant,
            since=cursor,
            limit=limit or DEFAULT_ACTIVITY,
            entity_types=types,
            scope=None if scope == access.EVERY_SCOPE else scope,
        ),
        list[dict[str, Any]](),  # typed: from a bare [] mypy infers list[Never] for both arguments
    )
    events = [_event(r) for r in rows]
    next_cursor = events[-1].id if events else (cursor if isinstance(cursor, int) else None)
    return Activity(
        events=events, next_cursor=next_cursor, degraded=reason is not None, reason=reason, request_id=call.request_id
    )


def _event(row: dict[str, Any]) -> Event:
    entity = row.get("entity_id")
    return Event(**{**row, "entity_id": str(entity) if entity else None})


@tool_call
async def memory_dead_letters(
    ctx: Context,
    action: Annotated[
        Literal["list", "show", "redrive", "drop"],
        Field(
            description=(
                "'list' the tenant's dead letters (oldest first), 'show' one with its last error and full content, "
                "'redrive' one (or, with no id, all of them) back to pending and wake the workers, or 'drop' one "
                "(id required): delete it for good."
            )
        ),
    ],
    id: Annotated[uuid.UUID, Field(description="The dead episode's or write intent's id (show; redrive or drop one).")]
    | None = None,
    request_context: Lineage | None = None,
) -> DeadLetters:
    """Operator tool (admin token): episodes whose consolidation and writes whose apply failed every retry end
    as dead letters instead of vanishing, and stay until redriven or dropped (or their long retention ends).
    Inspect them and, once the cause is fixed, redrive them; drop what should never be applied."""
    call = current_call()
    access.require_admin(call.principal, "memory_dead_letters")
    if action in ("show", "drop") and id is None:
        raise InvalidInput(f"id: required to {action} a dead letter", field="id")
    engine, tenant = opened(call.services.engine), call.tenant

    def work() -> list[Any]:
        with unit_of_work(engine) as conn:
            if action == "list":
                return list_dead_letters(conn, tenant_id=tenant, limit=DEFAULT_ACTIVITY)
            if action == "show":
                assert id is not None  # refused above
                letter = show_dead_letter(conn, entity_id=id)
                return [letter] if letter is not None and letter.tenant_id == tenant else []
            if action == "drop":
                assert id is not None  # refused above
                return drop(conn, ids=[id], tenant_id=tenant, actor=call.actor().name)
            return redrive(conn, ids=[id] if id else None, tenant_id=tenant, actor=call.actor().name)

    found = await call.write(work)
    if action != "list" and id is not None and not found:
        raise NotFound(f"no dead letter with id {id} in this tenant", field="id")
    if action == "redrive":
        _wake_redriven(call, found)
    if action in ("redrive", "drop"):
        return DeadLetters(action=action, items=[_redriven(r) for r in found], request_id=call.request_id)
    return DeadLetters(action=action, items=[d.as_dict() for d in found], request_id=call.request_id)


def _redriven(r: Redriven) -> dict[str, Any]:
    return {"kind": r.kind, "id": str(r.id), "butler": r.butler}


def _wake_redriven(call: Call, done: list[Redriven]) -> None:
    """Episodes go back to consolidation, write intents to apply; a lost wake-up is re-sent by the sweeps."""
    publisher = call.services.publisher
    for kind, butler in sorted({(r.kind, r.butler) for r in done}):
        wake = publisher.wake_consolidate if kind == "episode" else publisher.wake_apply
        wake(call.tenant, butler)
