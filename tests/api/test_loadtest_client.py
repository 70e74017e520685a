"""The load test's lean client (``--client http``) against the real front: the same answers as the SDK's client for
what the load test sends, classified errors raised the same way, and a kept connection that survives idling."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine

from memory_api.loadtest import jsonrpc
from memory_api.loadtest.client import PROTOCOLS, ToolFailed, call_tool, is_transport_error, open_session
from tests.api.conftest import Front, new_tenant, new_token


@pytest.fixture
def token(engine: Engine) -> str:
    return new_token(engine, new_tenant(engine), ["lean"])


def accept(content: str) -> dict[str, Any]:
    return {"content": content, "butler": "lean", "idempotency_key": str(uuid.uuid4())}


EITHER_PROTOCOL = pytest.mark.parametrize("protocol", PROTOCOLS)


@EITHER_PROTOCOL
def test_the_lean_client_gets_what_the_sdk_gets(front: Front, token: str, protocol: str) -> None:
    async def both() -> list[dict[str, Any]]:
        answers = []
        for client in ("mcp", "http"):
            async with open_session(front.url, token, timeout_s=10, client=client, protocol=protocol) as session:
                answers.append(await call_tool(session, "memory_store_episode", accept(client), timeout_s=10))
                answers.append(await call_tool(session, "memory_stats", {}, timeout_s=10))
        return answers

    sdk_accept, sdk_stats, lean_accept, lean_stats = asyncio.run(both())

    assert sdk_accept["status"] == lean_accept["status"] == "accepted"
    assert sdk_accept.keys() == lean_accept.keys() and sdk_accept["id"] != lean_accept["id"]
    assert sdk_stats.keys() == lean_stats.keys()


@EITHER_PROTOCOL
def test_a_classified_error_is_raised_as_the_sdk_client_raises_it(front: Front, token: str, protocol: str) -> None:
    async def bad_call(client: str) -> ToolFailed:
        async with open_session(front.url, token, timeout_s=10, client=client, protocol=protocol) as session:
            with pytest.raises(ToolFailed) as failed:
                await call_tool(session, "memory_store_episode", {**accept("x"), "content": ""}, timeout_s=10)
            return failed.value

    sdk, lean = asyncio.run(bad_call("mcp")), asyncio.run(bad_call("http"))

    assert (lean.code, lean.retryable) == (sdk.code, sdk.retryable) == ("invalid_input", False)


@EITHER_PROTOCOL
def test_a_bad_token_fails_at_open_as_a_transport_error(front: Front, protocol: str) -> None:
    async def open_with_a_bad_token() -> None:
        async with open_session(front.url, "mb_not-a-token", timeout_s=10, client="http", protocol=protocol):
            pass

    with pytest.raises(jsonrpc.ProtocolFailure, match="HTTP 401") as failed:
        asyncio.run(open_with_a_bad_token())
    assert is_transport_error(failed.value)  # so the load test retries it on a new session, as the SDK's errors


def test_concurrent_calls_each_take_a_connection_and_an_idle_one_is_replaced(
    front: Front, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonrpc, "IDLE_S", 0.2)

    async def run() -> tuple[list[str], int, dict[str, Any], int]:
        async with jsonrpc.JsonRpcSession.open(front.url, token, timeout_s=10) as session:
            together = await asyncio.gather(
                *(session.call_tool("memory_store_episode", accept(f"c{i}"), read_timeout_seconds=10) for i in range(4))
            )
            kept = len(session._idle)
            await asyncio.sleep(0.3)  # longer than IDLE_S: the next call must not go out on a stale connection
            later = await session.call_tool("memory_stats", {}, read_timeout_seconds=10)
            statuses = [str((r.structured_content or {}).get("status")) for r in together]
            return statuses, kept, later.structured_content or {}, len(session._idle)

    statuses, kept, stats, kept_after_idling = asyncio.run(run())

    assert statuses == ["accepted"] * 4
    assert kept == 4  # four calls at once went out on four connections, all kept for reuse
    # after idling, the four stale connections were closed and the call went out on a new one
    assert kept_after_idling == 1 and isinstance(stats["stats"], dict)
