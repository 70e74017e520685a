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
from memory_api.tools.services import opened
from shared import protection, receipts, writes
from shared.db import unit_of_work

TypeArg = Annotated[MemoryType, Field(description="'episode', 'fact' or 'rule'.")]
Reason = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=2_000),
    Field(description="What went wrong when the rule was applied (kept as evidence)."),
]


FeedbackKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200),
    Field(
        description=(
            "Optional key that makes a retry safe: the same key and arguments answer the first call's result and record "
            "nothing new; the same key with other arguments is refused (idempotency_conflict)."
        )
    ),
]


async def _in_transaction(
    call: Call, about: uuid.UUID, fn: Callable[[Connection], dict[str, Any]], receipt: receipts.Receipt | None = None
) -> dict[str, Any]:
    """One transaction in a worker thread; a classified refusal (not found, pending, ...) rolls it back. With a
    ``receipt`` (an idempotency key) a replay answers the first call's stored result and changes nothing.

    Done at once, so this caller's next reads (and any read of ``about``) see it, on a replica or the primary."""
    engine = opened(call.services.write_engine)

    def work() -> dict[str, Any]:
        with unit_of_work(engine) as conn:
            if receipt is not None:
                prior = receipts.claim(conn, receipt=receipt)
                if prior is not None:
                    return {**prior, "replayed": True}
            out = fn(conn)
            if receipt is not None:
                receipts.record(conn, receipt=receipt, result=out)
        call.wrote([about], synchronous=True)
        return out

    return await call.write(work)


def _receipt(call: Call, key: str | None, tool: str, entity_id: uuid.UUID, **arguments: Any) -> receipts.Receipt | None:
    if key is None:
        return None
    return receipts.Receipt(
        tenant_id=call.tenant,
        butler=call.principal.default_butler,
        key=key,
        tool=tool,
        entity_id=entity_id,
        arguments=arguments,
    )


@tool_call
async def memory_confirm(
    ctx: Context,
    type: Annotated[Literal["fact", "rule"], Field(description="'fact' or 'rule'.")],
    id: MemoryId,
    idempotency_key: FeedbackKey | None = None,
    request_context: Lineage | None = None,
) -> Confirmed:
    """Call after you used a fact or rule and it proved accurate: resets its confidence decay (a fading memory
    becomes active again). Errors: not_found, pending (not applied yet: retry shortly), permission_denied,
    invalid_transition (it was forgotten or superseded: memory_restore brings back a forgotten one). Pass an
    idempotency_key to make a retry safe (one confirmation is recorded)."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    out = await _in_transaction(
        call,
        id,
        lambda conn: writes.confirm(
            conn,
            tenant_id=call.tenant,
            kind=type,
            entity_id=id,
            visibility=visibility,
            actor=call.actor(),
            now=utcnow(),
        ),
        _receipt(call, idempotency_key, "memory_confirm", id, type=type),
    )
    return Confirmed(
        type=type,
        id=str(id),
        validity=out["validity"],
        last_confirmed_at=out["last_confirmed_at"],
        replayed=out.get("replayed", False),
        request_id=call.request_id,
    )


async def _mark(
    call: Call, rule_id: uuid.UUID, outcome: Literal["helpful", "harmful"], reason: str | None, key: str | None
) -> RuleFeedback:
    visibility = access.default_visibility(call.principal)
    settings = call.services.settings.memory.rules
    # The reason is stored in rule_applications, its event and (on inversion) the rule's content: redacted first.
    reason = protection.redact_text(reason, protection.redaction_policy(call.services.settings.redaction, call.tenant))
    out = await _in_transaction(
        call,
        rule_id,
        lambda conn: writes.mark_rule(
            conn,
            tenant_id=call.tenant,
            rule_id=rule_id,
            outcome=outcome,
            reason=reason,
            visibility=visibility,
            actor=call.actor(),
            now=utcnow(),
            rules=settings,
        ),
        _receipt(call, key, f"memory_mark_{outcome}", rule_id, reason=reason),
    )
    return RuleFeedback(
        rule_id=str(rule_id),
        outcome=outcome,
        maturity=out["maturity"],
        effectiveness_score=out["effectiveness_score"],
        success_count=out["success_count"],
        harmful_count=out["harmful_count"],
        replayed=out.get("replayed", False),
        request_id=call.request_id,
    )


@tool_call
async def memory_mark_helpful(
    ctx: Context, rule_id: MemoryId, idempotency_key: FeedbackKey | None = None, request_context: Lineage | None = None
) -> RuleFeedback:
    """Call after applying a rule worked out. Raises its effectiveness and confirms the rule (resets its decay);
    enough successes promote it from candidate to established to proven (more weight in recall and context).
    Pass an idempotency_key to make a retry safe (one application is recorded)."""
    return await _mark(current_call(), rule_id, "helpful", None, idempotency_key)


@tool_call
async def memory_mark_harmful(
    ctx: Context,
    rule_id: MemoryId,
    reason: Reason | None = None,
    idempotency_key: FeedbackKey | None = None,
    request_context: Lineage | None = None,
) -> RuleFeedback:
    """Call when applying a rule caused a problem; say why in `reason`. A harmful mark weighs 4x a helpful one;
    a rule marked harmful repeatedly is inverted into an anti-pattern warning. Pass an idempotency_key to make a
    retry safe (one application is recorded)."""
    return await _mark(current_call(), rule_id, "harmful", reason, idempotency_key)


@tool_call
async def memory_forget(ctx: Context, type: TypeArg, id: MemoryId, request_context: Lineage | None = None) -> Lifecycle:
    """Soft-delete a memory that is wrong or must not be used any more: it leaves search, recall and context
    at once (a fact becomes retracted), its text leaves the write log and the audit trail, and facts and rules
    learned only from a forgotten episode are retracted with it. Recoverable with memory_restore; audited."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    await _in_transaction(
        call,
        id,
        lambda conn: writes.forget(
            conn,
            tenant_id=call.tenant,
            kind=type,
            entity_id=id,
            visibility=visibility,
            actor=call.actor(),
            now=utcnow(),
        ),
    )
    return Lifecycle(type=type, id=str(id), status="retracted", request_id=call.request_id)


@tool_call
async def memory_restore(
    ctx: Context, type: TypeArg, id: MemoryId, request_context: Lineage | None = None
) -> Lifecycle:
    """Undo memory_forget (what an episode's forget retracted comes back with it). A fact comes back only if no
    other fact is active for its subject and predicate (else integrity_violation: forget or supersede that one
    first)."""
    call = current_call()
    visibility = access.default_visibility(call.principal)
    await _in_transaction(
        call,
        id,
        lambda conn: writes.restore(
            conn, tenant_id=call.tenant, kind=type, entity_id=id, visibility=visibility, actor=call.actor()
        ),
    )
    return Lifecycle(type=type, id=str(id), status="restored", request_id=call.request_id)
