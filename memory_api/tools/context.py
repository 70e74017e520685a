"""Context tools: the token-budgeted "## Your Memory" block a butler puts in an agent's system prompt."""

from __future__ import annotations

import time
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from memory_api.tools import access
from memory_api.tools.params import Butler, ContextRequest, Lineage, Query, TokenBudget
from memory_api.tools.results import ContextBatch, ContextBlock
from memory_api.tools.runtime import Call, current_call, tool_call
from shared import protection
from shared.errors import InvalidInput, Unavailable


def _empty(call: Call, butler: str, budget: int, reason: str) -> ContextBlock:
    return ContextBlock(
        butler=butler,
        context="",
        tokens=0,
        token_budget=budget,
        included={},
        dropped=0,
        degraded=True,
        reason=reason,
        request_id=call.request_id,
    )


async def _block(call: Call, trigger_prompt: str, butler: str, token_budget: int | None) -> ContextBlock:
    """One block; Unavailable propagates so a batch can stop at the first one."""
    budget = token_budget or call.services.settings.memory.retrieval.context_token_budget
    reader = call.reader()
    block = await call.read(
        lambda: reader.context(
            tenant_id=call.tenant,
            visibility=access.butler_visibility(butler),
            trigger_prompt=trigger_prompt,
            token_budget=budget,
            open_sealed=protection.butler_may_open(butler, call.services.settings.encryption),
        )
    )
    return ContextBlock(
        butler=butler,
        context=block.text,
        tokens=block.tokens,
        token_budget=budget,
        included=block.included,
        dropped=block.dropped,
        request_id=call.request_id,
    )


@tool_call
async def memory_context(
    ctx: Context,
    trigger_prompt: Annotated[Query, Field(description="The task or user message the session starts with.")],
    butler: Butler,
    token_budget: TokenBudget | None = None,
    request_context: Lineage | None = None,
) -> ContextBlock:
    """Call at session start: builds the memory block to inject into the agent's system prompt — the facts,
    rules, warnings and recent episodes most relevant to trigger_prompt for this butler, highest first, never
    over token_budget (default 3000). Put `context` at the top of the prompt as is. If memory is unavailable
    the block is empty and degraded is true: start the session without it."""
    call = current_call()
    access.require_butler(call.principal, butler)
    try:
        return await _block(call, trigger_prompt, butler, token_budget)
    except Unavailable as exc:
        call.outcome = "degraded"
        budget = token_budget or call.services.settings.memory.retrieval.context_token_budget
        return _empty(call, butler, budget, exc.message)


@tool_call
async def memory_context_batch(
    ctx: Context,
    requests: Annotated[
        list[ContextRequest],
        Field(min_length=1, description=("Blocks to build, each {trigger_prompt, butler, token_budget?}.")),
    ],
    request_context: Lineage | None = None,
) -> ContextBatch:
    """memory_context for many sessions at once (a daemon starting several agents): one block per request, in
    order. Every butler must be one your token covers; at most api.context_batch_max_requests requests (64) and
    api.context_batch_max_tokens tokens of budget in all. Blocks not built within the batch's deadline come back
    empty with degraded=true."""
    call = current_call()
    _check_batch(call, requests)
    api = call.services.settings.api
    deadline = time.monotonic() + api.context_batch_deadline_seconds
    blocks: list[ContextBlock] = []
    reason: str | None = None
    for req in requests:
        if reason is None:
            try:
                with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                    blocks.append(await _block(call, req.trigger_prompt, req.butler, req.token_budget))
                continue
            except Unavailable as exc:  # the rest would wait as long again: answer them empty right away
                reason, call.outcome = exc.message, "degraded"
            except TimeoutError:
                reason, call.outcome = (
                    (
                        f"the batch's deadline ({api.context_batch_deadline_seconds:g}s) passed; "
                        "the blocks not built by then are empty"
                    ),
                    "degraded",
                )
        budget = req.token_budget or call.services.settings.memory.retrieval.context_token_budget
        blocks.append(_empty(call, req.butler, budget, reason))
    return ContextBatch(results=blocks, degraded=reason is not None, reason=reason, request_id=call.request_id)


def _check_batch(call: Call, requests: list[ContextRequest]) -> None:
    """The batch's total work is bounded: so many blocks and so many tokens of budget in all (nothing is done)."""
    api = call.services.settings.api
    cap = min(api.max_batch, api.context_batch_max_requests)
    if len(requests) > cap:
        raise InvalidInput(f"requests: at most {cap} per call (got {len(requests)})", field="requests")
    default = call.services.settings.memory.retrieval.context_token_budget
    total = sum(req.token_budget or default for req in requests)
    if total > api.context_batch_max_tokens:
        raise InvalidInput(
            f"requests: the token budgets add up to {total}, at most {api.context_batch_max_tokens} "
            "per call (split the batch or ask for smaller blocks)",
            field="requests",
        )
    for i, req in enumerate(requests):
        access.require_butler(call.principal, req.butler, field=f"requests.{i}.butler")
