"""Facts, rules and episodes: browse with filters, open one with its provenance, correct it. Reads see what the
token's tools see (global + its butlers); edits, deletes and lifecycle actions need an admin token and go through
the same domain services as the MCP tools (shared.writes, shared.curation), audited in memory_events."""

from __future__ import annotations

from typing import Any, Literal

from memory_api.dashboard.http import ApiCall, endpoint
from memory_api.dashboard.params import EpisodeQuery, FactEdit, FactQuery, RuleEdit, RuleQuery
from memory_api.tools import access
from memory_api.tools.runtime import utcnow
from shared import curation, protection, writes
from shared import dashboard_details as details
from shared import dashboard_queries as queries
from shared.dashboard_queries import Page
from shared.embedding import get_query_embedder
from shared.writes import Visibility


def page_body(page: Page, *, limit: int, offset: int) -> dict[str, Any]:
    return {
        "items": page.items,
        "count": len(page.items),
        "limit": limit,
        "offset": offset,
        "next_offset": page.next_offset,
    }


def _protect(call: ApiCall) -> curation.Protect:
    """Redaction and sealing for an edit, as for every write (shared.protection)."""
    settings = call.services.settings
    return lambda write: protection.protect(
        write, tenant_id=call.tenant, redaction=settings.redaction, encryption=settings.encryption
    )


def _admin(call: ApiCall, what: str) -> writes.Visibility:
    access.require_admin(call.principal, f"{what} from the dashboard")
    return access.default_visibility(call.principal)


@endpoint(query=FactQuery)
async def list_facts(call: ApiCall) -> dict[str, Any]:
    q = call.query
    visibility = access.read_visibility(call.principal, q.scope)
    return await facts_page(call, visibility)


@endpoint()
async def get_fact(call: ApiCall) -> dict[str, Any]:
    fact_id, visibility = call.path_id(), access.default_visibility(call.principal)
    return await call.read(
        lambda conn: details.fact_detail(
            conn, tenant_id=call.tenant, fact_id=fact_id, visibility=visibility, now=utcnow()
        )
    )


@endpoint(body=FactEdit)
async def edit_fact(call: ApiCall) -> dict[str, Any]:
    fact_id, visibility = call.path_id(), _admin(call, "editing a fact")
    embedder = get_query_embedder()
    return await call.write(
        lambda conn: curation.edit_fact(
            conn,
            tenant_id=call.tenant,
            fact_id=fact_id,
            changes=call.body.changes(),
            visibility=visibility,
            actor=call.actor(),
            embed=embedder.embed_one,
            version=embedder.version,
            protect=_protect(call),
        )
    )


async def _lifecycle(call: ApiCall, kind: str, action: Literal["forget", "restore", "confirm"]) -> dict[str, Any]:
    """Forget (soft delete: retracted), restore or confirm, exactly as memory_forget/restore/confirm do."""
    entity_id, visibility = call.path_id(), _admin(call, f"{action} a {kind}")
    common: dict[str, Any] = {
        "tenant_id": call.tenant,
        "kind": kind,
        "entity_id": entity_id,
        "visibility": visibility,
        "actor": call.actor(),
    }
    if action == "forget":
        return await call.write(lambda conn: writes.forget(conn, now=utcnow(), **common))
    if action == "confirm":
        return await call.write(lambda conn: writes.confirm(conn, now=utcnow(), **common))
    return await call.write(lambda conn: writes.restore(conn, **common))


@endpoint()
async def delete_fact(call: ApiCall) -> dict[str, Any]:
    return await _lifecycle(call, "fact", "forget")


@endpoint()
async def restore_fact(call: ApiCall) -> dict[str, Any]:
    return await _lifecycle(call, "fact", "restore")


@endpoint()
async def confirm_fact(call: ApiCall) -> dict[str, Any]:
    return await _lifecycle(call, "fact", "confirm")


@endpoint(query=RuleQuery)
async def list_rules(call: ApiCall) -> dict[str, Any]:
    q = call.query
    visibility = access.read_visibility(call.principal, q.scope)
    return await rules_page(call, visibility)


@endpoint()
async def get_rule(call: ApiCall) -> dict[str, Any]:
    rule_id, visibility = call.path_id(), access.default_visibility(call.principal)
    return await call.read(
        lambda conn: details.rule_detail(conn, tenant_id=call.tenant, rule_id=rule_id, visibility=visibility)
    )


@endpoint(body=RuleEdit)
async def edit_rule(call: ApiCall) -> dict[str, Any]:
    rule_id, visibility = call.path_id(), _admin(call, "editing a rule")
    embedder = get_query_embedder()
    return await call.write(
        lambda conn: curation.edit_rule(
            conn,
            tenant_id=call.tenant,
            rule_id=rule_id,
            changes=call.body.changes(),
            visibility=visibility,
            actor=call.actor(),
            now=utcnow(),
            embed=embedder.embed_one,
            version=embedder.version,
            protect=_protect(call),
        )
    )


@endpoint()
async def delete_rule(call: ApiCall) -> dict[str, Any]:
    return await _lifecycle(call, "rule", "forget")


@endpoint()
async def restore_rule(call: ApiCall) -> dict[str, Any]:
    return await _lifecycle(call, "rule", "restore")


async def _move(call: ApiCall, direction: Literal["promote", "demote"]) -> dict[str, Any]:
    rule_id, visibility = call.path_id(), _admin(call, f"{direction} a rule")
    return await call.write(
        lambda conn: curation.move_rule(
            conn, tenant_id=call.tenant, rule_id=rule_id, direction=direction, visibility=visibility, actor=call.actor()
        )
    )


@endpoint()
async def promote_rule(call: ApiCall) -> dict[str, Any]:
    return await _move(call, "promote")


@endpoint()
async def demote_rule(call: ApiCall) -> dict[str, Any]:
    return await _move(call, "demote")


@endpoint()
async def disable_rule(call: ApiCall) -> dict[str, Any]:
    """Disable = the rule's retraction (out of recall and context, reversible with restore), as DELETE."""
    return await _lifecycle(call, "rule", "forget")


@endpoint(query=EpisodeQuery)
async def list_episodes(call: ApiCall) -> dict[str, Any]:
    q = call.query
    visibility = access.default_visibility(call.principal)
    if q.butler is not None:
        access.require_butler(call.principal, q.butler)
    return await episodes_page(call, visibility, butler=q.butler)


@endpoint()
async def get_episode(call: ApiCall) -> dict[str, Any]:
    episode_id, visibility = call.path_id(), access.default_visibility(call.principal)
    return await call.read(
        lambda conn: details.episode_detail(
            conn, tenant_id=call.tenant, episode_id=episode_id, visibility=visibility, now=utcnow()
        )
    )


async def facts_page(call: ApiCall, visibility: Visibility) -> dict[str, Any]:
    """A page of the facts ``visibility`` shows, filtered by the query's fact filters (the tenant's list and a
    butler's)."""
    q = call.query
    page = await call.read(
        lambda conn: queries.list_facts(
            conn,
            tenant_id=call.tenant,
            visibility=visibility,
            now=utcnow(),
            limit=q.limit,
            offset=q.offset,
            subject=q.subject,
            q=q.q,
            min_confidence=q.min_confidence,
            permanence=q.permanence,
            source_butler=q.source_butler,
            validity=q.validity,
        )
    )
    return page_body(page, limit=q.limit, offset=q.offset)


async def rules_page(call: ApiCall, visibility: Visibility) -> dict[str, Any]:
    """A page of the rules ``visibility`` shows, filtered by the query's rule filters."""
    q = call.query
    page = await call.read(
        lambda conn: queries.list_rules(
            conn,
            tenant_id=call.tenant,
            visibility=visibility,
            limit=q.limit,
            offset=q.offset,
            maturity=q.maturity,
            q=q.q,
            validity=q.validity,
        )
    )
    return page_body(page, limit=q.limit, offset=q.offset)


async def episodes_page(call: ApiCall, visibility: Visibility, *, butler: str | None) -> dict[str, Any]:
    """A page of the episodes ``visibility`` shows (of ``butler`` only, if given), filtered by the query."""
    q = call.query
    page = await call.read(
        lambda conn: queries.list_episodes(
            conn,
            tenant_id=call.tenant,
            visibility=visibility,
            limit=q.limit,
            offset=q.offset,
            butler=butler,
            start=q.start,
            end=q.end,
            status=q.status,
            include_forgotten=q.include_forgotten,
        )
    )
    return page_body(page, limit=q.limit, offset=q.offset)
