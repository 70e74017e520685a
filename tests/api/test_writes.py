"""Writes end to end through MCP: accepted in milliseconds, applied by the worker, read back; idempotent replay;
"pending" until applied (even with the broker down); supersession; batches."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import Engine

from memory_workers.enqueue import wake_apply
from shared.config import Settings
from tests.api.conftest import Butler, Front, applied, count_rows, new_token


def test_episode_is_accepted_applied_and_found(worker, health: Butler, engine: Engine, tenant_a: str) -> None:
    # when a butler stores an episode with lineage
    out = health.ok(
        "memory_store_episode",
        content="User asked to move the dentist appointment to a morning slot",
        butler="health",
        importance=6,
        request_context={"request_id": "req-episode-1"},
    )
    # then it is accepted at once, with the id and the echoed request id
    assert out["status"] == "accepted" and out["type"] == "episode" and out["butler"] == "health"
    assert out["request_id"] == "req-episode-1" and out["replayed"] is False
    # and the worker applies it: it can be fetched, searched and is in the audit trail with the request id
    memory = applied(health, "episode", out["id"])
    assert memory["content"].startswith("User asked to move the dentist") and memory["butler"] == "health"
    hits = health.ok("memory_search", query="dentist appointment morning", types=["episode"])
    assert out["id"] in [h["id"] for h in hits["results"]]
    assert count_rows(engine, "episodes", tenant_a) == 1


def test_fact_supersedes_and_rule_starts_as_candidate(worker, health: Butler) -> None:
    first = health.ok(
        "memory_store_fact",
        subject="user",
        predicate="favorite color",
        content="The user likes green",
        permanence="stable",
        scope="health",
        tags=["prefs"],
    )
    assert first["butler"] == "health"
    applied(health, "fact", first["id"])
    second = health.ok(
        "memory_store_fact", subject="user", predicate="favorite_color", content="The user likes blue", scope="health"
    )
    fact = applied(health, "fact", second["id"])
    assert fact["supersedes_id"] == first["id"] and fact["predicate"] == "favorite_color"
    assert health.ok("memory_get", type="fact", id=first["id"])["memory"]["validity"] == "superseded"
    # a global fact goes to the token's own shard
    glob = health.ok("memory_store_fact", subject="user", predicate="name", content="The user is called Ada")
    assert glob["butler"] == "health"
    assert applied(health, "fact", glob["id"])["scope"] == "global"

    rule = health.ok("memory_store_rule", content="Always confirm before booking appointments", tags=["booking"])
    stored = applied(health, "rule", rule["id"])
    assert stored["maturity"] == "candidate" and stored["scope"] == "global"
    recalled = health.ok("memory_recall", topic="booking an appointment", scope="health")
    assert rule["id"] in [h["id"] for h in recalled["results"]]


def test_same_idempotency_key_is_one_write(worker, health: Butler, engine: Engine, tenant_a: str) -> None:
    args = {"content": "User prefers tea over coffee", "butler": "health", "idempotency_key": "ep-tea-1"}
    first = health.ok("memory_store_episode", **args)
    again = health.ok("memory_store_episode", **args)
    assert again["id"] == first["id"] and again["replayed"] is True and first["replayed"] is False
    applied(health, "episode", first["id"])
    assert count_rows(engine, "write_intents", tenant_a) == 1
    assert count_rows(engine, "episodes", tenant_a) == 1
    # a key already used for an episode cannot name a fact
    err = health.error(
        "memory_store_fact", subject="user", predicate="drink", content="tea", idempotency_key="ep-tea-1"
    )
    assert err["error"] == "idempotency_conflict" and err["field"] == "idempotency_key"


def test_ingest_batch_accepts_all_in_order(worker, front: Front, engine: Engine, tenant_a: str) -> None:
    butler = Butler(front.url, new_token(engine, tenant_a, ["health", "finance"]))
    episodes = [
        {
            "content": f"Batch observation number {i}",
            "butler": "health" if i % 2 else "finance",
            "idempotency_key": f"batch-{i}",
        }
        for i in range(20)
    ]
    out = butler.ok("memory_ingest_batch", episodes=episodes)
    assert out["count"] == 20 and [i["idempotency_key"] for i in out["items"]] == [f"batch-{i}" for i in range(20)]
    assert {i["butler"] for i in out["items"]} == {"health", "finance"}
    applied(butler, "episode", out["items"][-1]["id"])
    again = butler.ok("memory_ingest_batch", episodes=episodes[:3])
    assert [i["id"] for i in again["items"]] == [i["id"] for i in out["items"][:3]]
    assert all(i["replayed"] for i in again["items"])
    assert count_rows(engine, "write_intents", tenant_a) == 20


def test_pending_until_applied_even_with_the_broker_down(
    worker, api_settings: Settings, engine: Engine, tenant_a: str
) -> None:
    # given a front whose broker is unreachable (nothing will wake a worker)
    dead_broker = api_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with Front(dead_broker) as lonely:
        butler = Butler(lonely.url, new_token(engine, tenant_a, ["health"]))
        # when a write is made, it is still accepted (durable in Postgres)
        out = butler.ok("memory_store_episode", content="Accepted while the broker is down", butler="health")
        # then memory_get says pending, not an error
        got = butler.ok("memory_get", type="episode", id=out["id"])
        assert got["status"] == "pending" and got["memory"] is None
        # and once a wake-up reaches the worker (the redelivery sweep's job), it is applied
        wake_apply(tenant_a, "health", settings=api_settings)
        assert applied(butler, "episode", out["id"])["content"] == "Accepted while the broker is down"


def test_unknown_id_is_not_found(health: Butler) -> None:
    err = health.error("memory_get", type="fact", id=str(uuid.uuid4()))
    assert err["error"] == "not_found" and err["field"] == "id" and err["retryable"] is False


def test_a_results_text_is_its_structured_content_compact_and_without_nulls(worker, health: Butler) -> None:
    # given an applied episode (its hit has no subject, scope or confidence: those are null in the structured hit)
    out = health.ok("memory_store_episode", content="User booked the physio for Tuesday at nine", butler="health")
    applied(health, "episode", out["id"])
    # when a butler that reads only the text searches
    result = health.call("memory_search", query="physio Tuesday", types=["episode"])
    structured, (text,) = result.structured_content, result.content
    # then the structured content keeps every field of the outputSchema, null where it does not apply
    hit = next(h for h in structured["results"] if h["id"] == out["id"])
    assert hit["subject"] is None and hit["effective_confidence"] is None and structured["reason"] is None
    # and the text is the same JSON on one line with the nulls left out
    assert "\n" not in text.text and "null" not in text.text
    assert json.loads(text.text) == _without_nulls(structured)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
