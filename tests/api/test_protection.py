"""Redaction and field-level encryption through the real MCP client (issue 16, items 9 and 10): what the rows, the
outbox payload and the audit events hold, what each caller reads back, and key rotation."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from shared.config import Settings, load_settings
from shared.crypto import new_key
from shared.protection import open_facts
from shared.rekey import rotate, stale_count
from tests.api.conftest import Butler, Front, applied, new_token

CARD = "4111 1111 1111 1111"
MAIL = "ada.lovelace@example.org"
KEY_1, KEY_2 = new_key(), new_key()


def _intent_payload(engine: Engine, memory_id: str) -> str:
    with engine.connect() as conn:
        return json.dumps(
            conn.execute(text("SELECT payload FROM write_intents WHERE id = :i"), {"i": memory_id}).scalar_one()
        )


def _stored_event(engine: Engine, memory_id: str, event_type: str) -> dict:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT payload FROM memory_events WHERE entity_id = :i AND event_type = :e"),
            {"i": memory_id, "e": event_type},
        ).scalar_one()


def test_episode_fact_and_rule_are_redacted_before_the_outbox(worker, health: Butler, engine: Engine) -> None:
    # when a butler stores an episode, a fact and a rule holding an e-mail address, a card number and an API key
    episode = health.ok(
        "memory_store_episode", butler="health", content=f"User said: mail me at {MAIL}, my card is {CARD}"
    )
    fact = health.ok(
        "memory_store_fact",
        subject=MAIL,
        predicate="email_address",
        content=f"The user's e-mail address is {MAIL}",
        scope="health",
    )
    rule = health.ok(
        "memory_store_rule", content="Never paste the key sk-proj-abcdefghijklmnopqrstuvwx0123 in chats", scope="health"
    )
    batch = health.ok("memory_ingest_batch", episodes=[{"butler": "health", "content": "Call me on +44 20 7946 0958"}])
    # then the outbox rows the front wrote already hold only the placeholders
    assert "7946" not in _intent_payload(engine, batch["items"][0]["id"])
    assert applied(health, "episode", batch["items"][0]["id"])["content"] == "Call me on [PHONE]"
    for accepted in (episode, fact, rule):
        payload = _intent_payload(engine, accepted["id"])
        assert MAIL not in payload and "4111" not in payload and "sk-proj" not in payload
    # and so do the stored rows, as every reader sees them
    assert applied(health, "episode", episode["id"])["content"] == "User said: mail me at [EMAIL], my card is [CARD]"
    stored_fact = applied(health, "fact", fact["id"])
    assert stored_fact["subject"] == "[EMAIL]" and stored_fact["content"] == "The user's e-mail address is [EMAIL]"
    assert applied(health, "rule", rule["id"])["content"] == "Never paste the key [SECRET] in chats"
    # and each write's audit event counts what was redacted, per detector
    assert _stored_event(engine, episode["id"], "episode.stored")["redactions"] == {"email": 1, "card": 1}
    assert _stored_event(engine, fact["id"], "fact.stored")["redactions"] == {"email": 2}
    assert _stored_event(engine, rule["id"], "rule.stored")["redactions"] == {"secret": 1}
    assert stored_fact["metadata"]["redactions"] == {"email": 2}
    # and a harmful mark's reason is redacted before it reaches the applications and the events
    health.ok("memory_mark_harmful", rule_id=rule["id"], reason=f"it made me send {MAIL} to a stranger")
    with engine.connect() as conn:
        reasons = (
            conn.execute(text("SELECT reason FROM rule_applications WHERE rule_id = :r"), {"r": rule["id"]})
            .scalars()
            .all()
        )
        events = json.dumps(
            conn.execute(
                text("SELECT array_agg(payload) FROM memory_events WHERE entity_id = :r"), {"r": rule["id"]}
            ).scalar_one()
        )
    assert reasons == ["it made me send [EMAIL] to a stranger"] and MAIL not in events


def test_nothing_is_redacted_for_a_tenant_whose_policy_is_off(
    worker, api_settings: Settings, engine: Engine, tenant_a: str
) -> None:
    # given a front whose settings turn redaction off for this tenant only
    settings = load_settings(
        database_url=api_settings.database_url,
        redis_url=api_settings.redis_url,
        redaction={"tenants": {tenant_a: {"enabled": False}}},
    )
    with Front(settings) as front:
        butler = Butler(front.url, new_token(engine, tenant_a, ["health"]))
        out = butler.ok("memory_store_episode", butler="health", content=f"mail me at {MAIL}")
        # then the episode is stored as given, and its event counts nothing
        assert applied(butler, "episode", out["id"])["content"] == f"mail me at {MAIL}"
        assert "redactions" not in _stored_event(engine, out["id"], "episode.stored")


@pytest.fixture(scope="module")
def sealed_front(api_settings: Settings) -> Iterator[Front]:
    """A front sealing facts about medical conditions with key k1; only the health butler reads them."""
    settings = load_settings(
        database_url=api_settings.database_url,
        redis_url=api_settings.redis_url,
        encryption={
            "predicates": ["medical_condition"],
            "keys": {"k1": KEY_1},
            "active_key": "k1",
            "readers": ["health"],
        },
    )
    with Front(settings) as front:
        yield front


def test_a_sealed_fact_is_encrypted_at_rest_and_opened_only_for_its_readers(
    worker, sealed_front: Front, engine: Engine, tenant_a: str, api_settings: Settings
) -> None:
    health = Butler(sealed_front.url, new_token(engine, tenant_a, ["health"]))
    finance = Butler(sealed_front.url, new_token(engine, tenant_a, ["finance"]))
    # when the health butler stores a global fact whose predicate is listed
    out = health.ok(
        "memory_store_fact",
        subject="user",
        predicate="medical condition",
        content="The user has type 1 diabetes and takes insulin",
    )
    stored = applied(health, "fact", out["id"])
    # then neither the outbox nor the row's content, its full-text vector or its event hold the plaintext
    assert "diabetes" not in _intent_payload(engine, out["id"])
    with engine.connect() as conn:
        row = (
            conn.execute(
                text(
                    "SELECT content, content_key_id, content_sealed, search_vector::text AS tsv "
                    "FROM facts WHERE id = :i"
                ),
                {"i": out["id"]},
            )
            .mappings()
            .one()
        )
    assert row["content"] == "[ENCRYPTED medical_condition]" and row["content_key_id"] == "k1"
    assert b"diabetes" not in bytes(row["content_sealed"]) and "diabet" not in row["tsv"]
    assert _stored_event(engine, out["id"], "fact.stored")["sealed_with"] == "k1"
    # and a reader (health) gets the plaintext from memory_get, while finance, who sees the global fact, does not
    assert stored["content"] == "The user has type 1 diabetes and takes insulin"
    assert finance.ok("memory_get", type="fact", id=out["id"])["memory"]["content"] == "[ENCRYPTED medical_condition]"
    # and the fact is found by its subject and predicate's meaning, never by the plaintext's words
    found = health.ok("memory_search", query="the user's medical condition", types=["fact"], mode="semantic")
    assert [h["content"] for h in found["results"] if h["id"] == out["id"]] == [stored["content"]]
    by_word = health.ok("memory_search", query="diabetes insulin", types=["fact"], mode="keyword")
    assert out["id"] not in [h["id"] for h in by_word["results"]]
    recalled = finance.ok("memory_recall", topic="medical condition of the user")
    assert [h["content"] for h in recalled["results"] if h["id"] == out["id"]] == ["[ENCRYPTED medical_condition]"]
    # and memory_context opens it for the health butler's block only
    assert (
        "diabetes" in health.ok("memory_context", trigger_prompt="user medical condition", butler="health")["context"]
    )
    assert (
        "diabetes"
        not in finance.ok("memory_context", trigger_prompt="user medical condition", butler="finance")["context"]
    )

    # when the key is rotated to k2 (k1 still listed to open the old rows)
    rotated = load_settings(
        database_url=api_settings.database_url,
        encryption={"predicates": ["medical_condition"], "keys": {"k1": KEY_1, "k2": KEY_2}, "active_key": "k2"},
    ).encryption
    assert stale_count(engine, active="k2") >= 1
    progress = list(rotate(engine, settings=rotated, batch=2))
    assert sum(p.rotated for p in progress) >= 1
    # (rows of other tests sealed under another key material named k1 are skipped and reported, not broken)
    skipped = {i for p in progress for i in p.skipped}
    assert uuid.UUID(out["id"]) not in skipped
    # then the row is sealed under k2, opens with k2 alone, and no longer with k1
    only_k2 = load_settings(
        encryption={"predicates": ["medical_condition"], "keys": {"k2": KEY_2}, "active_key": "k2"}
    ).encryption
    only_k1 = load_settings(
        encryption={"predicates": ["medical_condition"], "keys": {"k1": KEY_1}, "active_key": "k1"}
    ).encryption
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT content_key_id FROM facts WHERE id = :i"), {"i": out["id"]}).scalar_one() == "k2"
        )
        ids = [uuid.UUID(out["id"])]
        assert open_facts(conn, tenant_id=tenant_a, ids=ids, settings=only_k2)[ids[0]].startswith("The user has type 1")
        assert open_facts(conn, tenant_id=tenant_a, ids=ids, settings=only_k1) == {}
        # and another tenant's id list opens nothing of this tenant
        assert open_facts(conn, tenant_id="someone-else", ids=ids, settings=only_k2) == {}
    assert stale_count(engine, active="k2") == len(skipped)  # a second run re-seals nothing more
    assert sum(p.rotated for p in rotate(engine, settings=rotated)) == 0


def test_dashboard_edits_are_redacted_too(front: Front, engine: Engine, api_settings: Settings) -> None:
    # given an admin correcting a fact and rewriting a rule on the dashboard with an e-mail address and a card
    from tests.api.conftest import new_tenant
    from tests.api.dashboard_client import Dash
    from tests.dashboard_seed import seed

    seeded = seed(engine, new_tenant(engine), api_settings)
    admin = Dash(front.base, new_token(engine, seeded.tenant, ["*"], role="admin"))
    out = admin.ok("PUT", f"/api/memory/facts/{seeded.facts['color']}", json={"content": f"Ask {MAIL} for the color"})
    admin.ok("PUT", f"/api/memory/rules/{seeded.rules['proven']}", json={"content": f"Pay with {CARD} only"})
    # then the rows hold the placeholders
    assert admin.get(f"/api/memory/facts/{out['id']}")["fact"]["content"] == "Ask [EMAIL] for the color"
    assert admin.get(f"/api/memory/rules/{seeded.rules['proven']}")["rule"]["content"] == "Pay with [CARD] only"
