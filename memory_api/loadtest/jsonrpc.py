"""The load test's lean client (``--client http``): MCP tool calls as plain JSON-RPC POSTs over kept HTTP/1.1
connections (h11 on asyncio streams), for peak-rate runs on the machine under test.

The SDK's client (``--client mcp``, the default: what a butler runs) costs about 1 ms of CPU per call on a fast
2-core machine and 4 ms on a slow one. At 500 calls/s the load generator then takes half a core or more from the
front it measures. This client sends the same requests to the same endpoint (the front answers stateless JSON)
for about a fifth of that. It does what the load test needs and no more: ``tools/call`` with JSON answers; no
server-sent events, no notifications. It speaks the protocol revision it is given: 2026-07-28 (the default, what
the SDK's ``Client`` negotiates with this front) sends each call as a self-contained request, its envelope in
``params._meta`` and its method and tool in headers, after one ``server/discover``; 2025-11-25 (the handshake era,
SDK 1.x clients) says ``initialize`` once per session and then sends bare calls.

It duck-types the part of the SDK's session the load test uses (``call_tool`` returning ``structured_content`` and
``is_error``), so writers, readers and their retries are the same code for both clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS

# The front (uvicorn) closes a connection idle for 5 s; one idle for this long is replaced before the next call
# rather than found closed by it.
IDLE_S = 2.0


class ProtocolFailure(Exception):
    """The front answered, but not with a JSON-RPC result: an HTTP error status, a JSON-RPC error, or not JSON.
    The load test treats it as a transport failure (retried on a new connection), as it does the SDK's errors."""


@dataclass(frozen=True)
class ToolResult:
    structured_content: dict[str, Any] | None
    is_error: bool


class JsonRpcSession:
    """One client's session with the front's MCP endpoint: kept connections, one request at a time on each (a
    reader's concurrent calls each take an idle connection or open one)."""

    def __init__(self, url: str, token: str, protocol: str) -> None:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        self._address = (parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls)
        self._target = parts.path or "/"
        self._headers = [
            ("Host", parts.netloc),
            ("Authorization", f"Bearer {token}"),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
        ]
        self._modern = protocol in MODERN_PROTOCOL_VERSIONS
        if self._modern:
            self._headers.append(("MCP-Protocol-Version", protocol))
        self._envelope = {
            PROTOCOL_VERSION_META_KEY: protocol,
            CLIENT_CAPABILITIES_META_KEY: {},
            CLIENT_INFO_META_KEY: CLIENT_INFO,
        }
        self._ids = 0
        self._idle: list[_Connection] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, url: str, token: str, *, timeout_s: float, protocol: str = LATEST_MODERN_VERSION
    ) -> AsyncIterator[JsonRpcSession]:
        """A session that has reached the front once (so a wrong URL or token fails here): ``server/discover``
        on the per-request revision, ``initialize`` on a handshake-era one."""
        session = cls(url, token, protocol)
        try:
            if session._modern:
                await session.request("server/discover", {}, timeout_s=timeout_s)
            else:
                result = await session.request(
                    "initialize",
                    {"protocolVersion": protocol, "capabilities": {}, "clientInfo": CLIENT_INFO},
                    timeout_s=timeout_s,
                )
                session._headers.append(("MCP-Protocol-Version", str(result["protocolVersion"])))
            yield session
        finally:
            for connection in session._idle:
                connection.close()

    async def call_tool(self, name: str, arguments: dict[str, Any], *, read_timeout_seconds: float) -> ToolResult:
        result = await self.request(
            "tools/call", {"name": name, "arguments": arguments}, timeout_s=read_timeout_seconds
        )
        return ToolResult(result.get("structuredContent"), bool(result.get("isError")))

    async def request(self, method: str, params: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """The JSON-RPC ``result`` of one request; ProtocolFailure, OSError, TimeoutError or h11's errors else."""
        self._ids += 1
        headers = [*self._headers]
        if self._modern:  # the envelope in the body, the method and tool in headers (the front checks they agree)
            params = {**params, "_meta": self._envelope}
            headers.append(("Mcp-Method", method))
            if "name" in params:
                headers.append(("Mcp-Name", params["name"]))
        body = json.dumps({"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}).encode()
        connection = self._take()
        async with asyncio.timeout(timeout_s):
            try:
                status, raw = await connection.post(self._target, [*headers, ("Content-Length", str(len(body)))], body)
            except BaseException:
                connection.close()  # a half-read answer leaves the connection unusable
                raise
        self._idle.append(connection)
        if status != 200:
            raise ProtocolFailure(f"{method}: HTTP {status}: {raw[:200]!r}")
        try:
            message = json.loads(raw)
        except ValueError as exc:
            raise ProtocolFailure(f"{method}: the answer is not JSON: {raw[:200]!r}") from exc
        if "error" in message:
            raise ProtocolFailure(f"{method}: JSON-RPC error {message['error']}")
        result: dict[str, Any] = message["result"]
        return result

    def _take(self) -> _Connection:
        """An idle connection still fit for a request, else a new one (connected on its first request)."""
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        return _Connection(self._address)


class _Connection:
    """One HTTP/1.1 connection: h11's state machine over asyncio streams."""

    def __init__(self, address: tuple[str, int, bool]) -> None:
        self._address = address
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._http = h11.Connection(h11.CLIENT)
        self._last_used = time.monotonic()

    def reusable(self) -> bool:
        """Whether the next request can go on this connection: the last exchange ended cleanly, the front has not
        closed it, and it has not been idle long enough for the front to close it while a request is on its way."""
        reader_done = self._streams is not None and self._streams[0].at_eof()
        return self._http.our_state is h11.IDLE and not reader_done and time.monotonic() - self._last_used < IDLE_S

    async def post(self, target: str, headers: list[tuple[str, str]], body: bytes) -> tuple[int, bytes]:
        if self._streams is None:
            host, port, tls = self._address
            self._streams = await asyncio.open_connection(host, port, ssl=tls or None)
        reader, writer = self._streams
        http = self._http
        request = h11.Request(method="POST", target=target, headers=headers)
        writer.write(b"".join(http.send(event) or b"" for event in (request, h11.Data(data=body), h11.EndOfMessage())))
        status, chunks = 0, []
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                http.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the front closed the connection before it answered")
        if http.our_state is h11.DONE and http.their_state is h11.DONE:  # kept alive: ready for the next request
            http.start_next_cycle()
        self._last_used = time.monotonic()
        return status, b"".join(chunks)

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


CLIENT_INFO = {"name": "memory-butler-loadtest", "version": "1"}
