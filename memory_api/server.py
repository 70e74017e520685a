"""The MCP front: every memory tool over stateless streamable HTTP at /mcp (any number of fronts can run behind a
load balancer), plus /healthz, /metrics and the dashboard (/api and its web UI), behind bearer-token auth. Or the
same tools over stdio.

Auth: ``Authorization: Bearer mb_...``. A resolved token is cached in-process for ``token_ttl`` seconds (30 by
default) so calls do not hit the database for it; a revoked token therefore keeps working on a front for at
most that long. A token that is not well formed (``mb_`` + 43 url-safe characters) is refused before any
database work; unknown well-formed ones are looked up on a few threads of their own (never the tools') and
cached for a few seconds apart from the valid ones, so a flood of bad tokens can neither load the database nor
flush the valid entries. Tool calls may be limited per token (api.token_*: rate_limited, retryable).
/healthz is open; /metrics needs an admin token (its tenant's gauges) or an operator token (the fleet's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
from mcp.server._otel import OpenTelemetryMiddleware as SdkTracing
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from sqlalchemy.pool import QueuePool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from memory_api import dashboard
from memory_api.tools import build_tools
from memory_api.tools.runtime import PRINCIPAL_SCOPE_KEY, utcnow
from memory_api.tools.services import Services, opened
from shared import stats as shared_stats
from shared import telemetry, tracing
from shared.config import ConfigError, Settings
from shared.db import unit_of_work
from shared.errors import Unavailable
from shared.tenancy import ALL_BUTLERS, Principal, hash_token, resolve_token, well_formed

log = logging.getLogger("memory_butler.api")

TOKEN_TTL_S = 30.0
NEGATIVE_TTL_S = 5.0
MAX_CACHED_TOKENS = 10_000
MAX_NEGATIVE_TOKENS = 10_000
AUTH_DEADLINE_S = 3.0
HEALTH_DEADLINE_S = 2.0
OPEN_PATHS = frozenset({"/healthz"})

INSTRUCTIONS = """\
Memory Butler is the shared long-term memory of your butler fleet.
- At session start call memory_context(trigger_prompt, butler) and put the returned `context` in your prompt.
- Before acting on a topic you may have history with, call memory_recall(topic); use memory_search for exact
  words or past episodes.
- When you learn something durable, memory_store_fact (subject, predicate, content); a newer fact for the same
  subject+predicate supersedes the old one. When you find a behaviour worth repeating, memory_store_rule.
- After a recalled fact or rule proved right, memory_confirm it; after applying a rule, memory_mark_helpful or
  memory_mark_harmful (with a reason). memory_forget removes a wrong memory (undo with memory_restore).
- Writes answer "accepted" at once and are applied moments later; reads never block your work: if memory is
  unavailable they answer empty with degraded=true. Errors come back as {error, message, field, retryable}.
"""


def build_server(services: Services) -> MCPServer:
    """The MCP server with every tool; its lifespan opens the process's resources."""
    server = MCPServer(
        "memory-butler",
        title="Memory Butler",
        instructions=INSTRUCTIONS,
        version="0.1.0",
        tools=build_tools(),
        lifespan=services.lifespan,
    )
    lean_sdk(server)
    return server


def lean_sdk(server: MCPServer) -> None:
    """Leave out what the SDK does per request that the front does not use (call it after ``tracing.setup``).

    - Its INFO line per stateless request ("Terminating session: None"): noise beside our one line per tool call,
      and on the SDK's default handler it was half of a no-op call's CPU.
    - While tracing is off, its OpenTelemetry middleware, which opens a non-recording span for every message (the
      SDK documents dropping it as the way to opt out). With tracing on it stays: its "tools/call <tool>" span is
      the parent of ours.
    """
    logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)
    if not tracing.enabled():
        middleware = server._lowlevel_server.middleware  # noqa: SLF001 - the SDK's documented opt-out is this list
        middleware[:] = [m for m in middleware if not isinstance(m, SdkTracing)]


class TokenCache:
    """token hash → (Principal or None, expiry). Touched only from the event loop, so it needs no lock.

    Known and unknown tokens are kept apart, each bounded: a flood of junk tokens evicts junk (expired first,
    then the oldest half), never the valid entries that spare the database a look-up per call.
    """

    def __init__(
        self,
        *,
        ttl: float = TOKEN_TTL_S,
        negative_ttl: float = NEGATIVE_TTL_S,
        max_entries: int = MAX_CACHED_TOKENS,
        max_negative: int = MAX_NEGATIVE_TOKENS,
    ) -> None:
        self.ttl, self.negative_ttl = ttl, negative_ttl
        self.max_entries, self.max_negative = max_entries, max_negative
        self._valid: dict[str, tuple[Principal, float]] = {}
        self._invalid: dict[str, float] = {}

    def get(self, key: str) -> tuple[bool, Principal | None]:
        now = time.monotonic()
        entry = self._valid.get(key)
        if entry is not None and entry[1] > now:
            return True, entry[0]
        expiry = self._invalid.get(key)
        if expiry is not None and expiry > now:
            return True, None
        return False, None

    def put(self, key: str, principal: Principal | None) -> None:
        now = time.monotonic()
        if principal is not None:
            self._invalid.pop(key, None)
            self._valid = _bounded(self._valid, self.max_entries, now, lambda v: v[1])
            self._valid[key] = (principal, now + self.ttl)
        else:
            self._invalid = _bounded(self._invalid, self.max_negative, now, lambda v: v)
            self._invalid[key] = now + self.negative_ttl

    def __len__(self) -> int:
        return len(self._valid) + len(self._invalid)

    def evict_tenant(self, tenant_id: str) -> None:
        """Forget every cached principal of ``tenant_id`` (its tokens were purged): they resolve again, to nothing."""
        self._valid = {k: v for k, v in self._valid.items() if v[0].tenant_id != tenant_id}


def _bounded(entries: dict[str, Any], cap: int, now: float, expiry: Callable[[Any], float]) -> dict[str, Any]:
    """Room for one more: drop the expired entries, and if that is not enough the oldest half (insertion order)."""
    if len(entries) < cap:
        return entries
    live = {k: v for k, v in entries.items() if expiry(v) > now}
    if len(live) >= cap:
        live = dict(list(live.items())[len(live) // 2 :])
    return live


class BearerAuth:
    """ASGI middleware: resolve the bearer token to a Principal (cached) and put it on the scope, or answer 401."""

    def __init__(self, app: ASGIApp, *, services: Services, cache: TokenCache) -> None:
        self.app, self.services, self.cache = app, services, cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or dashboard.is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        if not token:
            await _deny(401, "missing bearer token: send 'Authorization: Bearer <token>'")(scope, receive, send)
            return
        try:
            principal = await self.principal(token)
        except Unavailable as exc:
            await _deny(503, f"cannot check the token: {exc.message}", retryable=True)(scope, receive, send)
            return
        if principal is None or principal.expired(utcnow()):  # a cached entry must not outlive its token
            log.info("bearer token refused", extra={"path": scope["path"], "outcome": "unauthorized"})
            await _deny(401, "invalid, revoked or expired token")(scope, receive, send)
            return
        if principal.is_operator and scope["path"] != "/metrics":  # an operator reads the fleet's health only
            await _deny(403, "an operator token reads /metrics only; memory needs a butler or admin token")(
                scope, receive, send
            )
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.app(scope, receive, send)

    async def principal(self, token: str) -> Principal | None:
        if not well_formed(token):  # not one of ours: no database work, nothing cached
            return None
        key = hash_token(token)
        hit, principal = self.cache.get(key)
        if hit:
            return principal
        engine = opened(self.services.engine)

        def resolve() -> Principal | None:
            with unit_of_work(engine) as conn:
                return resolve_token(conn, token=token)

        principal = await self.services.in_thread(resolve, deadline=AUTH_DEADLINE_S, limiter=self.services.auth_limiter)
        self.cache.put(key, principal)
        return principal


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _deny(status: int, message: str, *, retryable: bool = False) -> Response:
    code = {401: "unauthorized", 403: "permission_denied", 503: "unavailable"}[status]
    headers = {"WWW-Authenticate": 'Bearer realm="memory-butler"'} if status == 401 else None
    return JSONResponse(
        {"error": code, "message": message, "retryable": retryable}, status_code=status, headers=headers
    )


def _healthz(services: Services) -> Callable[[Request], Awaitable[Response]]:
    async def healthz(_: Request) -> Response:
        engine = opened(services.engine)

        def ping() -> None:
            with engine.connect():  # a pooled connection is pinged on checkout (pool_pre_ping); a new one connects
                pass

        started = time.perf_counter()
        try:
            await services.in_thread(ping, deadline=HEALTH_DEADLINE_S)
        except Unavailable as exc:
            return JSONResponse({"status": "unavailable", "reason": exc.message}, status_code=503)
        return JSONResponse({"status": "ok", "database_ms": round((time.perf_counter() - started) * 1000, 2)})

    return healthz


def _metrics(services: Services) -> Callable[[Request], Awaitable[Response]]:
    async def metrics(request: Request) -> Response:
        principal: Principal = request.scope[PRINCIPAL_SCOPE_KEY]
        if not (principal.is_admin or principal.is_operator):
            return _deny(
                403,
                "/metrics needs an admin token (its tenant's gauges) or an operator token (every "
                "tenant's, and the maintenance runs)",
            )
        from memory_workers.enqueue import maintenance_periods, queue_depths  # the workers' enqueue surface

        engine, settings = opened(services.engine), services.settings
        fleet = principal.is_operator  # an admin sees its own tenant's shard keys only, and nothing fleet-wide

        def gauges() -> list[Any]:
            with unit_of_work(engine) as conn:
                rows = shared_stats.gauges(conn, now=utcnow(), tenant_id=None if fleet else principal.tenant_id)
                families = telemetry.key_families(rows)
                if fleet:
                    families += telemetry.maintenance_families(
                        shared_stats.maintenance_times(conn), maintenance_periods(settings)
                    )
                    families += telemetry.fleet_families(queue_depths=None, db=shared_stats.db_connections(conn))
                return families

        body = telemetry.process_text()
        try:
            families, up = await services.in_thread(gauges, deadline=HEALTH_DEADLINE_S), True
        except Unavailable:
            families, up = [], False
        if fleet:
            try:
                depths = await services.in_thread(lambda: queue_depths(settings), deadline=HEALTH_DEADLINE_S)
                families += telemetry.fleet_families(queue_depths=depths, db=None)
            except Unavailable:
                log.warning("queue depths not read: the broker did not answer")
        families += telemetry.front_families(database_up=up, pool_checked_out=cast(QueuePool, engine.pool).checkedout())
        if services.batcher is not None:
            families += telemetry.query_batcher_families(
                batches=services.batcher.batches, texts=services.batcher.embedded
            )
        if fleet:  # replicas are the fleet's, not a tenant's
            families += telemetry.replica_families(services.plane.statuses() if services.plane else [])
        return Response(body + telemetry.scrape_text(families), media_type=telemetry.CONTENT_TYPE)

    return metrics


def build_app(settings: Settings, *, database_url: str | None = None, token_ttl: float = TOKEN_TTL_S) -> Starlette:
    """The ASGI app: /mcp (stateless streamable HTTP, JSON responses), /healthz, /metrics; resources at start."""
    url = database_url or settings.database_url
    if not url:
        raise ConfigError("database_url: not set (DATABASE_URL, or use `memory-butler serve`, which finds one)")
    tracing.setup(settings.tracing, role="front")  # before the engine connects (off unless configured)
    services = Services(settings=settings, database_url=url)
    server = build_server(services)
    server.custom_route("/healthz", methods=["GET"])(_healthz(services))
    server.custom_route("/metrics", methods=["GET"])(_metrics(services))
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        host=settings.api.host,
        max_request_body_size=_max_body(settings),
    )
    app.router.routes.extend(dashboard.routes())  # the dashboard's /api and web UI (memory_api/dashboard)
    services.token_cache = TokenCache(ttl=token_ttl)
    app.add_middleware(BearerAuth, services=services, cache=services.token_cache)
    tracing.instrument_asgi(app)  # outermost: a refused token is traced too
    app.state.services = services
    return app


def _max_body(settings: Settings) -> int:
    """Room for a full memory_ingest_batch (JSON may spend two bytes per character), never below the SDK's 4 MiB.

    Bodies are read only after the token was accepted, so only authenticated callers can send this much.
    """
    return max(DEFAULT_MAX_REQUEST_BODY_SIZE, 2 * settings.api.max_batch * settings.api.max_content_chars + 2**20)


def run_stdio(settings: Settings, *, database_url: str | None = None) -> None:
    """Serve the same tools over stdio; the caller is the configured tenant's admin for every butler."""
    url = database_url or settings.database_url
    if not url:
        raise ConfigError("database_url: not set")
    principal = Principal(tenant_id=settings.tenant_id, butlers=(ALL_BUTLERS,), role="admin", token_id=None)
    tracing.setup(settings.tracing, role="front")
    services = Services(settings=settings, database_url=url, stdio_principal=principal)
    anyio.run(build_server(services).run_stdio_async)
