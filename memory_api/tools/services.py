"""The front's process-wide resources, made once at start (lifespan) and shared by every call.

Engines, Reader, the query embedding thread (model loaded at start so the first call is fast), the token counter,
the reference bumper and the broker publisher. (The per-tool request metrics live in shared.telemetry.)

Reads and writes never share a queue: an accept's statement runs on the event loop on its own connection pool (and
a replay's look-up, like the other writes, on the writes' own threads and pool), so a read backlog cannot push an
accept past its deadline. Reads are admitted against a bounded queue; one that finds it full answers ``degraded``
at once (fail open) rather than timing out late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout as AcceptPoolTimeout
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, TimeoutError as PoolTimeout

from memory_api.tools.limits import TokenLimits
from shared import db, heap
from shared.config import Settings
from shared.errors import ButlerError, IntegrityViolation, Unavailable
from shared.query_batcher import QueryBatcher
from shared.reads import Reader, session_settings
from shared.references import ReferenceBumper
from shared.replicas import ReadPlane
from shared.tenancy import Principal, ensure_tenant

log = logging.getLogger("memory_butler.api")

T = TypeVar("T")
# Threads for health, metrics and the dashboard (Services.in_thread's default): a burst waits for a thread (bounded by
# the call's deadline), not on the pool. Memory reads and accepts have threads of their own (Services.read, .write);
# reads are further capped at api.read_threads running, api.read_queue waiting.
DB_THREADS = 24
# Token look-ups have threads of their own: a flood of unknown tokens waits here (bounded by the auth deadline)
# and never takes a thread or a connection from authenticated calls. The pool has room for both.
AUTH_THREADS = 4
# Accepts: an accept is one short INSERT (~0.5 ms of database time), run on the event loop; 8 connections in flight
# carry far more than a front's 500 accepts/s. Replays' look-ups and the other writes (feedback, the dashboard's)
# have their own 12 threads and connections.
ACCEPT_CONNECTIONS = 8
WRITE_THREADS = 12
# Memory reads and the dashboard's share the read pool: up to this many read threads' worth of connections.
READ_POOL_PER_THREAD = 3
# Every pool keeps each connection it opens, up to the threads that use it (no overflow). SQLAlchemy closes an
# overflow connection when it comes back to a full pool, so a steady load above the pool's size started and ended a
# PostgreSQL backend per call: 507 backends in a 20 s accept burst, ~2 ms of the database's CPU per accept
# (BENCHMARKS.md, issue 14). The bounds are those of the pools with overflow before; only idle connections stay.
CONNECT_TIMEOUT_S = 2


def opened(resource: T | None) -> T:
    """A resource :meth:`Services.open` made (None only before it ran)."""
    assert resource is not None, "Services.open has not run"
    return resource


@dataclass
class Services:
    """Filled by :meth:`open` at start; tools reach it as the MCP lifespan context."""

    settings: Settings
    database_url: str
    stdio_principal: Principal | None = None  # the caller when serving stdio (no tokens there)
    engine: Engine | None = None  # the primary: token checks, health, metrics, the dashboard, bumps
    read_engine: Engine | None = None  # memory reads on the primary (Reader, when no replica serves)
    write_engine: Engine | None = None  # replays' accepts, feedback and the dashboard's writes (the primary)
    accept_pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None  # accepts, on the loop (primary)
    plane: ReadPlane | None = None  # where reads go: DATABASE_READ_URL's replicas, else read_engine
    reader: Reader | None = None
    bumper: ReferenceBumper | None = None
    publisher: Any = None  # memory_workers.enqueue.Publisher
    limiter: anyio.CapacityLimiter | None = None
    auth_limiter: anyio.CapacityLimiter | None = None
    write_limiter: anyio.CapacityLimiter | None = None
    read_limiter: anyio.CapacityLimiter | None = None
    batcher: QueryBatcher | None = None
    reads_in_flight: int = 0  # admitted reads, waiting or running (touched on the event loop only)
    token_limits: TokenLimits | None = None
    token_cache: Any = None  # memory_api.server.TokenCache (a purge evicts its tenant)
    background: set[asyncio.Future[Any]] = field(default_factory=set)  # accepts' tasks, pool checks (Services._keep)

    def __post_init__(self) -> None:
        if self.token_limits is None:
            self.token_limits = TokenLimits.from_settings(self.settings.api)

    def open(self) -> None:
        """Create every resource (blocking: loads the model); called once per process."""
        from shared.embedding import get_query_embedder, get_token_counter, to_pgvector

        dead_client = self.settings.dead_client_timeout_seconds
        self.engine = db.make_engine(
            self.database_url,
            pool_size=DB_THREADS + AUTH_THREADS,
            max_overflow=0,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            dead_client_timeout_s=dead_client,
        )
        # Memory reads fail open, so their connections are not pinged on checkout (a round trip per read): a dead
        # one degrades one read and the pool replaces it. Nor are the writes' (a round trip per accept, one of two):
        # a dead one fails its write as unavailable, which the caller retries with the same idempotency_key, and
        # the pool replaces every connection as old as it. The rest (``engine``: auth, health, admin tools, the
        # dashboard, reference bumps) keeps the ping.
        # Their sessions carry the retrieval reads' settings, so those reads run without a transaction.
        read_session = session_settings(self.settings)
        read_pool = READ_POOL_PER_THREAD * self.settings.api.read_threads
        self.read_engine = db.make_engine(
            self.database_url,
            pool_size=read_pool,
            max_overflow=0,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            pre_ping=False,
            dead_client_timeout_s=dead_client,
            session_settings=read_session,
        )
        self.write_engine = db.make_engine(
            self.database_url,
            pool_size=WRITE_THREADS,
            max_overflow=0,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            pre_ping=False,
            dead_client_timeout_s=dead_client,
        )
        replicas = self.settings.replicas
        self.plane = ReadPlane(
            primary=self.read_engine,
            replica_urls=self.settings.read_urls,
            max_lag_s=replicas.max_lag_seconds,
            check_interval_s=replicas.check_interval_seconds,
            pool_size=read_pool,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            session_settings=read_session,
        )
        self.plane.start()
        embedder = get_query_embedder()
        cfg = self.settings.embedding
        self.batcher = QueryBatcher(
            embedder.embed,
            version=embedder.version.revision,
            max_wait_s=cfg.query_batch_wait_ms / 1000 if embedder.batches else 0.0,
            cache_ttl_s=cfg.query_cache_ttl_s,
            encode=to_pgvector,  # cached as the text the reads bind: a repeated query's is made once
        )
        self.bumper = ReferenceBumper(self.engine)  # bumps are writes: the primary
        self.reader = Reader(
            engine=self.read_engine,
            settings=self.settings,
            embed=embedder.embed_one,
            count_tokens=get_token_counter().count_many,
            bumper=self.bumper,
            plane=self.plane,
            embed_later=self.batcher.submit,
        )
        self.publisher = _publisher(self.settings)
        if self.stdio_principal is not None:
            with db.unit_of_work(self.engine) as conn:
                ensure_tenant(conn, tenant_id=self.stdio_principal.tenant_id)
        heap.settle()  # full collections scan only what calls make from now on (shared.heap)
        log.info(
            "front resources ready",
            extra={
                "db_threads": DB_THREADS,
                "write_threads": WRITE_THREADS,
                "read_pool": read_pool,
                "replicas": [r.label for r in self.plane.replicas],
            },
        )

    def close(self) -> None:
        for closer in (
            getattr(self.publisher, "close", None),
            self.bumper.close if self.bumper else None,
            self.plane.close if self.plane else None,
        ):
            if closer is not None:
                try:
                    closer()
                except Exception:  # noqa: BLE001 - shutting down: log and go on closing the rest
                    log.warning("closing a front resource failed", exc_info=True)
        if self.batcher is not None:
            self.batcher.close()
        for engine in (self.engine, self.read_engine, self.write_engine):
            if engine is not None:
                engine.dispose()

    @asynccontextmanager
    async def lifespan(self, _server: Any) -> AsyncIterator[Services]:
        """The MCP server's lifespan: open at start, close at stop; yields itself as the lifespan context."""
        self.limiter = anyio.CapacityLimiter(DB_THREADS)
        self.auth_limiter = anyio.CapacityLimiter(AUTH_THREADS)
        self.write_limiter = anyio.CapacityLimiter(WRITE_THREADS)
        self.read_limiter = anyio.CapacityLimiter(self.settings.api.read_threads)
        await anyio.to_thread.run_sync(self.open)
        self.accept_pool = db.make_async_pool(
            self.database_url,
            size=ACCEPT_CONNECTIONS,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            dead_client_timeout_s=self.settings.dead_client_timeout_seconds,
        )
        await self.accept_pool.open(wait=False)  # a front starts while the database is down, and answers unavailable
        try:
            yield self
        finally:
            await self.accept_pool.close()
            await anyio.to_thread.run_sync(self.close)

    async def in_thread(
        self, fn: Callable[[], T], *, deadline: float, late: str = "", limiter: anyio.CapacityLimiter | None = None
    ) -> T:
        """Blocking work in a worker thread, abandoned after ``deadline`` seconds: a caller never hangs.

        ``late`` is added to the Unavailable message when the deadline passes (what the caller should know).
        ``limiter``: whose threads (default: the shared ones of health, metrics and the dashboard).
        """
        assert self.limiter is not None, "Services.lifespan has not run"
        try:
            with anyio.fail_after(deadline):
                return await anyio.to_thread.run_sync(
                    _classified(fn), abandon_on_cancel=True, limiter=limiter or self.limiter
                )
        except TimeoutError:
            raise Unavailable(f"database did not answer within {deadline:.1f}s{late}") from None

    async def read(self, fn: Callable[[], T], *, deadline: float) -> T:
        """A read, admitted if fewer than ``api.read_threads`` + ``api.read_queue`` are in flight, else Unavailable
        at once: a read that would wait behind a full queue answers degraded now instead of timing out later."""
        capacity = self.settings.api.read_threads + self.settings.api.read_queue
        if self.reads_in_flight >= capacity:
            raise Unavailable(f"front saturated: {self.reads_in_flight} reads in flight (at most {capacity})")
        self.reads_in_flight += 1
        try:
            return await self.in_thread(fn, deadline=deadline, limiter=self.read_limiter)
        finally:
            self.reads_in_flight -= 1

    async def write(self, fn: Callable[[], T], *, deadline: float, late: str = "") -> T:
        """A write transaction on the writes' own threads (their connections: ``write_engine``)."""
        return await self.in_thread(fn, deadline=deadline, late=late, limiter=self.write_limiter)

    async def accept(
        self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], *, deadline: float, late: str = ""
    ) -> T:
        """An accept's statement on the event loop, on the accepts' own connections: no thread hand-off, which cost
        half of the statement's front CPU (BENCHMARKS.md, issue 14). Abandoned after ``deadline`` seconds, like a
        thread's work: psycopg cancels the statement of a cancelled task and waits for the server to confirm, so
        that wait happens in the background, never in the caller's."""
        pool = opened(self.accept_pool)

        async def run() -> T:
            try:
                async with pool.connection(timeout=deadline) as conn:
                    return await fn(conn)
            except psycopg.OperationalError as exc:
                if not isinstance(exc, AcceptPoolTimeout):
                    self._keep(pool.check())  # a dead connection: replace every idle one that died with it
                raise

        task = self._keep(run())
        done, _ = await asyncio.wait((task,), timeout=deadline)
        if not done:
            task.cancel()
            raise Unavailable(f"database did not answer within {deadline:.1f}s{late}")
        try:
            return task.result()
        except Exception as exc:
            _raise_classified(exc)

    def _keep(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """``work`` as a task held until it ends (the loop keeps only weak references), its outcome consumed."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(_consumed)
        task.add_done_callback(self.background.discard)
        return task


def _consumed(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # read, so asyncio does not log an abandoned accept's error as never retrieved


def _publisher(settings: Settings) -> Any:
    """The broker wake-up publisher (a background thread; wake_apply never waits for Redis)."""
    from memory_workers.enqueue import Publisher  # the workers' enqueue surface is all the front may import

    return Publisher(settings)


def classify_db_error(exc: Exception) -> ButlerError | None:
    """Database trouble as a classified error: unreachable/slow → Unavailable; a refused row → IntegrityViolation.
    SQLAlchemy's errors (on threads) or psycopg's own (the accepts on the event loop; psycopg_pool's timeout is an
    OperationalError)."""
    if isinstance(exc, (OperationalError, PoolTimeout, psycopg.OperationalError)):
        return Unavailable(f"database unavailable: {type(exc).__name__}")
    if isinstance(exc, (IntegrityError, psycopg.IntegrityError)):
        return IntegrityViolation(f"refused by the database: {str(getattr(exc, 'orig', exc)).splitlines()[0]}")
    return None


def _raise_classified(exc: Exception) -> NoReturn:
    """Raise ``exc`` again: a database error as its classified error, anything else as it is."""
    error = None if isinstance(exc, ButlerError) else classify_db_error(exc)
    if error is None:
        raise exc
    raise error from exc


def _classified(fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        try:
            return fn()
        except Exception as exc:
            _raise_classified(exc)

    return run
