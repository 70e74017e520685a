"""Forgetting that holds (issue 16, item 5), on the real database, model and consolidation: a forgotten episode's
text leaves the outbox and the audit trail, what only it taught is retracted (and comes back with it), and a
batch in flight does not learn from it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from memory_workers.extractors import HeuristicExtractor
from shared import writes
from shared.config import Settings, load_settings
from shared.consolidation import StaleBatch, apply_run, fetch_batch
from shared.consolidation_plan import plan_extraction
from shared.db import unit_of_work
from shared.embedding import get_embedder
from shared.writes import ALL, Actor
from tests.integration.test_consolidation import (
    BUTLER,
    NOW,
    SpyEmbedder,
    _ctx,
    consolidate,
    new_tenant,
    rows,
    store_episodes,
)

ACTOR = Actor("test", request_id="forget-req")


@pytest.fixture(scope="module")
def settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(database_url=database_url, redis_url=redis_url, consolidation={"batch_size": 10})


@pytest.fixture(scope="module")
def embedder() -> SpyEmbedder:
    return SpyEmbedder(get_embedder())


def run(engine: Any, fn: Any, tenant: str, **kw: Any) -> dict[str, Any]:
    with unit_of_work(engine) as conn:
        return fn(conn, tenant_id=tenant, visibility=ALL, actor=ACTOR, **kw)


def validity(engine: Any, table: str, entity_id: Any) -> str:
    return rows(engine, f"SELECT validity FROM {table} WHERE id = :i", i=entity_id)[0][0]


def test_forgetting_an_episode_scrubs_its_traces_and_retracts_what_only_it_taught(engine, settings, embedder):
    # given three episodes consolidated into facts and a rule, each derived from its episode
    t = new_tenant(engine)
    berlin_ep, name_ep, rule_ep = store_episodes(
        engine,
        settings,
        embedder,
        t,
        ["I live in Berlin.", "My name is Ana.", "Always confirm before sending outbound messages."],
    )
    consolidate(engine, settings, embedder, t)
    facts = dict(rows(engine, "SELECT predicate, id FROM facts WHERE tenant_id = :t", t=t))
    [(rule_id,)] = rows(engine, "SELECT id FROM rules WHERE tenant_id = :t", t=t)
    # and the name was also said in the Berlin episode (a second source)
    with unit_of_work(engine) as conn:
        conn.execute(
            text(
                "INSERT INTO memory_links (tenant_id, source_type, source_id, target_type, target_id, "
                "relation) VALUES (:t, 'fact', :f, 'episode', :e, 'derived_from')"
            ),
            {"t": t, "f": facts["name"], "e": berlin_ep},
        )
    assert "Berlin" in str(rows(engine, "SELECT payload FROM write_intents WHERE id = :i", i=berlin_ep)[0][0])

    # when the Berlin episode is forgotten
    result = run(engine, writes.forget, t, kind="episode", entity_id=berlin_ep, now=NOW)

    # then its write intent keeps its ids and key but not its text, at once
    [(payload, status, seq)] = rows(engine, "SELECT payload, status, seq FROM write_intents WHERE id = :i", i=berlin_ep)
    assert (payload, status, seq) == ({"scrubbed": True}, "applied", 1)
    # and its events keep ids and transition names, no content
    events = rows(engine, "SELECT event_type, payload FROM memory_events WHERE entity_id = :i ORDER BY id", i=berlin_ep)
    assert [e for e, _ in events][:2] == ["episode.stored", "episode.consolidated"]
    assert events[0][1] == {"butler": BUTLER, "seq": 1, "scrubbed": True}
    assert events[-1][0] == "episode.forgotten" and "Berlin" not in str(events)
    # and the fact only it taught is retracted, with its event; the name (also taught by another episode) stays
    assert result["retracted"] == [str(facts["lives_in"])]
    assert validity(engine, "facts", facts["lives_in"]) == "retracted"
    assert validity(engine, "facts", facts["name"]) == "active"
    [(event, why)] = rows(
        engine,
        "SELECT event_type, payload FROM memory_events WHERE entity_id = :i AND event_type LIKE 'fact.retract%'",
        i=facts["lives_in"],
    )
    assert (event, why) == (
        "fact.retracted",
        {"from_validity": "active", "cause": "sources_forgotten", "episodes": [str(berlin_ep)]},
    )

    # when the name's other source and the rule's only source are forgotten too, then they are retracted
    run(engine, writes.forget, t, kind="episode", entity_id=name_ep, now=NOW)
    run(engine, writes.forget, t, kind="episode", entity_id=rule_ep, now=NOW)
    assert validity(engine, "facts", facts["name"]) == "retracted"
    assert validity(engine, "rules", rule_id) == "retracted"

    # when the Berlin episode and the rule's episode are restored, then what they taught comes back
    restored = run(engine, writes.restore, t, kind="episode", entity_id=berlin_ep)
    assert sorted(restored["restored"]) == sorted([str(facts["lives_in"]), str(facts["name"])])
    run(engine, writes.restore, t, kind="episode", entity_id=rule_ep)
    assert validity(engine, "facts", facts["lives_in"]) == validity(engine, "facts", facts["name"]) == "active"
    assert validity(engine, "rules", rule_id) == "active"


def test_a_memory_forgotten_on_purpose_stays_forgotten_when_its_source_is_restored(engine, settings, embedder):
    # given a fact learned from one episode, forgotten by hand
    t = new_tenant(engine)
    [episode] = store_episodes(engine, settings, embedder, t, ["I live in Berlin."])
    consolidate(engine, settings, embedder, t)
    [(fact_id,)] = rows(engine, "SELECT id FROM facts WHERE tenant_id = :t", t=t)
    run(engine, writes.forget, t, kind="fact", entity_id=fact_id, now=NOW)
    # when its episode is forgotten and restored
    assert run(engine, writes.forget, t, kind="episode", entity_id=episode, now=NOW)["retracted"] == []
    restored = run(engine, writes.restore, t, kind="episode", entity_id=episode)
    # then the fact stays forgotten (only a retraction its sources caused is undone by restoring them)
    assert restored["restored"] == [] and validity(engine, "facts", fact_id) == "retracted"


def test_an_episode_forgotten_while_its_batch_is_in_flight_is_not_learned_from(engine, settings, embedder):
    # given a batch read and extracted (the extractor saw both episodes)
    t = new_tenant(engine)
    berlin, name = store_episodes(engine, settings, embedder, t, ["I live in Berlin.", "My name is Ana."])
    with unit_of_work(engine) as conn:
        batch = fetch_batch(conn, tenant_id=t, butler=BUTLER, limit=10, now=NOW)
    plan = plan_extraction(
        HeuristicExtractor().extract(batch.request(batch.active)),
        batch=batch,
        episode_ids=[e.id for e in batch.active],
        group="batch",
        extractor="heuristic",
    )
    assert len(plan.facts) == 2
    # when one episode is forgotten before the batch is applied
    run(engine, writes.forget, t, kind="episode", entity_id=berlin, now=NOW)
    # then applying the batch is refused as stale, nothing learned
    with pytest.raises(StaleBatch), unit_of_work(engine) as conn:
        apply_run(
            conn,
            batch=batch,
            plans=[plan],
            vectors=embedder.embed(plan.texts()),
            failures=[],
            ctx=_ctx(settings, embedder),
            isolate=False,
        )
    assert rows(engine, "SELECT count(*) FROM facts WHERE tenant_id = :t", t=t) == [(0,)]
    # and the next run learns only from the remembered episode
    consolidate(engine, settings, embedder, t)
    assert rows(engine, "SELECT predicate FROM facts WHERE tenant_id = :t", t=t) == [("name",)]
    assert rows(engine, "SELECT count(*) FROM memory_links WHERE tenant_id = :t AND target_id = :e", t=t, e=berlin) == [
        (0,)
    ]


def test_the_audit_trail_allows_a_scrub_and_nothing_else(engine):
    # given an event with content
    t = new_tenant(engine)
    entity = uuid.uuid4()
    with unit_of_work(engine) as conn:
        conn.execute(
            text(
                "INSERT INTO memory_events (tenant_id, event_type, entity_type, entity_id, actor, payload) "
                "VALUES (:t, 'rule.inverted', 'rule', :e, 'test', "
                '\'{"from": "candidate", "content": "secret text"}\')'
            ),
            {"t": t, "e": entity},
        )
    refused = [
        'UPDATE memory_events SET payload = \'{"from": "candidate", "content": "other text"}\' WHERE entity_id = :e',
        "UPDATE memory_events SET event_type = 'rule.stored' WHERE entity_id = :e",
        "UPDATE memory_events SET payload = memory_events_scrubbed(payload), actor = 'x' WHERE entity_id = :e",
        "DELETE FROM memory_events WHERE entity_id = :e",
    ]
    for sql in refused:  # when anything but the scrub is tried, then the trigger refuses it
        with pytest.raises(DBAPIError, match="append-only"), unit_of_work(engine) as conn:
            conn.execute(text(sql), {"e": entity})
    # when the scrub runs, then the content goes and the transition name stays
    with unit_of_work(engine) as conn:
        conn.execute(
            text("UPDATE memory_events SET payload = memory_events_scrubbed(payload) WHERE entity_id = :e"),
            {"e": entity},
        )
    assert rows(engine, "SELECT event_type, payload FROM memory_events WHERE entity_id = :e", e=entity) == [
        ("rule.inverted", {"from": "candidate", "scrubbed": True})
    ]
