"""Consolidation protects what it derives as the front protects what callers write (issue 16, items 9 and 10):
an extractor's facts and rules are redacted, and facts of listed predicates are sealed (value heads blinded)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.config import Settings, load_settings
from shared.crypto import new_key
from shared.embedding import get_embedder
from shared.extraction import NewFact, NewRule
from tests.integration.test_consolidation import (
    ScriptedExtractor,
    SpyEmbedder,
    consolidate,
    new_tenant,
    rows,
    store_episodes,
)


@pytest.fixture(scope="module")
def embedder() -> SpyEmbedder:
    return SpyEmbedder(get_embedder())


@pytest.fixture(scope="module")
def sealing(database_url: str, redis_url: str) -> Settings:
    return load_settings(
        database_url=database_url,
        redis_url=redis_url,
        encryption={"predicates": ["allergic_to"], "keys": {"k1": new_key()}, "active_key": "k1"},
    )


def test_derived_facts_of_a_listed_predicate_are_sealed_and_blinded(
    engine: Any, sealing: Settings, embedder: SpyEmbedder
) -> None:
    # given an episode the heuristic turns into an allergy (listed) and a home town (not listed)
    t = new_tenant(engine)
    store_episodes(engine, sealing, embedder, t, ["I am allergic to penicillin and I live in Lyon."])
    embedder.calls.clear()
    consolidate(engine, sealing, embedder, t)
    facts = rows(
        engine,
        "SELECT predicate, content, content_key_id, search_vector::text FROM facts "
        "WHERE tenant_id = :t ORDER BY predicate",
        t=t,
    )
    # then the allergy's predicate, content, full-text vector and embedded text hold no trace of the value
    (allergy_predicate, allergy, key_id, tsv), (home_predicate, home, home_key, _) = facts
    assert allergy_predicate.startswith("allergic_to_") and "penicillin" not in allergy_predicate
    assert allergy == "[ENCRYPTED allergic_to]" and key_id == "k1" and "penicillin" not in tsv
    assert not any("penicillin" in text for call in embedder.calls for text in call)
    # and the home town is stored as ever
    assert home_predicate == "lives_in" and "Lyon" in home and home_key is None
    events = json.dumps(
        [
            r[0]
            for r in rows(
                engine, "SELECT payload FROM memory_events WHERE tenant_id = :t AND entity_type <> 'episode'", t=t
            )
        ]
    )
    assert "penicillin" not in events

    # when the allergy is said again: the same blinded key, so it replaces the old fact instead of adding one
    store_episodes(engine, sealing, embedder, t, ["I'm allergic to penicillin."])
    consolidate(engine, sealing, embedder, t)
    assert rows(
        engine,
        "SELECT count(*) FROM facts WHERE tenant_id = :t AND predicate = :p AND validity = 'active'",
        t=t,
        p=allergy_predicate,
    ) == [(1,)]


def test_an_extractors_facts_rules_and_notes_are_redacted(
    engine: Any, sealing: Settings, embedder: SpyEmbedder
) -> None:
    # given an extractor that writes an e-mail address and a card number the (redacted) episode did not hold
    t = new_tenant(engine)
    [ep] = store_episodes(engine, sealing, embedder, t, ["Send the monthly report to the ops team."])
    answer = lambda r: {  # noqa: E731
        "facts": [
            NewFact(
                subject="ops team",
                predicate="email",
                content="The ops team reads ops@example.com",
                permanence="stable",
                source_episode_ids=[str(ep)],
            ).model_dump()
        ],
        "rules": [
            NewRule(
                content="Pay the report tool with card 4111 1111 1111 1111", source_episode_ids=[str(ep)]
            ).model_dump()
        ],
    }
    consolidate(engine, sealing, embedder, t, extractor=ScriptedExtractor(answer))
    # then what is stored, and its events, hold the placeholders and the counts
    assert rows(engine, "SELECT content FROM facts WHERE tenant_id = :t", t=t) == [("The ops team reads [EMAIL]",)]
    assert rows(engine, "SELECT content FROM rules WHERE tenant_id = :t", t=t) == [
        ("Pay the report tool with card [CARD]",)
    ]
    counts = {
        r[0]: r[1]
        for r in rows(
            engine,
            "SELECT event_type, payload->'redactions' FROM memory_events "
            "WHERE tenant_id = :t AND event_type IN ('fact.stored', 'rule.stored')",
            t=t,
        )
    }
    assert counts == {"fact.stored": {"email": 1}, "rule.stored": {"card": 1}}


def test_the_rotate_command_reseals_under_the_active_key(
    engine: Any, database_url: str, redis_url: str, embedder: SpyEmbedder, monkeypatch: Any, capsys: Any
) -> None:
    from memory_api.cli.main import main

    # given a fact sealed by consolidation under key "old"
    old, new = new_key(), new_key()
    settings = load_settings(
        database_url=database_url,
        redis_url=redis_url,
        encryption={"predicates": ["medical_condition"], "keys": {"old": old}, "active_key": "old"},
    )
    t = new_tenant(engine)
    store_episodes(engine, settings, embedder, t, ["I have asthma."])
    consolidate(engine, settings, embedder, t)
    [(fact_id, key_id)] = rows(engine, "SELECT id, content_key_id FROM facts WHERE tenant_id = :t", t=t)
    assert key_id == "old"
    # when the operator adds key "new", makes it active and runs the command
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("MEMORY_BUTLER_ENCRYPTION__KEYS", json.dumps({"old": old, "new": new}))
    monkeypatch.setenv("MEMORY_BUTLER_ENCRYPTION__ACTIVE_KEY", "new")
    monkeypatch.setenv("MEMORY_BUTLER_ENCRYPTION__PREDICATES", '["medical_condition"]')
    code = main(["encryption", "rotate"])
    out = capsys.readouterr().out
    # then the fact is sealed under "new" (rows of other tests under other key material are reported, not touched)
    assert "re-sealed under key 'new'" in out and code in (0, 1)
    assert rows(engine, "SELECT content_key_id FROM facts WHERE id = :i", i=fact_id) == [("new",)]
