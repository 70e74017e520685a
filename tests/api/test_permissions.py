"""The token decides: which butlers a call may act as, which scopes it may read, and which tools need admin."""

from __future__ import annotations

from sqlalchemy import Engine

from tests.api.conftest import Butler, Front, applied, count_rows, new_token


def test_writes_only_as_covered_butlers(health: Butler, engine: Engine, tenant_a: str) -> None:
    err = health.error("memory_store_episode", content="not mine", butler="finance")
    assert (err["error"], err["field"]) == ("permission_denied", "butler")
    err = health.error("memory_store_fact", subject="s", predicate="p", content="c", scope="finance")
    assert (err["error"], err["field"]) == ("permission_denied", "scope")
    err = health.error("memory_store_rule", content="c", scope="finance")
    assert err["error"] == "permission_denied"
    err = health.error(
        "memory_ingest_batch", episodes=[{"content": "a", "butler": "health"}, {"content": "b", "butler": "finance"}]
    )
    assert (err["error"], err["field"]) == ("permission_denied", "episodes.1.butler")
    assert count_rows(engine, "write_intents", tenant_a) == 0


def test_reads_only_global_and_covered_scopes(
    worker, front: Front, health: Butler, engine: Engine, tenant_a: str
) -> None:
    finance = Butler(front.url, new_token(engine, tenant_a, ["finance"]))
    secret = finance.ok(
        "memory_store_fact", subject="user", predicate="salary", content="The user earns a lot", scope="finance"
    )
    episode = finance.ok("memory_store_episode", content="User discussed salary negotiation", butler="finance")
    applied(finance, "fact", secret["id"])
    applied(finance, "episode", episode["id"])
    # health cannot name the finance scope, nor '*'
    assert health.error("memory_search", query="salary", scope="finance")["error"] == "permission_denied"
    assert health.error("memory_recall", topic="salary", scope="*")["field"] == "scope"
    assert health.error("memory_context", trigger_prompt="salary", butler="finance")["field"] == "butler"
    # its default view does not include finance's memories
    for mode in ("hybrid", "semantic", "keyword"):
        hits = health.ok("memory_search", query="salary negotiation earns", mode=mode)["results"]
        assert not {h["id"] for h in hits} & {secret["id"], episode["id"]}, mode
    assert health.error("memory_get", type="fact", id=secret["id"])["error"] == "permission_denied"
    assert health.error("memory_confirm", type="fact", id=secret["id"])["error"] == "permission_denied"
    assert health.error("memory_forget", type="episode", id=episode["id"])["error"] == "permission_denied"
    # an admin may look everywhere with explicit intent
    admin = Butler(front.url, new_token(engine, tenant_a, ["health"], role="admin"))
    hits = admin.ok("memory_search", query="salary negotiation earns", scope="*")["results"]
    assert {secret["id"], episode["id"]} <= {h["id"] for h in hits}


def test_admin_only_tools(health: Butler, admin: Butler) -> None:
    for tool, args in (("memory_dead_letters", {"action": "list"}), ("memory_activity_stream", {"since": 0})):
        err = health.error(tool, **args)
        assert err["error"] == "permission_denied" and err["retryable"] is False
    assert health.error("memory_stats", scope="*")["error"] == "permission_denied"
    assert admin.ok("memory_activity_stream", since=0)["events"] == []
