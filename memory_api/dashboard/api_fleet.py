"""Fleet-wide and per-butler views: stats, health charts, the activity feed, the knowledge browser's search, and
the four ``/api/butlers/{name}/memory/*`` views (facts and rules in global + name, that butler's episodes)."""

from __future__ import annotations

from typing import Any

from memory_api.dashboard.api_memory import episodes_page, facts_page, rules_page
from memory_api.dashboard.http import ApiCall, endpoint
from memory_api.dashboard.params import (
    ActivityQuery,
    ButlerEpisodeQuery,
    ButlerFactQuery,
    ButlerRuleQuery,
    ScopeQuery,
    SearchQuery,
)
from memory_api.tools import access
from memory_api.tools.runtime import utcnow
from memory_api.tools.services import opened
from shared import dashboard_health as health_queries
from shared import dashboard_queries as queries
from shared.errors import InvalidInput
from shared.reads import Reader
from shared.schemas import Hit
from shared.stats import stats as memory_stats
from shared.tenancy import NAME_RE
from shared.writes import Visibility


@endpoint()
async def me(call: ApiCall) -> dict[str, Any]:
    """Who the token is: the UI shows edit buttons to admins only (the API refuses them anyway)."""
    p = call.principal
    return {"tenant_id": p.tenant_id, "role": p.role, "butlers": list(p.butlers), "is_admin": p.is_admin}


@endpoint()
async def butlers(call: ApiCall) -> dict[str, Any]:
    """Butlers this token may open: the tenant's shard keys it covers, and the ones it names."""
    p = call.principal
    known = await call.read(lambda conn: queries.known_butlers(conn, tenant_id=call.tenant))
    named = [b for b in p.butlers if b != "*"]
    return {"butlers": sorted({b for b in known if p.covers(b)} | set(named))}


@endpoint(query=ScopeQuery)
async def stats(call: ApiCall) -> dict[str, Any]:
    scope = access.stats_scope(call.principal, call.query.scope)
    numbers = await call.read(
        lambda conn: memory_stats(
            conn, tenant_id=call.tenant, scope=scope, now=utcnow(), settings=call.services.settings
        )
    )
    return {"scope": scope, "stats": numbers}


@endpoint(query=ScopeQuery)
async def health(call: ApiCall) -> dict[str, Any]:
    """memory_stats (its confidence bands are the confidence chart) plus the rule-effectiveness histogram."""
    scope = access.stats_scope(call.principal, call.query.scope)
    numbers = await call.read(
        lambda conn: health_queries.health(
            conn, tenant_id=call.tenant, scope=scope, now=utcnow(), settings=call.services.settings
        )
    )
    return {"scope": scope, "health": numbers}


@endpoint(query=ActivityQuery)
async def activity(call: ApiCall) -> dict[str, Any]:
    """memory_events newest first; a butler token sees the events about its own scope (as memory_stats counts)."""
    q = call.query
    scope = access.stats_scope(call.principal, q.scope)
    events = await call.read(
        lambda conn: health_queries.activity(
            conn,
            tenant_id=call.tenant,
            before=q.before,
            limit=q.limit,
            scope=scope,
            entity_types=q.types,
            event_type=q.event_type,
        )
    )
    cursor = events[-1]["id"] if len(events) == q.limit else None
    return {"scope": scope, "events": events, "count": len(events), "next_cursor": cursor}


@endpoint(query=SearchQuery)
async def search(call: ApiCall) -> dict[str, Any]:
    """The knowledge browser: the hybrid search the tools use (fading memories included), then permanence."""
    q = call.query
    visibility = access.read_visibility(call.principal, q.scope)
    reader = _browser_reader(call)
    kinds = q.types or ["episode", "fact", "rule"]
    if q.permanence is not None:
        kinds = [k for k in kinds if k != "episode"]  # episodes have no permanence
    hits: list[Hit] = (
        await call.read(
            lambda _conn: reader.search(
                tenant_id=call.tenant,
                visibility=visibility,
                query=q.q,
                types=kinds,
                mode=q.mode,
                limit=q.limit,
                min_confidence=0.0,
            )
        )
        if kinds
        else []
    )
    if q.permanence is not None:
        hits = [h for h in hits if h.permanence == q.permanence]
    return {"results": [h.model_dump(mode="json") for h in hits], "count": len(hits)}


def _browser_reader(call: ApiCall) -> Reader:
    """A Reader like the tools' but without the reference bumper: a person browsing is not an agent using memory."""
    state = call.request.app.state
    reader = getattr(state, "dashboard_reader", None)
    if reader is None:
        from shared.embedding import get_query_embedder, get_token_counter

        services = call.services
        reader = Reader(
            engine=opened(services.engine),
            settings=services.settings,
            embed=get_query_embedder().embed_one,
            count_tokens=get_token_counter().count_many,
            bumper=None,
            plane=services.plane,
        )
        state.dashboard_reader = reader
    return reader.after(call.read_floor)


def _butler(call: ApiCall) -> tuple[str, Visibility]:
    """The path's butler, which the token must cover; global + its facts/rules and its episodes."""
    name = call.request.path_params["name"]
    if not NAME_RE.match(name):
        raise InvalidInput(f"name: {name!r} is not a butler name", field="name")
    access.require_butler(call.principal, name, field="name")
    return name, access.butler_visibility(name)


@endpoint()
async def butler_stats(call: ApiCall) -> dict[str, Any]:
    """memory_stats narrowed to the butler (with the effectiveness histogram), as memory_stats(scope=name)."""
    name, _ = _butler(call)
    numbers = await call.read(
        lambda conn: health_queries.health(
            conn, tenant_id=call.tenant, scope=name, now=utcnow(), settings=call.services.settings
        )
    )
    return {"butler": name, "scope": name, "stats": numbers}


@endpoint(query=ButlerFactQuery)
async def butler_facts(call: ApiCall) -> dict[str, Any]:
    name, visibility = _butler(call)
    return {"butler": name, **await facts_page(call, visibility)}


@endpoint(query=ButlerRuleQuery)
async def butler_rules(call: ApiCall) -> dict[str, Any]:
    name, visibility = _butler(call)
    return {"butler": name, **await rules_page(call, visibility)}


@endpoint(query=ButlerEpisodeQuery)
async def butler_episodes(call: ApiCall) -> dict[str, Any]:
    name, visibility = _butler(call)
    return {"butler": name, **await episodes_page(call, visibility, butler=name)}
