"""Bearer-token auth on the front: no token, a bad token and a revoked token get HTTP 401 JSON; /healthz is open;
/metrics needs an admin token; a token's tenant and butlers bound everything it can do."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from shared.db import unit_of_work
from shared.tenancy import resolve_token, revoke_token
from tests.api.conftest import Butler, Front, new_tenant, new_token, poll

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def post_mcp(front: Front, token: str | None) -> httpx.Response:
    headers = dict(MCP_HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(front.url, json=INIT, headers=headers, timeout=10)


def test_no_token_is_401_json(front: Front) -> None:
    response = post_mcp(front, None)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_bad_token_is_401(front: Front) -> None:
    for token in ("mb_not-a-real-token", "garbage", "mb_"):
        response = post_mcp(front, token)
        assert response.status_code == 401, token
        assert response.json()["retryable"] is False


def test_revoked_token_is_401(front: Front, engine: Engine) -> None:
    # given a token that was revoked before this front ever saw it
    tenant = new_tenant(engine)
    token = new_token(engine, tenant, ["health"])
    with unit_of_work(engine) as conn:
        token_id = resolve_token(conn, token=token).token_id
        assert revoke_token(conn, token_id=token_id)
    # then it is refused
    assert post_mcp(front, token).status_code == 401


def test_revocation_takes_effect_within_the_cache_ttl(api_settings, engine: Engine) -> None:
    # given a front that caches tokens for half a second, and a token it has already accepted
    tenant = new_tenant(engine)
    token = new_token(engine, tenant, ["health"])
    with Front(api_settings, token_ttl=0.5) as short:
        assert post_mcp(short, token).status_code == 200
        # when the token is revoked
        with unit_of_work(engine) as conn:
            revoke_token(conn, token_id=resolve_token(conn, token=token).token_id)
        # then the front refuses it once the cached entry expires
        poll(lambda: post_mcp(short, token).status_code == 401, timeout=5)


def test_valid_token_initializes(front: Front, health: Butler) -> None:
    assert post_mcp(front, health.token).status_code == 200
    names = {tool.name for tool in health.list_tools()}
    assert {
        "memory_store_episode",
        "memory_store_fact",
        "memory_store_rule",
        "memory_search",
        "memory_recall",
        "memory_get",
        "memory_confirm",
        "memory_mark_helpful",
        "memory_mark_harmful",
        "memory_forget",
        "memory_stats",
        "memory_context",
        "memory_context_batch",
        "memory_ingest_batch",
        "memory_activity_stream",
        "memory_dead_letters",
        "memory_restore",
    } <= names


def test_healthz_is_open_and_reports_the_database(front: Front) -> None:
    response = httpx.get(f"{front.base}/healthz", timeout=10)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_metrics_show_an_admin_its_tenant_and_an_operator_the_fleet(
    front: Front, health: Butler, admin: Butler, engine: Engine, tenant_a: str
) -> None:
    # given two tenants that both wrote
    other = new_tenant(engine)
    stranger = Butler(front.url, new_token(engine, other, ["finance"]))
    health.ok("memory_store_episode", content="mine", butler="health")
    stranger.ok("memory_store_episode", content="theirs", butler="finance")
    operator = new_token(engine, other, ["ops"], role="operator")

    def scrape(token: str) -> httpx.Response:
        return httpx.get(f"{front.base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)

    # an admin sees its own tenant's shard keys only (issue 16, A1)
    mine = scrape(admin.token)
    assert mine.status_code == 200 and f'tenant_id="{tenant_a}"' in mine.text and other not in mine.text
    assert "memory_butler_maintenance_last" not in mine.text
    # an operator sees every tenant, and the maintenance runs
    fleet = scrape(operator)
    assert f'tenant_id="{tenant_a}"' in fleet.text and f'tenant_id="{other}"' in fleet.text
    assert "# TYPE memory_butler_maintenance_last_started_seconds gauge" in fleet.text
    # and nothing else: no memory, no dashboard
    assert (
        httpx.post(front.url, json={}, headers={"Authorization": f"Bearer {operator}"}, timeout=10).status_code == 403
    )
    assert (
        httpx.get(f"{front.base}/api/me", headers={"Authorization": f"Bearer {operator}"}, timeout=10).status_code
        == 403
    )


def test_metrics_need_an_admin_token(front: Front, health: Butler, admin: Butler) -> None:
    assert httpx.get(f"{front.base}/metrics", timeout=10).status_code == 401
    denied = httpx.get(f"{front.base}/metrics", headers={"Authorization": f"Bearer {health.token}"}, timeout=10)
    assert denied.status_code == 403
    # when an admin scrapes after some tool calls
    admin.ok("memory_search", query="anything")
    response = httpx.get(f"{front.base}/metrics", headers={"Authorization": f"Bearer {admin.token}"}, timeout=10)
    assert response.status_code == 200
    assert 'memory_butler_tool_calls_total{outcome="ok",tool="memory_search"}' in response.text
    assert "memory_butler_database_up 1.0" in response.text
