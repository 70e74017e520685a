"""Both MCP revisions a butler's client may speak get the same front: 2026-07-28 (self-contained requests, what the
SDK's ``Client`` negotiates by default) and 2025-11-25 (the initialize handshake of earlier clients). Each carries
the caller's token to the tools, bounds it to its tenant and butlers, and gets classified errors."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from sqlalchemy import Engine

from tests.api.conftest import Butler, Front, applied, new_tenant, new_token

ERA = {"auto": "2026-07-28", "legacy": "2025-11-25"}
WORDS = "marimba lighthouse kumquat"


@pytest.mark.parametrize("mode", sorted(ERA))
def test_each_revision_writes_reads_and_stays_in_its_tenant(
    worker, front: Front, engine: Engine, tenant_a: str, mode: str
) -> None:
    # given a butler whose client speaks this revision
    health = Butler(front.url, new_token(engine, tenant_a, ["health"]), mode=mode)
    assert health.negotiated() == ERA[mode]
    # when it stores an episode, it is accepted, applied and found, with the lineage echoed
    key = uuid.uuid4().hex
    out = health.ok(
        "memory_store_episode",
        content=f"User played the {WORDS} tune ({mode})",
        butler="health",
        idempotency_key=key,
        request_context={"request_id": f"req-{mode}"},
    )
    assert out["status"] == "accepted" and out["request_id"] == f"req-{mode}" and out["replayed"] is False
    assert applied(health, "episode", out["id"])["content"].endswith(f"({mode})")
    assert out["id"] in [h["id"] for h in health.ok("memory_search", query=WORDS, types=["episode"])["results"]]
    # and a retry with the same key is the same write
    again = health.ok(
        "memory_store_episode", content=f"User played the {WORDS} tune ({mode})", butler="health", idempotency_key=key
    )
    assert (again["id"], again["replayed"]) == (out["id"], True)
    # bad input is a classified error naming the field
    error = health.error("memory_store_episode", content="x", butler="Not A Butler")
    assert (error["error"], error["field"], error["retryable"]) == ("invalid_input", "butler", False)
    # a butler the token does not cover is refused
    assert health.error("memory_store_episode", content="x", butler="finance")["error"] == "permission_denied"
    # and another tenant's token on the same revision sees nothing of it
    stranger = Butler(front.url, new_token(engine, new_tenant(engine), ["health"]), mode=mode)
    assert stranger.ok("memory_search", query=WORDS, min_confidence=0)["results"] == []
    assert stranger.error("memory_get", type="episode", id=out["id"])["error"] == "not_found"


def modern_call(front: Front, token: str | None) -> httpx.Response:
    """One 2026-07-28 tools/call as the wire carries it: the envelope in ``params._meta``, method and tool in
    headers."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "memory_stats",
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "memory_stats", "_meta": meta}}
    return httpx.post(front.url, content=json.dumps(body), headers=headers, timeout=10)


def test_a_self_contained_request_needs_a_token_like_any_other(front: Front, engine: Engine) -> None:
    # without a token, or with a bad one, the front refuses it before the SDK sees it
    for token in (None, "mb_not-a-real-token"):
        response = modern_call(front, token)
        assert response.status_code == 401 and response.json()["error"] == "unauthorized", token
    # with one, the tool runs as that token's tenant
    response = modern_call(front, new_token(engine, new_tenant(engine), ["health"]))
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["isError"] is False and result["structuredContent"]["stats"]["episodes"]["total"] == 0
