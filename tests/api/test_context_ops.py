"""memory_context(_batch), memory_stats, memory_activity_stream and memory_dead_letters through MCP."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, text

from memory_workers.enqueue import wake_apply
from tests.api.conftest import Butler, Front, applied, new_tenant, new_token


def _seed(butler: Butler) -> dict[str, str]:
    fact = butler.ok(
        "memory_store_fact",
        subject="user",
        predicate="diet",
        content="The user is vegetarian",
        scope="health",
        permanence="stable",
    )
    rule = butler.ok("memory_store_rule", content="Suggest vegetarian restaurants only", scope="health")
    episode = butler.ok("memory_store_episode", content="User asked for a dinner reservation tonight", butler="health")
    for kind, out in (("fact", fact), ("rule", rule), ("episode", episode)):
        applied(butler, kind, out["id"])
    return {"fact": fact["id"], "rule": rule["id"], "episode": episode["id"]}


def test_context_block_within_budget(worker, health: Butler) -> None:
    ids = _seed(health)
    block = health.ok(
        "memory_context", trigger_prompt="Book a restaurant for dinner", butler="health", token_budget=200
    )
    assert block["context"].startswith("## Your Memory") and block["tokens"] <= 200
    assert "The user is vegetarian" in block["context"] and block["degraded"] is False
    assert ids["fact"] in block["included"]["facts"]
    tiny = health.ok("memory_context", trigger_prompt="Book a restaurant", butler="health", token_budget=50)
    assert tiny["tokens"] <= 50

    batch = health.ok(
        "memory_context_batch",
        requests=[
            {"trigger_prompt": "Book a restaurant for dinner", "butler": "health", "token_budget": 200},
            {"trigger_prompt": "Anything about food?", "butler": "health"},
        ],
    )
    assert [b["butler"] for b in batch["results"]] == ["health", "health"]
    assert ids["fact"] in batch["results"][0]["included"]["facts"] and batch["results"][0]["tokens"] <= 200
    assert batch["results"][1]["token_budget"] == 3000


def test_stats_and_activity(worker, health: Butler, admin: Butler) -> None:
    ids = _seed(health)
    stats = health.ok("memory_stats")
    # (consolidation may add facts or rules from the episode meanwhile, hence >=)
    assert stats["scope"] == "health" and stats["stats"]["facts"]["total"] >= 1
    assert stats["stats"]["episodes"]["total"] == 1
    whole = admin.ok("memory_stats", scope="*")
    assert whole["scope"] is None and whole["stats"]["rules"]["total"] >= 1

    page = admin.ok("memory_activity_stream", since=0, limit=2)
    assert len(page["events"]) == 2 and page["next_cursor"] == page["events"][-1]["id"]
    rest = admin.ok("memory_activity_stream", since=page["next_cursor"])
    entity_ids = {e["entity_id"] for e in page["events"] + rest["events"]}
    assert set(ids.values()) <= entity_ids
    facts_only = admin.ok("memory_activity_stream", since="2000-01-01T00:00:00Z", types=["fact"])
    assert {e["entity_type"] for e in facts_only["events"]} == {"fact"}

    # a scope keeps the events about that butler's (and global) memories: the health ones, not in another butler's
    health_events = {
        e["entity_id"] for e in admin.ok("memory_activity_stream", since=0, scope="health", limit=1000)["events"]
    }
    assert set(ids.values()) <= health_events
    finance_events = {
        e["entity_id"] for e in admin.ok("memory_activity_stream", since=0, scope="finance", limit=1000)["events"]
    }
    assert finance_events.isdisjoint(ids.values())


def test_dead_letters_list_show_redrive(
    worker, api_settings, front: Front, engine: Engine, tenant_a: str, admin: Butler
) -> None:
    # given a write the worker gave up on (made dead by hand: a poison payload cannot pass the front)
    dead_broker = api_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with Front(dead_broker) as lonely:
        out = Butler(lonely.url, admin.token).ok("memory_store_episode", content="Poisoned once", butler="health")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE write_intents SET status = 'dead_letter', attempts = 5, last_error = 'boom' WHERE id = :i"),
            {"i": out["id"]},
        )
    listed = admin.ok("memory_dead_letters", action="list")["items"]
    assert [(d["id"], d["error"]) for d in listed] == [(out["id"], "boom")]
    shown = admin.ok("memory_dead_letters", action="show", id=out["id"])["items"][0]
    assert shown["detail"]["payload"]["content"] == "Poisoned once"
    # another tenant's admin cannot see it
    other = Butler(front.url, new_token(engine, new_tenant(engine), ["*"], role="admin"))
    assert other.ok("memory_dead_letters", action="list")["items"] == []
    assert other.error("memory_dead_letters", action="show", id=out["id"])["error"] == "not_found"
    assert other.error("memory_dead_letters", action="redrive", id=out["id"])["error"] == "not_found"
    # when redriven, the worker applies it
    redriven = admin.ok("memory_dead_letters", action="redrive", id=out["id"])["items"]
    assert redriven == [{"kind": "write_intent", "id": out["id"], "butler": "health"}]
    wake_apply(tenant_a, "health", settings=api_settings)  # the session front's publisher woke it too
    assert applied(admin, "episode", out["id"])["content"] == "Poisoned once"
    assert admin.error("memory_dead_letters", action="show")["field"] == "id"
    assert admin.error("memory_dead_letters", action="redrive", id=str(uuid.uuid4()))["error"] == "not_found"


def test_a_dead_letter_stays_until_dropped_and_drop_deletes_it(
    worker, api_settings, front: Front, engine: Engine, tenant_a: str, admin: Butler, health: Butler
) -> None:
    # given a write the worker gave up on
    dead_broker = api_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with Front(dead_broker) as lonely:
        out = Butler(lonely.url, admin.token).ok("memory_store_episode", content="Never to be applied", butler="health")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE write_intents SET status = 'dead_letter', attempts = 5, last_error = 'boom' WHERE id = :i"),
            {"i": out["id"]},
        )
    # when another tenant's admin or a butler token tries to drop it, then it is refused and kept
    other = Butler(front.url, new_token(engine, new_tenant(engine), ["*"], role="admin"))
    assert other.error("memory_dead_letters", action="drop", id=out["id"])["error"] == "not_found"
    assert health.error("memory_dead_letters", action="drop", id=out["id"])["error"] == "permission_denied"
    assert admin.error("memory_dead_letters", action="drop")["field"] == "id"
    assert [d["id"] for d in admin.ok("memory_dead_letters", action="list")["items"]] == [out["id"]]
    # when its tenant's admin drops it
    dropped = admin.ok("memory_dead_letters", action="drop", id=out["id"])
    # then it is gone for good, with an audit event (no content)
    assert dropped["items"] == [{"kind": "write_intent", "id": out["id"], "butler": "health"}]
    assert admin.ok("memory_dead_letters", action="list")["items"] == []
    assert admin.error("memory_dead_letters", action="drop", id=out["id"])["error"] == "not_found"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM write_intents WHERE id = :i"), {"i": out["id"]}).scalar() == 0
        [(event, payload)] = conn.execute(
            text("SELECT event_type, payload FROM memory_events WHERE entity_id = :i"), {"i": out["id"]}
        ).all()
    assert (event, payload) == ("write_intent.dropped", {"butler": "health"})
