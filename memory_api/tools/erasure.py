"""The right to erasure over MCP: an admin purges its own tenant (``memory-butler tenants purge`` is the operator's
command for any tenant). Every row of the tenant goes; a tombstone outside the tenant records it."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from memory_api.tools import access
from memory_api.tools.params import Lineage
from memory_api.tools.results import Purged
from memory_api.tools.runtime import current_call, tool_call
from memory_api.tools.services import opened
from shared.db import unit_of_work
from shared.errors import InvalidInput
from shared.purge import purge_tenant


@tool_call
async def memory_purge_tenant(
    ctx: Context,
    confirm_tenant: Annotated[
        str,
        Field(
            max_length=63,
            description=(
                "Your tenant's id, typed out, to confirm: every memory, token and audit row of it is deleted for good."
            ),
        ),
    ],
    request_context: Lineage | None = None,
) -> Purged:
    """Admin only, no undo: erase this token's tenant (episodes, facts, rules, links, feedback, pending writes,
    tokens - this one included - and the audit trail). One tombstone row outside the tenant records who purged
    it, when, and how many rows went."""
    call = current_call()
    access.require_admin(call.principal, "memory_purge_tenant")
    if confirm_tenant != call.tenant:
        raise InvalidInput("confirm_tenant: type this token's tenant id to confirm the purge", field="confirm_tenant")
    engine, actor = opened(call.services.engine), f"admin:{call.principal.token_id}"

    def work() -> dict[str, Any]:
        with unit_of_work(engine) as conn:
            return purge_tenant(conn, tenant_id=call.tenant, actor=actor)

    tombstone = await call.write(work)
    if call.services.token_cache is not None:  # this front stops honouring the tenant's tokens at once
        call.services.token_cache.evict_tenant(call.tenant)
    return Purged(
        tenant=tombstone["tenant"],
        purge_id=tombstone["purge_id"],
        counts=tombstone["counts"],
        request_id=call.request_id,
    )
