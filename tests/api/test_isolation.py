"""Tenant isolation on every read tool: tenant B's tokens (even admin, even scope '*') never see tenant A's
memories, whatever the search mode."""

from __future__ import annotations

from sqlalchemy import Engine

from tests.api.conftest import Butler, Front, applied, new_tenant, new_token

WORDS = "zebra quartz saxophone"


def test_tenant_b_never_sees_tenant_a(worker, front: Front, engine: Engine, health: Butler) -> None:
    # given tenant A's memories of every type, about words nothing else uses
    fact = health.ok(
        "memory_store_fact", subject="user", predicate="hobby", content=f"The user collects {WORDS}", scope="health"
    )
    glob = health.ok("memory_store_fact", subject="user", predicate="pet", content=f"The user has a {WORDS} pet")
    rule = health.ok("memory_store_rule", content=f"Mention the {WORDS} collection when chatting")
    episode = health.ok("memory_store_episode", content=f"User showed their {WORDS} collection", butler="health")
    ids = {fact["id"], glob["id"], rule["id"], episode["id"]}
    for kind, out in (("fact", fact), ("fact", glob), ("rule", rule), ("episode", episode)):
        applied(health, kind, out["id"])
    assert ids <= {h["id"] for h in health.ok("memory_search", query=WORDS, min_confidence=0)["results"]}

    # when tenant B asks, with the same butler names and an admin token
    tenant_b = new_tenant(engine)
    b_health = Butler(front.url, new_token(engine, tenant_b, ["health"]))
    b_admin = Butler(front.url, new_token(engine, tenant_b, ["*"], role="admin"))
    for butler in (b_health, b_admin):
        for mode in ("hybrid", "semantic", "keyword"):
            for scope in (None, "global", "health") + (("*",) if butler is b_admin else ()):
                args = {"query": WORDS, "mode": mode, "min_confidence": 0, **({"scope": scope} if scope else {})}
                assert butler.ok("memory_search", **args)["results"] == [], (mode, scope)
        assert butler.ok("memory_recall", topic=WORDS, min_confidence=0)["results"] == []
        for kind, out in (("fact", fact), ("rule", rule), ("episode", episode)):
            assert butler.error("memory_get", type=kind, id=out["id"])["error"] == "not_found"
        block = butler.ok("memory_context", trigger_prompt=WORDS, butler="health")
        assert WORDS not in block["context"] and not any(block["included"].values())
        batch = butler.ok("memory_context_batch", requests=[{"trigger_prompt": WORDS, "butler": "health"}])
        assert not any(batch["results"][0]["included"].values())
        # nor can they act on them
        assert butler.error("memory_confirm", type="fact", id=fact["id"])["error"] == "not_found"
        assert butler.error("memory_forget", type="episode", id=episode["id"])["error"] == "not_found"
    stats = b_admin.ok("memory_stats", scope="*")["stats"]
    assert (stats["facts"]["total"], stats["rules"]["total"], stats["episodes"]["total"]) == (0, 0, 0)
    assert b_health.ok("memory_stats")["stats"]["facts"]["total"] == 0
    assert b_admin.ok("memory_activity_stream", since=0)["events"] == []
