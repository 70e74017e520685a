"""Load-test clients that behave like butlers: the real MCP client over streamable HTTP, one session per task
(or, with ``client="http"``, the same calls from the lean client in ``memory_api.loadtest.jsonrpc``).

A writer sends its episodes one call at a time (so its send order is the order the front must keep per
(tenant, butler)), always with an idempotency key, and retries what did not answer "accepted": a retryable
tool error (``unavailable``) on the same session, a transport failure (front restarting, connection refused,
timeout) on a new session, both with capped exponential backoff and jitter. A write counts as accepted only
when the front said so. A reader calls memory_context or memory_search at its share of the read rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import h11
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS

from memory_api.loadtest.generator import Episode
from memory_api.loadtest.jsonrpc import JsonRpcSession, ProtocolFailure
from memory_api.loadtest.metrics import Accept, Recorder

# Anything the network, the HTTP layer or the MCP session raises when the front is gone or slow.
TRANSPORT_ERRORS = (
    httpx2.HTTPError,
    MCPError,
    OSError,
    TimeoutError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    ProtocolFailure,
    h11.ProtocolError,
)
Session = Client | JsonRpcSession
BACKOFF_START_S = 0.05
# The MCP revisions a load-test client can speak (open_session): per-request, and the initialize handshake.
PROTOCOLS = (LATEST_MODERN_VERSION, LATEST_HANDSHAKE_VERSION)


@dataclass(frozen=True)
class ClientConfig:
    url: str
    call_timeout_s: float = 30.0  # one call; then it counts as a transport failure and is retried
    give_up_s: float = 180.0  # one write; then it is reported as given up (never silently dropped)
    backoff_max_s: float = 2.0
    replay: bool = False  # send every write twice with the same idempotency key
    batch: int = 0  # 0: memory_store_episode; K: memory_ingest_batch of up to K
    client: str = "mcp"  # "mcp": the SDK's client (a butler's); "http": the lean one (memory_api.loadtest.jsonrpc)
    protocol: str = LATEST_MODERN_VERSION  # the MCP revision the client speaks (see open_session)


class ToolFailed(Exception):
    """The front answered with a classified error."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", "tool error"))
        self.code = str(body.get("error", "unknown"))
        self.retryable = bool(body.get("retryable", False))


def is_transport_error(exc: BaseException) -> bool:
    """True for a transport failure, or a group made only of them (the SDK raises groups from its task group)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_transport_error(e) for e in exc.exceptions)
    return isinstance(exc, TRANSPORT_ERRORS)


@asynccontextmanager
async def open_session(
    url: str, token: str, *, timeout_s: float, client: str = "mcp", protocol: str = LATEST_MODERN_VERSION
) -> AsyncIterator[Session]:
    """A connected MCP client with a bearer token and the tools listed, as a butler opens one (the SDK would
    otherwise list them at the first call, to check results against their output schemas); ``client="http"``:
    the lean client's session.

    ``protocol``: 2026-07-28, per-request (what the SDK's ``Client`` negotiates with this front by default), or
    2025-11-25, the initialize handshake of earlier clients (each call then costs the front a session of the
    SDK's: BENCHMARKS.md, issue 14, fourteenth session).
    """
    if client == "http":
        async with JsonRpcSession.open(url, token, timeout_s=timeout_s, protocol=protocol) as lean:
            yield lean
        return
    headers = {"Authorization": f"Bearer {token}"}
    mode = protocol if protocol in MODERN_PROTOCOL_VERSIONS else "legacy"
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout_s)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as session:
            await session.list_tools()
            yield session


@dataclass
class StartLine:
    """Every client connects (its session open, the tools listed) before any client calls, so the burst's clock
    starts with all of them ready: one client's set-up, in the load test's one event loop, is not timed as
    another client's call. A client that reconnects later (a drill) finds the line open and goes on at once."""

    expected: int
    arrived: int = 0
    all_here: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)

    async def ready(self) -> None:
        if not self.go.is_set():
            self.arrived += 1
            if self.arrived >= self.expected:
                self.all_here.set()
        await self.go.wait()

    async def open_when_ready(self, timeout_s: float) -> None:
        """Open the line once every client arrived, or after ``timeout_s`` (a client that cannot connect retries
        on its own schedule)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_here.wait(), timeout_s)
        self.go.set()


async def call_tool(session: Session, tool: str, arguments: dict[str, Any], *, timeout_s: float) -> dict:
    """The tool's structured result; ToolFailed for a classified error."""
    result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
    body = result.structured_content or {}
    if result.is_error:
        raise ToolFailed(body)
    return body


class Pacer:
    """Spaces calls ``1/rate`` seconds apart across every task sharing it; rate 0 means no pacing."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next_slot = 0.0

    async def wait(self, slots: int = 1) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        start = max(now, self.next_slot)
        self.next_slot = start + slots * self.interval
        if start > now:
            await asyncio.sleep(start - now)


@dataclass
class _Pending:
    """The write at the head of a writer's queue, with its retry state (kept across reconnects)."""

    episodes: Sequence[Episode]
    first_sent_at: float | None = None
    attempts: int = 0
    backoff: float = BACKOFF_START_S
    accepted: list[Accept] | None = None  # set once accepted; replay mode then sends it again

    def next_backoff(self, cap: float) -> float:
        delay = self.backoff * (0.5 + random.random())
        self.backoff = min(self.backoff * 2, cap)
        return delay


@dataclass
class Writer:
    """One butler-like client: its own session and token, its episodes sent strictly one call at a time."""

    config: ClientConfig
    token: str
    episodes: list[Episode]
    recorder: Recorder
    pacer: Pacer
    stop: asyncio.Event
    start: StartLine
    queue: deque[_Pending] = field(init=False)

    def __post_init__(self) -> None:
        size = max(1, self.config.batch)
        self.queue = deque(_Pending(self.episodes[i : i + size]) for i in range(0, len(self.episodes), size))

    async def run(self) -> None:
        counts = self.recorder.counts
        while self.queue and not self.stop.is_set():
            try:
                async with open_session(
                    self.config.url,
                    self.token,
                    timeout_s=self.config.call_timeout_s,
                    client=self.config.client,
                    protocol=self.config.protocol,
                ) as session:
                    await self.start.ready()
                    while self.queue and not self.stop.is_set():
                        await self._send_head(session)
            except Exception as exc:  # noqa: BLE001 - only transport failures are retried; anything else is a bug
                if not is_transport_error(exc):
                    raise
                counts["transport_errors"] += 1
                if self.queue and self.queue[0].first_sent_at is None:  # its first try was this session's opening
                    self.queue[0].first_sent_at = self.recorder.now()
                if self.queue and not self._expire_head():
                    await asyncio.sleep(self.queue[0].next_backoff(self.config.backoff_max_s))
        counts["not_sent"] += sum(len(p.episodes) for p in self.queue if p.accepted is None)

    async def _send_head(self, session: Session) -> None:
        """Send the head write until it is accepted (and replayed), rejected or given up; then pop it."""
        head = self.queue[0]
        if head.first_sent_at is None:
            await self.pacer.wait(len(head.episodes))
            head.first_sent_at = self.recorder.now()
        while not self.stop.is_set():
            if self._expire_head():
                return
            head.attempts += 1
            started = self.recorder.now()
            try:
                body = await call_tool(session, *self._call(head.episodes), timeout_s=self.config.call_timeout_s)
            except ToolFailed as exc:
                if not exc.retryable:
                    self.recorder.counts[f"rejected_{exc.code}"] += len(head.episodes)
                    self.queue.popleft()
                    return
                self.recorder.counts[f"retried_{exc.code}"] += 1
                await asyncio.sleep(head.next_backoff(self.config.backoff_max_s))
                continue
            done = self.recorder.now()
            if body.get("status") != "accepted" or len(self._items(body)) != len(head.episodes):
                self.recorder.counts["rejected_unexpected_answer"] += len(head.episodes)
                self.queue.popleft()
                return
            if head.accepted is None:
                head.accepted = self._record(head, body, started, done)
                head.backoff = BACKOFF_START_S
                if self.config.replay:
                    continue
            else:
                self._check_replay(head, body)
            self.queue.popleft()
            return

    def _expire_head(self) -> bool:
        """Pop the head write if it has been retried for give_up_s; it is counted, never silently dropped."""
        head = self.queue[0]
        if head.first_sent_at is None or self.recorder.now() - head.first_sent_at < self.config.give_up_s:
            return False
        self.recorder.counts["gave_up" if head.accepted is None else "replay_gave_up"] += len(head.episodes)
        self.queue.popleft()
        return True

    def _call(self, episodes: Sequence[Episode]) -> tuple[str, dict[str, Any]]:
        if self.config.batch:
            return "memory_ingest_batch", {
                "episodes": [
                    {"content": e.content, "butler": e.butler, "idempotency_key": e.idempotency_key} for e in episodes
                ]
            }
        (e,) = episodes
        return "memory_store_episode", {"content": e.content, "butler": e.butler, "idempotency_key": e.idempotency_key}

    @staticmethod
    def _items(body: dict[str, Any]) -> list[dict[str, Any]]:
        return body["items"] if "items" in body else [body]

    def _record(self, head: _Pending, body: dict[str, Any], started: float, done: float) -> list[Accept]:
        items = self._items(body)
        latency = (done - started) * 1000
        self.recorder.calls.append((done, latency, len(items)))
        accepts = [
            Accept(
                e.tenant_id,
                e.butler,
                e.client,
                e.position,
                str(item["id"]),
                e.idempotency_key,
                head.first_sent_at or started,
                done,
                latency,
                (done - (head.first_sent_at or started)) * 1000,
                head.attempts,
                bool(item.get("replayed")),
            )
            for e, item in zip(head.episodes, items, strict=True)
        ]
        self.recorder.accepts.extend(accepts)
        self.recorder.counts["replayed_on_retry"] += sum(a.replayed for a in accepts)
        return accepts

    def _check_replay(self, head: _Pending, body: dict[str, Any]) -> None:
        items = self._items(body)
        first = head.accepted or []
        same = len(items) == len(first) and all(
            str(i["id"]) == a.id and i.get("replayed") for i, a in zip(items, first, strict=False)
        )
        self.recorder.counts["replays_ok" if same else "replay_mismatch"] += len(first)


@dataclass
class Reader:
    """A concurrent reader: memory_context or memory_search for its tenant at its share of the read rate.

    Open loop: a read starts on schedule whether or not the previous one answered (up to ``max_in_flight`` on
    its session), so slow answers show up as latency instead of quietly lowering the rate.
    """

    url: str
    token: str
    tool: str
    butlers: Sequence[str]
    queries: Sequence[str]
    recorder: Recorder
    pacer: Pacer
    stop: asyncio.Event
    start: StartLine
    timeout_s: float = 30.0
    max_in_flight: int = 16
    client: str = "mcp"  # as ClientConfig.client
    protocol: str = LATEST_MODERN_VERSION  # as ClientConfig.protocol

    async def run(self) -> None:
        rng = random.Random(id(self))
        while not self.stop.is_set():
            try:
                async with open_session(
                    self.url, self.token, timeout_s=self.timeout_s, client=self.client, protocol=self.protocol
                ) as session:
                    await self.start.ready()
                    await self._read_until_stopped(session, rng)
            except Exception as exc:  # noqa: BLE001
                if not is_transport_error(exc):
                    raise
                self.recorder.counts["read_transport_errors"] += 1
                await asyncio.sleep(0.5)

    async def _read_until_stopped(self, session: Session, rng: random.Random) -> None:
        in_flight: set[asyncio.Task] = set()
        async with asyncio.TaskGroup() as group:
            while not self.stop.is_set():
                await self.pacer.wait()
                if len(in_flight) >= self.max_in_flight:
                    self.recorder.counts["reads_behind_schedule"] += 1
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                task = group.create_task(self._read(session, rng))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)

    async def _read(self, session: Session, rng: random.Random) -> None:
        query, butler = rng.choice(self.queries), rng.choice(self.butlers)
        args: dict[str, Any] = (
            {"trigger_prompt": query, "butler": butler}
            if self.tool == "memory_context"
            else {"query": query, "limit": 10}
        )
        started = time.monotonic()
        try:
            body = await call_tool(session, self.tool, args, timeout_s=self.timeout_s)
        except ToolFailed as exc:
            self.recorder.counts[f"read_error_{exc.code}"] += 1
            return
        self.recorder.reads.append(
            (self.recorder.now(), (time.monotonic() - started) * 1000, bool(body.get("degraded")))
        )
