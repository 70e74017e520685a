"""The front's process-wide resources, made once at start (lifespan) and shared by every call.

Engine, Reader, the embedding model (loaded at start so the first call is fast), the token counter, the
reference bumper and the broker publisher. (The per-tool request metrics live in shared.telemetry.)
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, TimeoutError as PoolTimeout

from memory_api.tools.limits import TokenLimits
from shared import db
from shared.config import Settings
from shared.errors import ButlerError, IntegrityViolation, Unavailable
from shared.reads import Reader
from shared.references import ReferenceBumper
from shared.replicas import ReadPlane
from shared.tenancy import Principal, ensure_tenant

log = logging.getLogger("memory_butler.api")

T = TypeVar("T")
# Connections per front: 8 pooled + 16 overflow. Threads doing DB work are capped at the same 24, so a burst
# waits for a thread (bounded by the call's deadline) instead of queueing on the pool.
POOL_SIZE = 8
DB_THREADS = 24
# Token look-ups have threads of their own: a flood of unknown tokens waits here (bounded by the auth deadline)
# and never takes a thread or a connection from authenticated calls. The pool has room for both.
AUTH_THREADS = 4
CONNECT_TIMEOUT_S = 2


@dataclass
class Services:
    """Filled by :meth:`open` at start; tools reach it as the MCP lifespan context."""

    settings: Settings
    database_url: str
    stdio_principal: Principal | None = None   # the caller when serving stdio (no tokens there)
    engine: Engine | None = None               # the primary: every write, token checks, the ops gauges
    plane: ReadPlane | None = None              # where reads go: DATABASE_READ_URL's replicas, else the primary
    reader: Reader | None = None
    bumper: ReferenceBumper | None = None
    publisher: Any = None                       # memory_workers.enqueue.Publisher
    limiter: anyio.CapacityLimiter | None = None
    auth_limiter: anyio.CapacityLimiter | None = None
    token_limits: TokenLimits | None = None
    token_cache: Any = None                     # memory_api.server.TokenCache (a purge evicts its tenant)

    def __post_init__(self) -> None:
        if self.token_limits is None:
            self.token_limits = TokenLimits.from_settings(self.settings.api)

    def open(self) -> None:
        """Create every resource (blocking: loads the model); called once per process."""
        from shared.embedding import get_query_embedder, get_token_counter

        self.engine = db.make_engine(self.database_url, pool_size=POOL_SIZE, connect_timeout_s=CONNECT_TIMEOUT_S,
                                     max_overflow=DB_THREADS + AUTH_THREADS - POOL_SIZE,
                                     dead_client_timeout_s=self.settings.dead_client_timeout_seconds)
        replicas = self.settings.replicas
        self.plane = ReadPlane(primary=self.engine, replica_urls=self.settings.read_urls,
                               max_lag_s=replicas.max_lag_seconds, check_interval_s=replicas.check_interval_seconds,
                               pool_size=POOL_SIZE, connect_timeout_s=CONNECT_TIMEOUT_S)
        self.plane.start()
        embedder = get_query_embedder()
        self.bumper = ReferenceBumper(self.engine)  # bumps are writes: the primary
        self.reader = Reader(engine=self.engine, settings=self.settings, embed=embedder.embed_one,
                             count_tokens=get_token_counter().count_many, bumper=self.bumper, plane=self.plane)
        self.publisher = _publisher(self.settings)
        if self.stdio_principal is not None:
            with db.unit_of_work(self.engine) as conn:
                ensure_tenant(conn, tenant_id=self.stdio_principal.tenant_id)
        log.info("front resources ready", extra={"pool_size": POOL_SIZE, "db_threads": DB_THREADS,
                                                 "replicas": [r.label for r in self.plane.replicas]})

    def close(self) -> None:
        for closer in (getattr(self.publisher, "close", None), self.bumper and self.bumper.close,
                       self.plane and self.plane.close):
            if closer is not None:
                try:
                    closer()
                except Exception:  # noqa: BLE001 - shutting down: log and go on closing the rest
                    log.warning("closing a front resource failed", exc_info=True)
        if self.engine is not None:
            self.engine.dispose()

    @asynccontextmanager
    async def lifespan(self, _server: Any) -> AsyncIterator[Services]:
        """The MCP server's lifespan: open at start, close at stop; yields itself as the lifespan context."""
        self.limiter = anyio.CapacityLimiter(DB_THREADS)
        self.auth_limiter = anyio.CapacityLimiter(AUTH_THREADS)
        await anyio.to_thread.run_sync(self.open)
        try:
            yield self
        finally:
            await anyio.to_thread.run_sync(self.close)

    async def in_thread(self, fn: Callable[[], T], *, deadline: float, late: str = "",
                        limiter: anyio.CapacityLimiter | None = None) -> T:
        """Blocking work in a worker thread, abandoned after ``deadline`` seconds: a caller never hangs.

        ``late`` is added to the Unavailable message when the deadline passes (what the caller should know);
        ``limiter`` the threads to use (default: the tools' own).
        """
        assert self.limiter is not None, "Services.lifespan has not run"
        try:
            with anyio.fail_after(deadline):
                return await anyio.to_thread.run_sync(_classified(fn), abandon_on_cancel=True,
                                                      limiter=limiter or self.limiter)
        except TimeoutError:
            raise Unavailable(f"database did not answer within {deadline:.1f}s{late}") from None


def _publisher(settings: Settings) -> Any:
    """The broker wake-up publisher (a background thread; wake_apply never waits for Redis)."""
    from memory_workers.enqueue import Publisher  # the workers' enqueue surface is all the front may import

    return Publisher(settings)


def classify_db_error(exc: Exception) -> ButlerError | None:
    """Database trouble as a classified error: unreachable/slow → Unavailable; a refused row → IntegrityViolation."""
    if isinstance(exc, (OperationalError, PoolTimeout)):
        return Unavailable(f"database unavailable: {type(exc).__name__}")
    if isinstance(exc, IntegrityError):
        return IntegrityViolation(f"refused by the database: {str(exc.orig).splitlines()[0]}")
    return None


def _classified(fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        try:
            return fn()
        except ButlerError:
            raise
        except Exception as exc:
            error = classify_db_error(exc)
            if error is None:
                raise
            raise error from exc
    return run
