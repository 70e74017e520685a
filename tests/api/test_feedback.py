"""Feedback and lifecycle, synchronous in the front: confirm, helpful/harmful, forget, restore — each one
transaction, audited with the caller's request_id; refusals come back classified."""

from __future__ import annotations

from sqlalchemy import Engine, text

from tests.api.conftest import Butler, Front, applied, new_token


def test_confirm_and_rule_feedback(worker, health: Butler) -> None:
    fact = health.ok(
        "memory_store_fact",
        subject="user",
        predicate="allergy",
        content="The user is allergic to nuts",
        permanence="permanent",
        scope="health",
    )
    rule = health.ok("memory_store_rule", content="Check the menu for nuts before booking a restaurant", scope="health")
    applied(health, "fact", fact["id"])
    applied(health, "rule", rule["id"])

    confirmed = health.ok("memory_confirm", type="fact", id=fact["id"], request_context={"request_id": "fb-1"})
    assert confirmed["validity"] == "active" and confirmed["request_id"] == "fb-1"

    helpful = health.ok("memory_mark_helpful", rule_id=rule["id"])
    assert (helpful["success_count"], helpful["harmful_count"], helpful["outcome"]) == (1, 0, "helpful")
    harmful = health.ok("memory_mark_harmful", rule_id=rule["id"], reason="the menu was outdated")
    assert harmful["harmful_count"] == 1 and harmful["effectiveness_score"] < helpful["effectiveness_score"]
    # feedback on a fact id is not a rule
    assert health.error("memory_mark_helpful", rule_id=fact["id"])["error"] == "not_found"


def test_forget_and_restore(worker, front: Front, health: Butler, engine: Engine, tenant_a: str) -> None:
    fact = health.ok(
        "memory_store_fact", subject="user", predicate="city", content="The user lives in Lisbon", scope="health"
    )
    applied(health, "fact", fact["id"])
    assert fact["id"] in _recalled(health)

    gone = health.ok("memory_forget", type="fact", id=fact["id"], request_context={"request_id": "forget-1"})
    assert gone["status"] == "retracted"  # the canonical name, not the legacy "forgotten"
    assert health.ok("memory_get", type="fact", id=fact["id"])["memory"]["validity"] == "retracted"
    assert fact["id"] not in _recalled(health)
    # forgetting twice is a no-op, as the tool's idempotent hint promises (was refused: issue 16)
    assert health.ok("memory_forget", type="fact", id=fact["id"])["status"] == "retracted"

    # a confirm does not undo a forget: refused, classified, and the fact stays forgotten
    refused = health.error("memory_confirm", type="fact", id=fact["id"])
    assert (refused["error"], refused["field"]) == ("invalid_transition", "id")
    assert health.ok("memory_get", type="fact", id=fact["id"])["memory"]["validity"] == "retracted"

    back = health.ok("memory_restore", type="fact", id=fact["id"])
    assert back["status"] == "restored" and fact["id"] in _recalled(health)
    with engine.connect() as conn:
        events = conn.execute(
            text(
                "SELECT event_type, request_id FROM memory_events WHERE tenant_id = :t AND entity_id = :e ORDER BY id"
            ),
            {"t": tenant_a, "e": fact["id"]},
        ).all()
    assert ("fact.forgotten", "forget-1") in [tuple(e) for e in events]
    assert [e[0] for e in events].count("fact.forgotten") == 1  # the second forget changed nothing
    assert "fact.restored" in [e[0] for e in events]


def test_restore_refuses_a_second_active_fact(worker, health: Butler) -> None:
    old = health.ok("memory_store_fact", subject="user", predicate="phone", content="The phone is 1", scope="health")
    applied(health, "fact", old["id"])
    health.ok("memory_forget", type="fact", id=old["id"])
    new = health.ok("memory_store_fact", subject="user", predicate="phone", content="The phone is 2", scope="health")
    applied(health, "fact", new["id"])
    err = health.error("memory_restore", type="fact", id=old["id"])
    assert err["error"] == "integrity_violation" and err["field"] == "id"


def test_feedback_on_an_accepted_but_unapplied_write_is_pending(api_settings, engine: Engine, tenant_a: str) -> None:
    dead_broker = api_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with Front(dead_broker) as lonely:
        butler = Butler(lonely.url, new_token(engine, tenant_a, ["health"]))
        rule = butler.ok("memory_store_rule", content="Not applied yet")
        err = butler.error("memory_mark_helpful", rule_id=rule["id"])
        assert err["error"] == "pending" and err["retryable"] is True


def _recalled(butler: Butler) -> list[str]:
    return [h["id"] for h in butler.ok("memory_recall", topic="where does the user live", limit=50)["results"]]


def test_forgetting_an_episode_takes_its_text_out_of_the_write_log_and_audit_trail(
    worker, health: Butler, engine: Engine, tenant_a: str
) -> None:
    # given an episode stored through the front and applied
    out = health.ok(
        "memory_store_episode",
        content="My bank PIN is 4711, do not tell anyone",
        butler="health",
        idempotency_key="pin-1",
    )
    applied(health, "episode", out["id"])
    # when it is forgotten
    health.ok("memory_forget", type="episode", id=out["id"])
    # then its accepted write keeps its id and key but not the text, and no event about it holds the text
    with engine.connect() as conn:
        intent = conn.execute(
            text("SELECT payload, idempotency_key, status FROM write_intents WHERE id = :i"), {"i": out["id"]}
        ).one()
        events = conn.execute(
            text(
                "SELECT event_type, payload::text FROM memory_events WHERE tenant_id = :t "
                "AND entity_id = :i ORDER BY id"
            ),
            {"t": tenant_a, "i": out["id"]},
        ).all()
    assert tuple(intent) == ({"scrubbed": True}, "pin-1", "applied")
    assert [e for e, _ in events][-1] == "episode.forgotten" and not any("4711" in p for _, p in events)
    # and a replay of the same key answers the same id without writing the text again
    again = health.ok(
        "memory_store_episode",
        content="My bank PIN is 4711, do not tell anyone",
        butler="health",
        idempotency_key="pin-1",
    )
    assert (again["id"], again["replayed"]) == (out["id"], True)
