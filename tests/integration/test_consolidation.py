"""memory.consolidate on the real database and model: extraction to memory, idempotency, poison isolation, redrive."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

from memory_workers.extractors import HeuristicExtractor
from memory_workers.tasks import Runtime
from memory_workers.tasks.consolidate import consolidate_key
from memory_workers.tasks.ingest import apply_pending
from shared import deadletters, intake, writes
from shared.config import Settings, load_settings
from shared.consolidation import StaleBatch, apply_run, fetch_batch, key_lock
from shared.consolidation_plan import plan_extraction
from shared.db import unit_of_work
from shared.embedding import get_embedder
from shared.errors import ExtractionError
from shared.extraction import Confirmation, Extraction, ExtractionRequest, NewFact, NewRule, validate_extraction
from shared.schemas import EpisodeWrite, FactWrite, RuleWrite
from shared.scoring import decay_rate_for
from shared.writes import Actor, Visibility

NOW = datetime.now(timezone.utc)
MAX_ATTEMPTS = 3
BUTLER = "general"


class SpyEmbedder:
    def __init__(self, inner: Any) -> None:
        self.inner, self.version, self.calls = inner, inner.version, []

    def embed(self, texts: Sequence[str]) -> Any:
        self.calls.append(list(texts))
        return self.inner.embed(texts)


class PoisonExtractor:
    """The heuristic extractor, except that any batch holding a "POISON" episode fails (as a bad LLM answer would)."""

    name = "poison-aware"

    def __init__(self) -> None:
        self.inner, self.calls = HeuristicExtractor(), []

    def extract(self, request: ExtractionRequest) -> Extraction:
        self.calls.append([e.content for e in request.episodes])
        if any("POISON" in e.content for e in request.episodes):
            raise ExtractionError("the model answered with prose")
        return self.inner.extract(request)


class ScriptedExtractor:
    """Answers with whatever ``script(request)`` builds, through the same validation gate a real extractor uses."""

    name = "scripted"

    def __init__(self, script: Callable[[ExtractionRequest], dict[str, Any]]) -> None:
        self.script = script

    def extract(self, request: ExtractionRequest) -> Extraction:
        return validate_extraction(self.script(request), request)


@pytest.fixture(scope="module")
def settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(
        database_url=database_url,
        redis_url=redis_url,
        consolidation={"max_attempts": MAX_ATTEMPTS, "batch_size": 10, "backoff_base_seconds": 30},
    )


@pytest.fixture(scope="module")
def embedder() -> SpyEmbedder:
    return SpyEmbedder(get_embedder())


def new_tenant(engine: Any) -> str:
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant_id})
    return tenant_id


def store_episodes(
    engine: Any,
    settings: Settings,
    embedder: SpyEmbedder,
    tenant_id: str,
    contents: Sequence[str],
    occurred_at: datetime | None = None,
) -> list[uuid.UUID]:
    """Accept and apply episodes the way the front and the ingest task do."""
    requests = [
        intake.WriteRequest(
            "episode",
            BUTLER,
            EpisodeWrite(content=c, butler=BUTLER, occurred_at=occurred_at).model_dump(mode="json"),
            None,
        )
        for c in contents
    ]
    with unit_of_work(engine) as conn:
        accepted = intake.accept(conn, tenant_id=tenant_id, writes=requests, actor="test", request_id=None)
    apply_pending(
        Runtime(settings, engine, embedder, HeuristicExtractor()),
        tenant_id=tenant_id,
        butler=BUTLER,
        actor=Actor("worker:test"),
    )
    return [a.id for a in accepted]


def consolidate(
    engine: Any,
    settings: Settings,
    embedder: SpyEmbedder,
    tenant_id: str,
    *,
    extractor: Any = None,
    now: datetime = NOW,
) -> Any:
    return consolidate_key(
        engine,
        extractor=extractor or HeuristicExtractor(),
        embedder=embedder,
        settings=settings,
        tenant_id=tenant_id,
        butler=BUTLER,
        worker="worker:test",
        clock=lambda: now,
        jitter=lambda: 0.0,
    )


def rows(engine: Any, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def links(engine: Any, tenant_id: str) -> set[tuple]:
    return set(
        rows(
            engine,
            "SELECT source_type, source_id, relation, target_type, target_id FROM memory_links WHERE tenant_id = :t",
            t=tenant_id,
        )
    )


def snapshot(engine: Any, tenant_id: str) -> tuple:
    return tuple(
        rows(engine, f"SELECT count(*) FROM {table} WHERE tenant_id = :t", t=tenant_id)[0][0]
        for table in ("facts", "rules", "memory_links", "memory_events", "consolidation_runs")
    )


def statuses(engine: Any, ids: Sequence[uuid.UUID]) -> list[tuple[str, int]]:
    found = {
        r.id: (r.consolidation_status, r.consolidation_attempts)
        for r in rows(
            engine,
            "SELECT id, consolidation_status, consolidation_attempts FROM episodes WHERE id = ANY(:ids)",
            ids=ids,
        )
    }
    return [found[i] for i in ids]


def test_the_heuristic_turns_real_sentences_into_facts_rules_and_links(engine, settings, embedder):
    t = new_tenant(engine)
    ids = store_episodes(
        engine,
        settings,
        embedder,
        t,
        [
            "My name is Ana Lopez.",
            "I am allergic to peanuts and shellfish.",
            "I live in Berlin.",
            "Always confirm before sending outbound messages.",
            "The weather was nice today.",
            "Update: I moved to Paris.",
        ],
    )
    calls_before = len(embedder.calls)

    summary = consolidate(engine, settings, embedder, t)

    facts = {
        (p, c): i for i, p, c in rows(engine, "SELECT id, predicate, content FROM facts WHERE tenant_id = :t", t=t)
    }
    assert set(facts) == {
        ("name", "User's name is Ana Lopez"),
        ("allergic_to_peanuts", "User is allergic to peanuts"),
        ("allergic_to_shellfish", "User is allergic to shellfish"),
        ("lives_in", "User lives in Paris"),
    }
    # what a batch learns is its butler's: nothing derived is published to every butler by default
    assert rows(engine, "SELECT DISTINCT scope FROM facts WHERE tenant_id = :t", t=t) == [(BUTLER,)]
    [(rule_id, rule, scope)] = rows(engine, "SELECT id, content, scope FROM rules WHERE tenant_id = :t", t=t)
    assert (rule, scope) == ("Always confirm before sending outbound messages", BUTLER)
    assert ("fact", facts[("lives_in", "User lives in Paris")], "derived_from", "episode", ids[5]) in links(engine, t)
    assert ("rule", rule_id, "derived_from", "episode", ids[3]) in links(engine, t)
    assert len(links(engine, t)) == 5 and statuses(engine, ids) == [("consolidated", 0)] * 6
    [run] = rows(
        engine,
        "SELECT outcome, episode_count, extractor, started_at <= finished_at FROM consolidation_runs "
        "WHERE tenant_id = :t",
        t=t,
    )
    assert tuple(run) == ("consolidated", 6, "heuristic", True)
    assert summary.batches == 1 and not summary.more
    assert len(embedder.calls) == calls_before + 1 and len(embedder.calls[-1]) == 5  # 4 facts + 1 rule, one call


def test_a_redelivered_batch_changes_nothing(engine, settings, embedder):
    t = new_tenant(engine)
    store_episodes(engine, settings, embedder, t, ["My name is Ana.", "I live in Berlin.", "Never call after 9pm."])
    with unit_of_work(engine) as conn:
        batch = fetch_batch(conn, tenant_id=t, butler=BUTLER, limit=10, now=NOW)
    consolidate(engine, settings, embedder, t)
    before = snapshot(engine, t)

    again = consolidate(engine, settings, embedder, t)  # the same task, delivered twice
    plan = plan_extraction(
        HeuristicExtractor().extract(batch.request(batch.active)),
        batch=batch,
        episode_ids=[e.id for e in batch.active],
        group="batch",
        extractor="heuristic",
    )
    with pytest.raises(StaleBatch), unit_of_work(engine) as conn:  # the same batch, applied twice
        apply_run(
            conn,
            batch=batch,
            plans=[plan],
            vectors=embedder.embed(plan.texts()),
            failures=[],
            ctx=_ctx(settings, embedder),
            isolate=False,
        )

    assert again.batches == 0 and snapshot(engine, t) == before
    assert rows(engine, "SELECT count(*) FROM facts WHERE tenant_id = :t", t=t) == [(2,)]


def _ctx(settings: Settings, embedder: SpyEmbedder) -> Any:
    from shared.consolidation import RunContext

    return RunContext(
        settings=settings,
        worker="worker:test",
        extractor="heuristic",
        embedding=embedder.version,
        now=NOW,
        jitter=lambda: 0.0,
    )


def test_later_batches_supersede_contradict_and_confirm_known_facts(engine, settings, embedder):
    t = new_tenant(engine)
    store_episodes(engine, settings, embedder, t, ["I live in Berlin.", "I am allergic to cats.", "My name is Ana."])
    consolidate(engine, settings, embedder, t)
    known = {p: i for i, p in rows(engine, "SELECT id, predicate FROM facts WHERE tenant_id = :t", t=t)}
    later = store_episodes(
        engine,
        settings,
        embedder,
        t,
        ["I moved to Paris.", "I'm no longer allergic to cats.", "As I said, my name is Ana."],
    )

    consolidate(engine, settings, embedder, t, now=NOW + timedelta(minutes=5))

    [(paris, berlin_by)] = rows(
        engine,
        "SELECT n.id, o.superseded_by_id FROM facts n JOIN facts o ON o.id = :o "
        "WHERE n.tenant_id = :t AND n.content = 'User lives in Paris'",
        o=known["lives_in"],
        t=t,
    )
    assert berlin_by == paris
    assert {
        ("fact", paris, "supersedes", "fact", known["lives_in"]),
        ("fact", paris, "derived_from", "episode", later[0]),
        ("episode", later[1], "contradicts", "fact", known["allergic_to_cats"]),
        ("episode", later[2], "supports", "fact", known["name"]),
    } <= links(engine, t)
    [(confirmed,)] = rows(engine, "SELECT last_confirmed_at FROM facts WHERE id = :i", i=known["name"])
    assert confirmed == NOW + timedelta(minutes=5)
    assert rows(
        engine, "SELECT count(*) FROM memory_events WHERE tenant_id = :t AND event_type = 'fact.contradicted'", t=t
    ) == [(1,)]


def test_a_fact_learned_from_an_older_episode_never_replaces_a_newer_fact(engine, settings, embedder):
    # given an explicit fact stored at 09:05 and an episode that happened at 09:00, consolidated at 09:10
    t = new_tenant(engine)
    nine = NOW.replace(hour=9, minute=0, second=0, microsecond=0) - timedelta(days=1)
    paris = uuid.uuid4()
    with unit_of_work(engine) as conn:
        writes.store_fact(
            conn,
            tenant_id=t,
            fact_id=paris,
            write=FactWrite(subject="user", predicate="lives_in", content="User lives in Paris", scope=BUTLER),
            vector=embedder.inner.embed_one("User lives in Paris"),
            embedding_version_id=None,
            source_butler=BUTLER,
            actor=Actor("test"),
            now=nine + timedelta(minutes=5),
        )
    store_episodes(engine, settings, embedder, t, ["I live in Berlin."], occurred_at=nine)
    consolidate(engine, settings, embedder, t, now=nine + timedelta(minutes=10))
    # then Paris stays the active fact and Berlin enters the chain as already superseded, dated 09:00
    assert set(rows(engine, "SELECT content, validity, created_at FROM facts WHERE tenant_id = :t", t=t)) == {
        ("User lives in Paris", "active", nine + timedelta(minutes=5)),
        ("User lives in Berlin", "superseded", nine),
    }


def test_a_batch_is_cut_at_its_token_budget(engine, settings, embedder):
    t = new_tenant(engine)
    store_episodes(engine, settings, embedder, t, ["word " * 300, "word " * 300, "I live in Oslo."])
    with unit_of_work(engine) as conn:
        tokens = [
            n
            for (n,) in conn.execute(
                text("SELECT content_tokens FROM episodes WHERE tenant_id = :t ORDER BY seq"), {"t": t}
            )
        ]
        cut = fetch_batch(conn, tenant_id=t, butler=BUTLER, limit=10, now=NOW, max_tokens=tokens[0] + 10)
        tiny = fetch_batch(conn, tenant_id=t, butler=BUTLER, limit=10, now=NOW, max_tokens=1)
        whole = fetch_batch(conn, tenant_id=t, butler=BUTLER, limit=10, now=NOW, max_tokens=sum(tokens))
    assert [len(b.episodes) for b in (cut, tiny, whole)] == [1, 1, 3]  # never empty, never over (but one)


def test_a_listed_predicate_is_published_to_every_butler(engine, database_url, redis_url, embedder):
    policy = load_settings(
        database_url=database_url, redis_url=redis_url, consolidation={"global_predicates": ["allergic_to"]}
    )
    t = new_tenant(engine)
    store_episodes(engine, policy, embedder, t, ["I am allergic to penicillin and I live in Lyon."])
    consolidate(engine, policy, embedder, t)
    assert set(rows(engine, "SELECT predicate, scope FROM facts WHERE tenant_id = :t", t=t)) == {
        ("allergic_to_penicillin", "global"),
        ("lives_in", BUTLER),
    }


def test_a_paraphrase_confirms_the_known_rule_and_an_anti_pattern_is_not_relearned(engine, settings, embedder):
    t = new_tenant(engine)
    store_episodes(
        engine,
        settings,
        embedder,
        t,
        ["Always answer me in metric units.", "Never call after 9pm.", "I am allergic to peanuts."],
    )
    consolidate(engine, settings, embedder, t)
    known = {c: i for i, c in rows(engine, "SELECT id, content FROM rules WHERE tenant_id = :t", t=t)}
    [(allergy,)] = rows(engine, "SELECT id FROM facts WHERE tenant_id = :t", t=t)
    # the 9pm rule is marked harmful until it is an anti-pattern
    with unit_of_work(engine) as conn:
        conn.execute(
            text(
                "UPDATE rules SET maturity = 'anti_pattern', content = 'ANTI-PATTERN: Do NOT never call "
                "after 9pm.', metadata = jsonb_build_object('original_content', content) WHERE id = :i"
            ),
            {"i": known["Never call after 9pm"]},
        )
    later = store_episodes(
        engine,
        settings,
        embedder,
        t,
        [
            "From now on, always use metric units in every answer.",  # a paraphrase: confirms
            "Never call after 9 pm, ever.",  # the anti-pattern said again: not relearned
            "Never call before 9am.",  # close in meaning, another time: a new rule
            "User mentioned they are allergic to peanut.",  # the fact reworded: confirms
        ],
    )
    summary = consolidate(engine, settings, embedder, t, now=NOW + timedelta(minutes=5))

    assert summary.batches == 1
    assert set(
        rows(engine, "SELECT content FROM rules WHERE tenant_id = :t AND id <> ALL(:k)", t=t, k=list(known.values()))
    ) == {("Never call before 9am",)}
    assert rows(engine, "SELECT count(*) FROM facts WHERE tenant_id = :t", t=t) == [(1,)]
    assert {
        ("episode", later[0], "supports", "rule", known["Always answer me in metric units"]),
        ("episode", later[3], "supports", "fact", allergy),
    } <= links(engine, t)
    [(confirmed,)] = rows(
        engine, "SELECT last_confirmed_at FROM rules WHERE id = :i", i=known["Always answer me in metric units"]
    )
    assert confirmed == NOW + timedelta(minutes=5)


def test_known_rules_that_say_the_same_thing_are_merged_into_the_oldest_with_their_evidence(engine, settings, embedder):
    t = new_tenant(engine)
    # given the same rule stored twice (by two callers, or learned before matching by meaning), each with evidence
    content = "Always answer me in metric units"
    older, newer = uuid.uuid4(), uuid.uuid4()
    rules = settings.memory.rules
    with unit_of_work(engine) as conn:
        for rule_id, at in ((older, NOW - timedelta(days=2)), (newer, NOW - timedelta(days=1))):
            writes.store_rule(
                conn,
                tenant_id=t,
                rule_id=rule_id,
                write=RuleWrite(content=content, scope=BUTLER),
                vector=embedder.embed([content])[0],
                embedding_version_id=None,
                source_butler=BUTLER,
                actor=Actor("test"),
                now=at,
                rules=rules,
            )
        for rule_id, marks in ((older, 2), (newer, 1)):
            for _ in range(marks):
                writes.mark_rule(
                    conn,
                    tenant_id=t,
                    rule_id=rule_id,
                    outcome="helpful",
                    reason=None,
                    visibility=Visibility(scopes=None, butlers=None),
                    actor=Actor("test"),
                    now=NOW,
                    rules=rules,
                )
    # when an episode says it once more and is consolidated
    store_episodes(engine, settings, embedder, t, ["From now on, always use metric units in every answer."])
    summary = consolidate(engine, settings, embedder, t, now=NOW + timedelta(minutes=5))

    # then the older rule is the one rule, holding every application; the newer is retracted (restorable)
    assert summary.batches == 1
    state = {
        r[0]: tuple(r[1:])
        for r in rows(engine, "SELECT id, validity, success_count, applied_count FROM rules WHERE tenant_id = :t", t=t)
    }
    assert state[older] == ("active", 3, 3) and state[newer][0] == "retracted"
    assert rows(engine, "SELECT count(*) FROM rule_applications WHERE rule_id = :r", r=older) == [(3,)]
    assert ("rule", older, "supersedes", "rule", newer) in links(engine, t)
    assert rows(
        engine,
        "SELECT payload->>'merged_into' FROM memory_events WHERE entity_id = :r AND event_type = 'rule.merged'",
        r=newer,
    ) == [(str(older),)]
    assert rows(engine, "SELECT count(*) FROM rules WHERE tenant_id = :t", t=t) == [(2,)]  # nothing new learned


def test_a_scripted_answer_supersedes_across_keys_and_links_supporting_facts(engine, settings, embedder):
    t = new_tenant(engine)
    employer, name = (
        _known_fact(engine, embedder, t, p, c)
        for p, c in (("employer", "Works at Acme"), ("name", "User's name is Ana"))
    )
    [ep] = store_episodes(engine, settings, embedder, t, ["Ana quit Acme and freelances now."])
    answer = lambda r: {  # noqa: E731
        "facts": [
            NewFact(
                subject="user",
                predicate="job",
                content="User freelances",
                permanence="stable",
                source_episode_ids=[str(ep)],
                supersedes_fact_id=str(employer),
            ).model_dump()
        ],
        "rules": [
            NewRule(
                content="Invoice clients monthly",
                source_episode_ids=[str(ep)],
                supporting_fact_refs=["facts[0]", str(name)],
            ).model_dump()
        ],
        "confirmations": [Confirmation(fact_id=str(name), source_episode_ids=[str(ep)]).model_dump()],
    }

    consolidate(engine, settings, embedder, t, extractor=ScriptedExtractor(answer))

    [(job, supersedes, decay)] = rows(
        engine, "SELECT id, supersedes_id, decay_rate FROM facts WHERE tenant_id = :t AND predicate = 'job'", t=t
    )
    [(rule,)] = rows(engine, "SELECT id FROM rules WHERE tenant_id = :t", t=t)
    assert supersedes == employer and decay == decay_rate_for("stable")
    assert rows(engine, "SELECT validity, superseded_by_id FROM facts WHERE id = :i", i=employer) == [
        ("superseded", job)
    ]
    assert links(engine, t) == {
        ("fact", job, "supersedes", "fact", employer),
        ("fact", job, "derived_from", "episode", ep),
        ("rule", rule, "derived_from", "episode", ep),
        ("fact", job, "supports", "rule", rule),
        ("fact", name, "supports", "rule", rule),
        ("episode", ep, "supports", "fact", name),
    }


def _known_fact(engine: Any, embedder: SpyEmbedder, tenant_id: str, predicate: str, content: str) -> uuid.UUID:
    fact_id = uuid.uuid4()
    with unit_of_work(engine) as conn:
        writes.store_fact(
            conn,
            tenant_id=tenant_id,
            fact_id=fact_id,
            write=FactWrite(subject="user", predicate=predicate, content=content),
            vector=embedder.inner.embed_one(content),
            embedding_version_id=None,
            source_butler=BUTLER,
            actor=Actor("test"),
            now=NOW - timedelta(days=1),
        )
    return fact_id


def test_a_poison_episode_fails_retries_and_dead_letters_while_its_key_proceeds(engine, settings, embedder):
    t = new_tenant(engine)
    extractor = PoisonExtractor()
    ids = store_episodes(engine, settings, embedder, t, ["My name is Ana.", "POISON pill", "I live in Berlin."])

    first = consolidate(engine, settings, embedder, t, extractor=extractor)

    assert statuses(engine, ids) == [("consolidated", 0), ("failed", 1), ("consolidated", 0)]
    [(retry_at, error)] = rows(
        engine, "SELECT next_consolidation_retry_at, last_consolidation_error FROM episodes WHERE id = :i", i=ids[1]
    )
    assert retry_at == NOW + timedelta(seconds=15) and error == "ExtractionError: the model answered with prose"
    assert rows(engine, "SELECT outcome FROM consolidation_runs WHERE tenant_id = :t", t=t) == [("partial",)]
    assert len(extractor.calls) == 4 and not first.more  # the batch, then each episode alone

    later = store_episodes(engine, settings, embedder, t, ["I am allergic to cats."])
    consolidate(engine, settings, embedder, t, extractor=extractor)  # the poison is not due yet: later ones proceed
    assert statuses(engine, [ids[1], *later]) == [("failed", 1), ("consolidated", 0)]

    consolidate(engine, settings, embedder, t, extractor=extractor, now=NOW + timedelta(hours=1))
    assert statuses(engine, [ids[1]]) == [("failed", 2)]
    consolidate(engine, settings, embedder, t, extractor=extractor, now=NOW + timedelta(hours=2))
    assert statuses(engine, [ids[1]]) == [("dead_letter", 3)]
    assert rows(engine, "SELECT next_consolidation_retry_at FROM episodes WHERE id = :i", i=ids[1]) == [(None,)]

    with unit_of_work(engine) as conn:
        [letter] = deadletters.list_dead_letters(conn, tenant_id=t)
        redriven = deadletters.redrive(conn, ids=[ids[1]], actor="test")
    assert (letter.id, letter.attempts, letter.error) == (ids[1], 3, error)
    assert [(r.kind, r.id) for r in redriven] == [("episode", ids[1])]
    assert statuses(engine, [ids[1]]) == [("pending", 0)]
    consolidate(engine, settings, embedder, t, now=NOW + timedelta(hours=2))  # the extractor was fixed
    assert statuses(engine, ids + later) == [("consolidated", 0)] * 4


def test_a_write_the_database_refuses_fails_only_its_episode(engine, settings, embedder):
    t = new_tenant(engine)
    ids = store_episodes(engine, settings, embedder, t, ["fine one", "NUL byte", "fine two"])

    def answer(request: ExtractionRequest) -> dict[str, Any]:
        return {
            "facts": [
                NewFact(
                    subject="user",
                    predicate=f"note_{e.seq}",
                    content=e.content.replace("NUL", "\x00"),
                    permanence="ephemeral",
                    source_episode_ids=[e.id],
                ).model_dump()
                for e in request.episodes
            ]
        }

    consolidate(engine, settings, embedder, t, extractor=ScriptedExtractor(answer))

    assert statuses(engine, ids) == [("consolidated", 0), ("failed", 1), ("consolidated", 0)]
    assert rows(engine, "SELECT content FROM facts WHERE tenant_id = :t ORDER BY content", t=t) == [
        ("fine one",),
        ("fine two",),
    ]


def test_a_run_stopped_by_the_soft_time_limit_still_counts_an_attempt(engine, settings, embedder):
    # given an extractor that hangs until Celery's soft time limit interrupts it (issue 16, item 11)
    from celery.exceptions import SoftTimeLimitExceeded

    class Hanging:
        name = "hanging"

        def extract(self, request: ExtractionRequest) -> Extraction:
            raise SoftTimeLimitExceeded()

    t = new_tenant(engine)
    ids = store_episodes(engine, settings, embedder, t, ["I live in Oslo.", "Never call after 9pm."])
    # when the run is interrupted, again and again
    for attempt in range(1, MAX_ATTEMPTS + 1):
        with pytest.raises(SoftTimeLimitExceeded):
            consolidate(engine, settings, embedder, t, extractor=Hanging(), now=NOW + timedelta(days=attempt))
        # then every interruption is an attempt: the episodes back off, and end dead-lettered instead of looping
        expected = "dead_letter" if attempt == MAX_ATTEMPTS else "failed"
        assert statuses(engine, ids) == [(expected, attempt)] * 2


def test_a_key_held_by_another_consolidation_is_left_alone(engine, settings, embedder):
    t = new_tenant(engine)
    ids = store_episodes(engine, settings, embedder, t, ["My name is Ana."])
    with key_lock(engine, tenant_id=t, butler=BUTLER) as held:
        assert held
        summary = consolidate(engine, settings, embedder, t)
    assert summary.busy and statuses(engine, ids) == [("pending", 0)]


def test_the_dead_letters_cli_lists_shows_and_redrives(
    engine, settings, embedder, database_url, redis_url, monkeypatch, capsys
):
    from memory_api.cli.main import main

    t = new_tenant(engine)
    ids = store_episodes(engine, settings, embedder, t, ["POISON again"])
    for hours in range(MAX_ATTEMPTS):
        consolidate(engine, settings, embedder, t, extractor=PoisonExtractor(), now=NOW + timedelta(hours=hours))
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    handlers = logging.getLogger().handlers[:]
    try:
        assert main(["dead-letters", "list", "--tenant", t, "--json"]) == 0
        [listed] = json.loads(capsys.readouterr().out)
        assert main(["dead-letters", "show", str(ids[0])]) == 0
        shown = capsys.readouterr().out
        assert main(["dead-letters", "redrive", "--all", "--tenant", t]) == 0
        redriven = capsys.readouterr().out
    finally:
        logging.getLogger().handlers[:] = handlers
    assert (listed["id"], listed["attempts"], listed["status"]) == (str(ids[0]), 3, "dead_letter")
    assert "attempts  3" in shown and "POISON again" in shown
    assert "redriven: 1 episode(s), 0 write intent(s)" in redriven
    assert "woke the workers of 1 shard key(s)" in redriven  # published to the test Redis
    assert statuses(engine, ids) == [("pending", 0)]
