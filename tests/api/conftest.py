"""The MCP front for real: uvicorn on a free port in a thread, the real MCP client over streamable HTTP, the real
database and Redis, and a Celery worker (in-process) applying accepted writes.

``Butler`` is one agent with one bearer token; ``TcpProxy`` sits between a second front and PostgreSQL so a
test can take the database away (refuse connections, or swallow them) while that front keeps running.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from memory_api.server import build_app
from shared.config import Settings, load_settings
from shared.db import unit_of_work
from shared.tenancy import create_token, ensure_tenant

READ_TIMEOUT_MS = 500


def poll(condition: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Wait until ``condition()`` is truthy and return it; fail after ``timeout`` seconds (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Front:
    """A running front: uvicorn serving build_app(settings) in a background thread."""

    def __init__(self, settings: Settings, *, token_ttl: float = 30.0) -> None:
        self.port = free_port()
        self.app = build_app(settings, token_ttl=token_ttl)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"front-{self.port}", daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def __enter__(self) -> Front:
        self.thread.start()
        poll(lambda: self.server.started or not self.thread.is_alive(), timeout=120)
        assert self.server.started, "the front did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class Butler:
    """One agent: calls tools through the real MCP client with its bearer token.

    ``mode`` is the SDK client's: "auto" (its default) negotiates the per-request revision 2026-07-28 with the
    front; "legacy" says ``initialize`` first, as handshake-era clients do (2025-11-25).
    """

    def __init__(self, url: str, token: str | None, *, mode: str = "auto") -> None:
        self.url, self.token, self.mode = url, token, mode

    async def _session_call(self, fn: Callable[[Client], Any]) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
            async with Client(streamable_http_client(self.url, http_client=http), mode=self.mode) as client:
                return await fn(client)

    def call(self, tool: str, **arguments: Any) -> CallToolResult:
        return anyio.run(self._session_call, lambda s: s.call_tool(tool, arguments))

    def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.call(tool, **arguments)
        assert not result.is_error, result.content[0].text if result.content else result
        return result.structured_content

    def error(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.call(tool, **arguments)
        assert result.is_error, f"{tool} did not fail: {result.structured_content}"
        return result.structured_content

    def list_tools(self) -> list[Any]:
        return anyio.run(self._session_call, lambda s: s.list_tools()).tools

    def negotiated(self) -> str:
        """The protocol revision the client and the front agreed on."""

        async def version(client: Client) -> str:
            return str(client.session.protocol_version)

        return anyio.run(self._session_call, version)


@pytest.fixture(scope="session")
def api_settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(
        database_url=database_url, redis_url=redis_url, memory={"retrieval": {"read_timeout_ms": READ_TIMEOUT_MS}}
    )


@pytest.fixture(scope="session")
def front(api_settings: Settings) -> Iterator[Front]:
    with Front(api_settings) as running:
        yield running


@pytest.fixture(scope="package")
def worker(api_settings: Settings) -> Iterator[None]:
    """A Celery worker in this process, on every shard queue of the test Redis, applying accepted writes.

    Package-scoped: it must stop before other packages' tests run their own workers on the same queues.
    """
    from celery.contrib.testing.worker import start_worker

    from memory_workers.app import app, configure
    from shared.sharding import MAINTENANCE_QUEUE, queue_for

    configure(app, api_settings)
    count = api_settings.workers.shard_count
    queues = sorted({queue_for("t", f"b{i}", count) for i in range(count * 50)} | {MAINTENANCE_QUEUE})
    with (
        start_worker(
            app,
            pool="threads",
            concurrency=2,
            perform_ping_check=False,
            loglevel="WARNING",
            queues=queues,
            shutdown_timeout=30,
        ),
        redelivery_sweep(api_settings),
    ):
        yield


@contextlib.contextmanager
def redelivery_sweep(settings: Settings, *, stale_s: float = 2.0, every_s: float = 0.5) -> Iterator[None]:
    """What the scheduled redelivery sweep does in production: re-wake keys whose intents wait too long.

    Wake-ups are only hints; another test run flushing the shared test Redis must not make this one flaky.
    """
    from datetime import datetime, timedelta, timezone

    from memory_workers.enqueue import wake_apply
    from shared.db import engine_for
    from shared.intake import stale_pending_keys

    stop = threading.Event()

    def sweep() -> None:
        engine = engine_for(settings.database_url)
        while not stop.wait(every_s):
            with contextlib.suppress(Exception):
                with engine.connect() as conn:
                    keys = stale_pending_keys(conn, older_than=datetime.now(timezone.utc) - timedelta(seconds=stale_s))
                for tenant_id, butler in keys:
                    wake_apply(tenant_id, butler, settings=settings)

    thread = threading.Thread(target=sweep, name="test-redelivery-sweep", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def new_tenant(engine: Engine) -> str:
    tenant_id = f"t-{uuid.uuid4().hex[:10]}"
    with unit_of_work(engine) as conn:
        ensure_tenant(conn, tenant_id=tenant_id)
    return tenant_id


def new_token(engine: Engine, tenant_id: str, butlers: list[str], role: str = "butler") -> str:
    with unit_of_work(engine) as conn:
        _, token = create_token(conn, tenant_id=tenant_id, name="test", butlers=butlers, role=role)  # type: ignore[arg-type]
    return token


def count_rows(engine: Engine, table: str, tenant_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"), {"t": tenant_id}).scalar_one()


@pytest.fixture()
def tenant_a(engine: Engine) -> str:
    return new_tenant(engine)


@pytest.fixture()
def health(front: Front, engine: Engine, tenant_a: str) -> Butler:
    """A butler token for 'health' in tenant A."""
    return Butler(front.url, new_token(engine, tenant_a, ["health"]))


@pytest.fixture()
def admin(front: Front, engine: Engine, tenant_a: str) -> Butler:
    """An admin token for every butler of tenant A."""
    return Butler(front.url, new_token(engine, tenant_a, ["*"], role="admin"))


class TcpProxy:
    """127.0.0.1:<port> → PostgreSQL (TCP or its unix socket). ``refuse()``: the database is gone (connections
    refused); ``stall()``: it swallows everything and never answers; ``restore()``: back to normal."""

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        socket_dir = url.query.get("host")
        if socket_dir:
            self.upstream: tuple[int, Any] = (socket.AF_UNIX, f"{socket_dir}/.s.PGSQL.{url.port or 5432}")
        else:
            self.upstream = (socket.AF_INET, (url.host or "127.0.0.1", url.port or 5432))
        self.port = free_port()
        self.url = url.set(host="127.0.0.1", port=self.port, query={}).render_as_string(hide_password=False)
        self.mode = "forward"
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            if self.mode == "stall":
                continue  # accepted, never answered
            upstream = socket.socket(self.upstream[0], socket.SOCK_STREAM)
            upstream.connect(self.upstream[1])
            with self._lock:
                self._sockets.append(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if self.mode == "stall":
                    continue  # swallow: the database "hangs"
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:  # shutdown() tears the connection down even while a pump thread is in recv()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def refuse(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        self._close_all()

    def stall(self) -> None:
        self.mode = "stall"

    def restore(self) -> None:
        self._close_all()
        self.mode = "forward"
        if self._listener is None:
            self.start()

    def close(self) -> None:
        self.refuse()


def applied(butler: Butler, kind: str, memory_id: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """Poll memory_get until the worker has applied the write; returns the memory."""

    def ready() -> dict[str, Any] | None:
        got = butler.ok("memory_get", type=kind, id=memory_id)
        return got["memory"] if got["status"] == "ok" else None

    return poll(ready, timeout=timeout, interval=0.1)
