"""Feedback and lifecycle tools: confirm, mark helpful/harmful, forget, restore. Small synchronous writes, each
one transaction in the front (shared.writes), audited in memory_events with the caller's request_id."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field, StringConstraints
from sqlalchemy import Connection

from memory_api.tools import access
from memory_api.tools.params import Lineage, MemoryId, MemoryType
from memory_api.tools.results import Confirmed, Lifecycle, RuleFeedback
from memory_api.tools.runtime import Call, current_call, tool_call, utcnow
from shared import writes
from shared.db import unit_of_work

TypeArg = Annotated[MemoryType, Field(description="'episode', 'fact' or 'rule'.")]
Reason = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2_000),
                   Field(description="What went wrong when the rule was applied (kept as evidence).")]


async def _in_transaction(call: Call, fn: Callable[[Connection], dict[str, Any]]) -> dict[str, Any]:
    """One transaction in a worker thread; a classified refusal (not found, pending, ...) rolls it back."""
    engine = call.services.write_engine

    def work() -> dict[str, Any]:
        with unit_of_work(engine) as conn:
            return fn(conn)

    return await call.write(work)


@tool_call
async def memory_confirm(
    ctx: Context, type: Annotated[Literal["fact", "rule"], Field(description="'fact' or 'rule'.")], id: MemoryId,
    request_context: Lineage | None = None,
) -> Confirmed:
    """Call after you used a fact or rule and it proved accurate: resets its confidence decay (a fading memory
    becomes active again). Errors: not_found, pending (not applied yet: retry shortly), permission_denied,
    invalid_transition (it was forgotten or superseded: memory_restore brings back a forgotten one)."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    out = await _in_transaction(call, lambda conn: writes.confirm(
        conn, tenant_id=call.tenant, kind=type, entity_id=id, visibility=visibility, actor=call.actor(),
        now=utcnow()))
    return Confirmed(type=type, id=str(id), validity=out["validity"], last_confirmed_at=out["last_confirmed_at"],
                     request_id=call.request_id)


async def _mark(call: Call, rule_id: uuid.UUID, outcome: Literal["helpful", "harmful"],
                reason: str | None) -> RuleFeedback:
    visibility = access.default_visibility(call.principal)
    settings = call.services.settings.memory.rules
    out = await _in_transaction(call, lambda conn: writes.mark_rule(
        conn, tenant_id=call.tenant, rule_id=rule_id, outcome=outcome, reason=reason, visibility=visibility,
        actor=call.actor(), now=utcnow(), rules=settings))
    return RuleFeedback(rule_id=str(rule_id), outcome=outcome, maturity=out["maturity"],
                        effectiveness_score=out["effectiveness_score"], success_count=out["success_count"],
                        harmful_count=out["harmful_count"], request_id=call.request_id)


@tool_call
async def memory_mark_helpful(ctx: Context, rule_id: MemoryId, request_context: Lineage | None = None) -> RuleFeedback:
    """Call after applying a rule worked out. Raises its effectiveness; enough successes promote it from
    candidate to established to proven (more weight in recall and context)."""
    return await _mark(current_call(), rule_id, "helpful", None)


@tool_call
async def memory_mark_harmful(
    ctx: Context, rule_id: MemoryId, reason: Reason | None = None, request_context: Lineage | None = None,
) -> RuleFeedback:
    """Call when applying a rule caused a problem; say why in `reason`. A harmful mark weighs 4x a helpful one;
    a rule marked harmful repeatedly is inverted into an anti-pattern warning."""
    return await _mark(current_call(), rule_id, "harmful", reason)


@tool_call
async def memory_forget(ctx: Context, type: TypeArg, id: MemoryId, request_context: Lineage | None = None) -> Lifecycle:
    """Soft-delete a memory that is wrong or must not be used any more: it leaves search, recall and context
    at once (a fact becomes retracted). Recoverable with memory_restore; audited."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    await _in_transaction(call, lambda conn: writes.forget(
        conn, tenant_id=call.tenant, kind=type, entity_id=id, visibility=visibility, actor=call.actor(),
        now=utcnow()))
    return Lifecycle(type=type, id=str(id), status="retracted", request_id=call.request_id)


@tool_call
async def memory_restore(ctx: Context, type: TypeArg, id: MemoryId, request_context: Lineage | None = None) -> Lifecycle:
    """Undo memory_forget. A fact comes back only if no other fact is active for its subject and predicate
    (else integrity_violation: forget or supersede that one first)."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    await _in_transaction(call, lambda conn: writes.restore(
        conn, tenant_id=call.tenant, kind=type, entity_id=id, visibility=visibility, actor=call.actor()))
    return Lifecycle(type=type, id=str(id), status="restored", request_id=call.request_id)
