"""Feedback that is safe to retry (issue 16, item 14): memory_confirm / memory_mark_* take an idempotency_key
(a retry records one confirmation or application); a helpful mark confirms the rule; an anti-pattern warning that
is still being matched does not decay away."""

from __future__ import annotations


from sqlalchemy import Engine, text

from tests.api.conftest import Butler, applied, poll


def _one(engine: Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def _events(engine: Engine, entity_id: str, event_type: str) -> int:
    return _one(
        engine, "SELECT count(*) FROM memory_events WHERE entity_id = :i AND event_type = :e", i=entity_id, e=event_type
    )


def _rule(health: Butler, content: str) -> str:
    rule = health.ok("memory_store_rule", content=content, scope="health")
    applied(health, "rule", rule["id"])
    return rule["id"]


def test_a_retried_confirm_records_one_confirmation(worker, health: Butler, engine: Engine) -> None:
    fact = health.ok(
        "memory_store_fact", subject="user", predicate="dentist", content="Dr. Molar on Elm Street", scope="health"
    )
    applied(health, "fact", fact["id"])
    first = health.ok("memory_confirm", type="fact", id=fact["id"], idempotency_key="c-1")
    again = health.ok("memory_confirm", type="fact", id=fact["id"], idempotency_key="c-1")
    assert first["replayed"] is False and again["replayed"] is True
    assert again["last_confirmed_at"] == first["last_confirmed_at"] and again["validity"] == "active"
    assert _events(engine, fact["id"], "fact.confirmed") == 1
    # without a key every call is a confirmation of its own (as before)
    health.ok("memory_confirm", type="fact", id=fact["id"])
    assert _events(engine, fact["id"], "fact.confirmed") == 2


def test_a_retried_mark_records_one_application(worker, health: Butler, engine: Engine) -> None:
    rule_id = _rule(health, "Book dentist appointments in the morning")
    first = health.ok("memory_mark_helpful", rule_id=rule_id, idempotency_key="m-1")
    again = health.ok("memory_mark_helpful", rule_id=rule_id, idempotency_key="m-1")
    assert (first["success_count"], again["success_count"]) == (1, 1) and again["replayed"] is True
    harmful = health.ok("memory_mark_harmful", rule_id=rule_id, reason="the clinic was closed", idempotency_key="m-2")
    replay = health.ok("memory_mark_harmful", rule_id=rule_id, reason="the clinic was closed", idempotency_key="m-2")
    assert harmful["harmful_count"] == replay["harmful_count"] == 1
    assert _one(engine, "SELECT count(*) FROM rule_applications WHERE rule_id = :i", i=rule_id) == 2
    assert _one(engine, "SELECT applied_count FROM rules WHERE id = :i", i=rule_id) == 2


def test_a_key_reused_for_another_call_is_refused_and_records_nothing(worker, health: Butler, engine: Engine) -> None:
    rule_id = _rule(health, "Send reminders a day before appointments")
    health.ok("memory_mark_harmful", rule_id=rule_id, reason="too early", idempotency_key="k-1")
    for tool, extra in (("memory_mark_harmful", {"reason": "too late"}), ("memory_mark_helpful", {})):
        err = health.error(tool, rule_id=rule_id, idempotency_key="k-1", **extra)
        assert err["error"] == "idempotency_conflict" and err["field"] == "idempotency_key"
        assert err["retryable"] is False
    err = health.error("memory_confirm", type="rule", id=rule_id, idempotency_key="k-1")
    assert err["error"] == "idempotency_conflict"
    assert _one(engine, "SELECT count(*) FROM rule_applications WHERE rule_id = :i", i=rule_id) == 1
    assert _events(engine, rule_id, "rule.confirmed") == 0


def test_a_helpful_mark_confirms_the_rule(worker, health: Butler, engine: Engine) -> None:
    # given a rule last confirmed 200 days ago that has faded
    rule_id = _rule(health, "Prefer video calls for follow-up visits")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE rules SET last_confirmed_at = now() - interval '200 days', validity = 'fading' WHERE id = :i"),
            {"i": rule_id},
        )
    # when it is marked helpful
    health.ok("memory_mark_helpful", rule_id=rule_id)
    # then its decay restarts from now and it is active again, with the confirmation audited
    age = _one(engine, "SELECT extract(epoch FROM now() - last_confirmed_at) FROM rules WHERE id = :i", i=rule_id)
    assert float(age) < 60
    assert _one(engine, "SELECT validity FROM rules WHERE id = :i", i=rule_id) == "active"
    assert _events(engine, rule_id, "rule.confirmed") == 1


def test_an_anti_pattern_that_is_still_matched_does_not_decay(worker, health: Butler, engine: Engine) -> None:
    # given an anti-pattern warning and a plain rule, both last confirmed 30 days ago
    warning = _rule(health, "ANTI-PATTERN: Do NOT book the dentist on Fridays")
    plain = _rule(health, "Ask about dentist parking before booking")
    with engine.begin() as conn:
        conn.execute(text("UPDATE rules SET maturity = 'anti_pattern' WHERE id = :i"), {"i": warning})
        conn.execute(
            text("UPDATE rules SET last_confirmed_at = now() - interval '30 days' WHERE id IN (:a, :b)"),
            {"a": warning, "b": plain},
        )
    # when a recall matches both
    hits = health.ok("memory_recall", topic="booking the dentist", scope="health", min_confidence=0)["results"]
    assert {warning, plain} <= {h["id"] for h in hits}
    # then the match confirms the warning (its decay restarts) but not the plain rule
    poll(
        lambda: float(
            _one(engine, "SELECT extract(epoch FROM now() - last_confirmed_at) FROM rules WHERE id = :i", i=warning)
        )
        < 60,
        timeout=10,
    )
    assert (
        float(
            _one(
                engine, "SELECT extract(epoch FROM now() - last_confirmed_at) / 86400 FROM rules WHERE id = :i", i=plain
            )
        )
        > 29
    )
