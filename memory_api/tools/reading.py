"""Read tools: search, recall, get. Scoped to the token (global + its butlers by default), fail-open: if the
database does not answer in time the result is empty with ``degraded: true`` rather than an error or a hang."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from memory_api.tools import access
from memory_api.tools.params import (
    MAX_LIMIT,
    Limit,
    Lineage,
    MemoryId,
    MemoryType,
    MinConfidence,
    Mode,
    Query,
    ReadScope,
    Since,
    Until,
)
from memory_api.tools.results import Hits, MemoryRecord
from memory_api.tools.runtime import Call, current_call, tool_call
from shared import protection
from shared.errors import Pending
from shared.schemas import Hit

ALL_TYPES: tuple[MemoryType, ...] = ("episode", "fact", "rule")


def _may_open(call: Call) -> bool:
    """Whether this caller reads sealed facts' plaintext (encryption.readers)."""
    return protection.may_open(call.principal, call.services.settings.encryption)


def _default_limit(call: Call) -> int:
    return min(call.services.settings.memory.retrieval.default_limit, MAX_LIMIT)


@tool_call
async def memory_search(
    ctx: Context,
    query: Query,
    types: Annotated[
        list[MemoryType],
        Field(
            min_length=1,
            max_length=3,
            description=("Which memory types to search: any of 'episode', 'fact', 'rule' (default: all)."),
        ),
    ]
    | None = None,
    scope: ReadScope | None = None,
    mode: Annotated[
        Mode,
        Field(
            description=(
                "'hybrid' (meaning + keywords, default), 'semantic' (meaning only) or 'keyword' (exact words)."
            )
        ),
    ]
    | None = None,
    limit: Limit | None = None,
    min_confidence: MinConfidence | None = None,
    since: Since | None = None,
    until: Until | None = None,
    request_context: Lineage | None = None,
) -> Hits:
    """Search memories by meaning and/or keywords across episodes, facts and rules, ranked by relevance (past the
    first ten hits, further hits of a session or subject already listed give way to others). Use it when you need
    specific past observations or exact terms; for "what should I know about X" prefer memory_recall. Returns
    scored hits (type, id, content, score, scope/butler, confidence annotations)."""
    call = current_call()
    visibility = access.read_visibility(call.principal, scope)
    settings = call.services.settings.memory.retrieval
    kinds = list(dict.fromkeys(types)) if types else list(ALL_TYPES)
    reader = call.reader()
    hits, reason = await call.read_or_degrade(
        lambda: reader.search(
            tenant_id=call.tenant,
            visibility=visibility,
            query=query,
            types=kinds,
            mode=mode or settings.default_mode,
            limit=limit or _default_limit(call),
            min_confidence=min_confidence,
            since=since,
            until=until,
            open_sealed=_may_open(call),
        ),
        list[Hit](),  # typed: from a bare [] mypy infers list[Never] for both arguments
    )
    return Hits(results=hits, count=len(hits), degraded=reason is not None, reason=reason, request_id=call.request_id)


@tool_call
async def memory_recall(
    ctx: Context,
    topic: Query,
    scope: ReadScope | None = None,
    limit: Limit | None = None,
    min_confidence: MinConfidence | None = None,
    request_context: Lineage | None = None,
) -> Hits:
    """The primary retrieval tool: the facts and rules most worth knowing about a topic, ranked by relevance,
    importance, recency and confidence. Call it before acting on a topic you may have history with. Fading
    memories are left out unless min_confidence=0. After a fact or rule proves right, call memory_confirm;
    after applying a rule, memory_mark_helpful or memory_mark_harmful."""
    call = current_call()
    visibility = access.read_visibility(call.principal, scope)
    reader = call.reader()
    hits, reason = await call.read_or_degrade(
        lambda: reader.recall(
            tenant_id=call.tenant,
            visibility=visibility,
            topic=topic,
            limit=limit or _default_limit(call),
            min_confidence=min_confidence,
            open_sealed=_may_open(call),
        ),
        list[Hit](),  # typed: from a bare [] mypy infers list[Never] for both arguments
    )
    return Hits(results=hits, count=len(hits), degraded=reason is not None, reason=reason, request_id=call.request_id)


@tool_call
async def memory_get(
    ctx: Context,
    type: Annotated[MemoryType, Field(description="'episode', 'fact' or 'rule'.")],
    id: MemoryId,
    request_context: Lineage | None = None,
) -> MemoryRecord:
    """Fetch one memory by type and id, with its links (supersedes, derived from, ...). status "ok" carries the
    memory; "pending" means the write was accepted and is not applied yet (ask again in a moment). Errors:
    not_found, permission_denied (outside your scope)."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    reader = call.reader(id)  # the primary if this front accepted ``id`` and the replicas have not replayed it

    def get() -> dict[str, Any]:
        return reader.get(
            tenant_id=call.tenant, visibility=visibility, kind=type, entity_id=id, open_sealed=_may_open(call)
        )

    try:
        row, reason = await call.read_or_degrade(get, None)
    except Pending as exc:
        return MemoryRecord(status="pending", type=type, id=str(id), reason=exc.message, request_id=call.request_id)
    if reason is not None:
        return MemoryRecord(
            status="degraded", type=type, id=str(id), degraded=True, reason=reason, request_id=call.request_id
        )
    return MemoryRecord(status="ok", type=type, id=str(id), memory=row, request_id=call.request_id)
