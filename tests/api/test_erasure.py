"""Erasure over MCP (issue 16, item 7): an admin purges its own tenant with memory_purge_tenant (confirmed by
typing the tenant id); its tokens stop working at once on this front. A token with an expiry stops at it, even
while this front has it cached."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine

from shared.db import unit_of_work
from shared.tenancy import create_token
from tests.api.conftest import Butler, Front, applied, count_rows, new_tenant, new_token, poll
from tests.api.test_auth import MCP_HEADERS, post_mcp


def call_raw(front: Front, token: str, tool: str, **arguments: Any) -> dict[str, Any]:
    """One tools/call as plain JSON-RPC over HTTP (stateless): the MCP client would list the tools afterwards to
    check the result's schema, and a purged tenant's token can no longer do that."""
    response = httpx.post(
        front.url,
        timeout=30,
        headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"},
        json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}},
    )
    assert response.status_code == 200, response.text
    return response.json()["result"]


def test_an_admin_purges_its_own_tenant_and_nothing_else(
    worker, front: Front, engine: Engine, tenant_a: str, admin: Butler, health: Butler
) -> None:
    # given memory in the tenant, and another tenant's memory
    fact = health.ok(
        "memory_store_fact", subject="user", predicate="allergy", content="Allergic to penicillin", scope="health"
    )
    applied(health, "fact", fact["id"])
    other_tenant = new_tenant(engine)
    other = Butler(front.url, new_token(engine, other_tenant, ["health"]))
    kept = other.ok("memory_store_fact", subject="user", predicate="city", content="Lives in Oslo", scope="health")
    applied(other, "fact", kept["id"])
    # when a butler token asks, or the admin types another tenant's id, then nothing happens
    assert health.error("memory_purge_tenant", confirm_tenant=tenant_a)["error"] == "permission_denied"
    wrong = admin.error("memory_purge_tenant", confirm_tenant=other_tenant)
    assert (wrong["error"], wrong["field"]) == ("invalid_input", "confirm_tenant")
    assert count_rows(engine, "facts", tenant_a) == 1
    # when the admin confirms with its own tenant's id
    result = call_raw(front, admin.token, "memory_purge_tenant", confirm_tenant=tenant_a)
    assert not result["isError"], result
    purged = result["structuredContent"]
    # then the tenant is gone, its tokens are refused at once, and the other tenant is untouched
    assert purged["status"] == "purged" and purged["counts"]["facts"] == 1 and purged["counts"]["api_tokens"] == 2
    for table in ("facts", "write_intents", "memory_events", "api_tokens"):
        assert count_rows(engine, table, tenant_a) == 0, table
    assert post_mcp(front, admin.token).status_code == 401
    assert other.ok("memory_get", type="fact", id=kept["id"])["memory"]["content"] == "Lives in Oslo"


def test_an_expired_token_is_refused_even_while_cached(front: Front, engine: Engine) -> None:
    # given a token that expires in two seconds, already accepted (and cached) by the front
    tenant = new_tenant(engine)
    with unit_of_work(engine) as conn:
        _, token = create_token(
            conn,
            tenant_id=tenant,
            name="short",
            butlers=["health"],
            role="butler",
            expires_at=datetime.now(UTC) + timedelta(seconds=2),
        )
    assert post_mcp(front, token).status_code == 200
    # then once it expires it is refused, well before the cache's 30 s would have let it go
    response = poll(lambda: (r := post_mcp(front, token)).status_code == 401 and r, timeout=10, interval=0.2)
    assert "expired" in response.json()["message"]
