"""The memory domain on the real database and the real model: supersession, decay, feedback, retrieval, context."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg._queries
import pytest
from sqlalchemy import event, text

from shared import candidates, writes
from shared.config import load_settings
from shared.errors import InvalidTransition
from shared.consolidation_plan import fact_text
from shared.db import BINARY_RESULTS, make_engine, unit_of_work
from shared.embedding import Embedder, get_embedder, get_token_counter, to_pgvector
from shared.reads import Reader, session_settings
from shared.references import ReferenceBumper
from shared.schemas import FactWrite, RuleWrite
from shared.writes import ALL, Actor, Visibility
from tests.dashboard_seed import Seeded
from tests.dashboard_seed import episodes as seed_episodes

SETTINGS = load_settings()
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
ACTOR = Actor("test", request_id="req-1")


@pytest.fixture(scope="module")
def embedder():
    return get_embedder()


@pytest.fixture(scope="module")
def reader(engine, embedder):
    return Reader(
        engine=engine, settings=SETTINGS, embed=embedder.embed_one, count_tokens=get_token_counter().count_many
    )


def test_a_query_embedded_on_two_threads_matches_the_batch_embedding(embedder):
    """The read path's embedder splits one query over two threads; its vectors must be the batch embedder's."""
    texts = ["what does the user drink in the morning?", "KX-4411", "a longer sentence about oat milk " * 20]
    two = Embedder(threads=2).embed(texts)
    assert two.shape == (3, 384)
    assert float(abs(two - embedder.embed(texts)).max()) < 1e-6


def new_tenant(engine) -> str:
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant_id})
    return tenant_id


def fact(
    engine,
    embedder,
    tenant_id,
    subject,
    predicate,
    content,
    *,
    now=NOW,
    permanence="standard",
    scope="global",
    importance=5.0,
):
    write = FactWrite(
        subject=subject, predicate=predicate, content=content, permanence=permanence, scope=scope, importance=importance
    )
    fid = uuid.uuid4()
    with unit_of_work(engine) as conn:
        writes.store_fact(
            conn,
            tenant_id=tenant_id,
            fact_id=fid,
            write=write,
            vector=embedder.embed_one(fact_text(subject, predicate, content)),
            embedding_version_id=None,
            source_butler="general",
            actor=ACTOR,
            now=now,
        )
    return fid


def rule(engine, embedder, tenant_id, content, *, now=NOW, scope="global"):
    rid = uuid.uuid4()
    with unit_of_work(engine) as conn:
        writes.store_rule(
            conn,
            tenant_id=tenant_id,
            rule_id=rid,
            write=RuleWrite(content=content, scope=scope),
            vector=embedder.embed_one(content),
            embedding_version_id=None,
            source_butler="general",
            actor=ACTOR,
            now=now,
            rules=SETTINGS.memory.rules,
        )
    return rid


def test_supersession_keeps_one_active_fact_and_a_chain(engine, embedder):
    t = new_tenant(engine)
    first = fact(engine, embedder, t, "user", "home_city", "Lives in Berlin")
    second = fact(engine, embedder, t, "user", "home_city", "Lives in Lisbon")
    with engine.connect() as conn:
        rows = {
            r.id: r
            for r in conn.execute(
                text("SELECT id, validity, supersedes_id, superseded_by_id FROM facts WHERE tenant_id = :t"), {"t": t}
            )
        }
        link = conn.execute(
            text("SELECT relation FROM memory_links WHERE source_id = :s AND target_id = :o"), {"s": second, "o": first}
        ).scalar()
        events = conn.execute(
            text("SELECT event_type, request_id FROM memory_events WHERE tenant_id = :t ORDER BY id"), {"t": t}
        ).all()
    assert rows[first].validity == "superseded" and rows[first].superseded_by_id == second
    assert rows[second].validity == "active" and rows[second].supersedes_id == first
    assert link == "supersedes"
    assert ("fact.superseded", "req-1") in [tuple(e) for e in events]


def test_concurrent_supersession_leaves_one_active_fact(engine, embedder):
    t = new_tenant(engine)
    vec = embedder.embed_one("user favourite colour")
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def store(i: int) -> None:
        try:
            barrier.wait()
            with unit_of_work(engine) as conn:
                writes.store_fact(
                    conn,
                    tenant_id=t,
                    fact_id=uuid.uuid4(),
                    vector=vec,
                    embedding_version_id=None,
                    write=FactWrite(subject="user", predicate="favourite_colour", content=f"colour {i}"),
                    source_butler="general",
                    actor=ACTOR,
                    now=NOW,
                )
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=store, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == []
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, validity, supersedes_id FROM facts WHERE tenant_id = :t"), {"t": t}).all()
    active = [r for r in rows if r.validity == "active"]
    assert len(rows) == 8 and len(active) == 1
    # the chain is consistent: every fact but the first supersedes exactly one other, and no fact is superseded twice
    supersedes = [r.supersedes_id for r in rows if r.supersedes_id]
    assert len(supersedes) == 7 and len(set(supersedes)) == 7


def test_hybrid_finds_a_keyword_only_and_a_paraphrase_only_match(engine, embedder, reader):
    t = new_tenant(engine)
    keyword_only = fact(engine, embedder, t, "user", "vehicle", "Owns a Zx81-Qtron hoverboard, serial KX-4411")
    paraphrase = fact(engine, embedder, t, "user", "dietary_restriction", "Cannot digest milk products")
    for i in range(30):
        fact(engine, embedder, t, "user", f"note_{i}", f"Went hiking in the mountains on trip number {i}")
    view = Visibility(scopes=("global",), butlers=("general",))
    by_keyword = reader.search(
        tenant_id=t,
        visibility=view,
        query="KX-4411",
        types=["fact"],
        mode="keyword",
        limit=5,
        min_confidence=None,
        now=NOW,
    )
    by_meaning = reader.search(
        tenant_id=t,
        visibility=view,
        query="is the user lactose intolerant?",
        types=["fact"],
        mode="semantic",
        limit=5,
        min_confidence=None,
        now=NOW,
    )
    assert by_keyword[0].id == keyword_only
    assert by_meaning[0].id == paraphrase
    for query, expected in (("KX-4411", keyword_only), ("is the user lactose intolerant?", paraphrase)):
        hybrid = reader.search(
            tenant_id=t,
            visibility=view,
            query=query,
            types=["fact"],
            mode="hybrid",
            limit=3,
            min_confidence=None,
            now=NOW,
        )
        assert expected in [h.id for h in hybrid]


def test_the_index_paths_of_a_large_scope_answer_as_the_scoped_paths_do(engine, embedder, reader, monkeypatch):
    """Small scopes read the caller's rows once (exact distance, any-term match); large ones use the HNSW and GIN
    indexes. Forced onto the index paths, a small tenant's reads must give the same answers."""
    t = new_tenant(engine)
    for i, (predicate, content) in enumerate(
        [
            ("drink", "Drinks oat milk in coffee every morning"),
            ("pet", "Has a parrot named Kiwi"),
            ("vehicle", "Owns a hoverboard with serial KX-4411"),
            ("work", "Commutes to the office by bicycle"),
        ]
    ):
        fact(engine, embedder, t, "user", predicate, content, importance=3.0 + i)
    rule(engine, embedder, t, "Ask before booking a trip on the user's behalf")
    view = Visibility(scopes=("global",), butlers=("general",))

    def answers() -> list[list[tuple]]:
        out = []
        for mode in ("semantic", "keyword", "hybrid"):
            for query in ("what does the user drink in the morning?", "KX-4411 parrot", "booking a trip"):
                hits = reader.search(
                    tenant_id=t,
                    visibility=view,
                    query=query,
                    types=["fact", "rule"],
                    mode=mode,
                    limit=10,
                    min_confidence=None,
                    now=NOW,
                )
                out.append([(h.id, round(h.relevance, 4)) for h in hits])
        return out

    # the scope sizes counted by the first pass stay cached for the second (with SMALL_SCOPE 0 a fresh count
    # would be capped at 0 and change the idf)
    monkeypatch.setattr(candidates, "VISIBLE_TTL_S", 3600.0)
    scoped = answers()
    monkeypatch.setattr(candidates, "EXACT_SCOPE", 0)
    monkeypatch.setattr(candidates, "SMALL_SCOPE", 0)
    indexed = answers()
    assert sum(len(a) for a in scoped) > 20
    assert indexed == scoped


def test_keyword_mode_matches_any_term_and_ranks_more_rare_terms_higher(engine, embedder, reader):
    t = new_tenant(engine)
    both = fact(engine, embedder, t, "user", "pet", "Has a parrot named Kiwi")
    one = fact(engine, embedder, t, "user", "fruit", "Likes kiwi smoothies")
    view = Visibility(scopes=("global",), butlers=("general",))
    hits = reader.search(
        tenant_id=t,
        visibility=view,
        query="what is the name of the user's parrot kiwi",
        types=["fact"],
        mode="keyword",
        limit=5,
        min_confidence=None,
        now=NOW,
    )
    assert [h.id for h in hits][:2] == [both, one]


def test_decay_moves_a_fact_out_of_recall_without_touching_the_row_and_confirm_brings_it_back(engine, embedder, reader):
    t = new_tenant(engine)
    old = NOW - timedelta(days=60)
    fid = fact(engine, embedder, t, "user", "recent_meal", "Had ramen for dinner", permanence="ephemeral", now=old)
    view = Visibility(scopes=("global",), butlers=("general",))
    recalled = reader.recall(tenant_id=t, visibility=view, topic="what did the user eat", limit=5, now=NOW)
    assert fid not in [h.id for h in recalled]  # 1.0 * exp(-0.1 * 60) = 0.0025 < 0.2
    with engine.connect() as conn:
        row = conn.execute(text("SELECT confidence, validity FROM facts WHERE id = :i"), {"i": fid}).one()
    assert (row.confidence, row.validity) == (1.0, "active")  # stored confidence untouched
    with_floor_zero = reader.recall(
        tenant_id=t, visibility=view, topic="what did the user eat", limit=5, min_confidence=0.0, now=NOW
    )
    assert fid in [h.id for h in with_floor_zero]
    with unit_of_work(engine) as conn:
        writes.confirm(conn, tenant_id=t, kind="fact", entity_id=fid, visibility=ALL, actor=ACTOR, now=NOW)
    recalled = reader.recall(tenant_id=t, visibility=view, topic="what did the user eat", limit=5, now=NOW)
    assert recalled[0].id == fid and recalled[0].effective_confidence == pytest.approx(1.0)


def mark(engine, t, rid, outcome, n, reason=None, now=NOW):
    for _ in range(n):
        with unit_of_work(engine) as conn:
            result = writes.mark_rule(
                conn,
                tenant_id=t,
                rule_id=rid,
                outcome=outcome,
                reason=reason,
                visibility=ALL,
                actor=ACTOR,
                now=now,
                rules=SETTINGS.memory.rules,
            )
    return result


def test_forget_is_idempotent_reaches_history_and_stops_feedback(engine, embedder):
    t = new_tenant(engine)
    old = fact(engine, embedder, t, "user", "lives_in", "User lives in Berlin")
    fact(engine, embedder, t, "user", "lives_in", "User lives in Lisbon")  # supersedes Berlin
    rid = rule(engine, embedder, t, "Always book aisle seats")

    def run(fn, **kw):
        with unit_of_work(engine) as conn:
            return fn(conn, tenant_id=t, visibility=ALL, actor=ACTOR, **kw)

    # a superseded fact can be forgotten (wrong history must go too), twice without error, and comes back as history
    run(writes.forget, kind="fact", entity_id=old, now=NOW)
    assert run(writes.forget, kind="fact", entity_id=old, now=NOW)["already"] is True
    with engine.connect() as conn:
        events = conn.execute(
            text("SELECT count(*) FROM memory_events WHERE entity_id = :i AND event_type = 'fact.forgotten'"),
            {"i": old},
        ).scalar()
    assert events == 1
    run(writes.restore, kind="fact", entity_id=old)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT validity FROM facts WHERE id = :i"), {"i": old}).scalar() == "superseded"
    # feedback on a forgotten rule is refused, classified
    run(writes.forget, kind="rule", entity_id=rid, now=NOW)
    with pytest.raises(InvalidTransition):
        run(writes.mark_rule, rule_id=rid, outcome="helpful", reason=None, now=NOW, rules=SETTINGS.memory.rules)


def test_old_successes_do_not_shield_a_rule_that_harms_now(engine, embedder, reader):
    # given a rule that helped 15 times a year ago (proven by then) and harmed twice this week
    t = new_tenant(engine)
    rid = rule(engine, embedder, t, "Book the cheapest flight available", now=NOW - timedelta(days=500))
    mark(engine, t, rid, "helpful", 15, now=NOW - timedelta(days=365))
    mark(engine, t, rid, "harmful", 1, reason="a 30-hour layover", now=NOW - timedelta(days=2))
    result = mark(engine, t, rid, "harmful", 1, reason="missed a wedding", now=NOW)
    # then the counters alone (15 vs 2, effectiveness 0.65) would keep it established; weighted by age (half-life
    # 90 days: a year-old success counts 0.06) the recent harm dominates, and it is demoted to candidate
    assert result["effectiveness_score"] < 0.2
    assert result["maturity"] == "candidate"
    # and memory_get shows the evidence behind it
    got = reader.get(tenant_id=t, visibility=ALL, kind="rule", entity_id=rid)
    assert (got["evidence"]["helpful"], got["evidence"]["harmful"]) == (15, 2)
    assert [a["outcome"] for a in got["evidence"]["latest"][:2]] == ["harmful", "harmful"]
    assert got["evidence"]["latest"][0]["reason"] == "missed a wedding"


def test_ten_successes_two_harmful_scores_056_and_stays_candidate(engine, embedder):
    t = new_tenant(engine)
    rid = rule(engine, embedder, t, "Always confirm before sending outbound messages")
    mark(engine, t, rid, "helpful", 10)
    result = mark(engine, t, rid, "harmful", 2, reason="sent twice")
    assert result["effectiveness_score"] == pytest.approx(10 / 18.01)
    # it was established after 5 successes; two harmful marks (4x weight) bring it back to candidate
    assert result["maturity"] == "candidate"
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM rule_applications WHERE rule_id = :r"), {"r": rid}).scalar() == 12
        )


def test_three_harmful_marks_invert_a_weak_rule(engine, embedder):
    t = new_tenant(engine)
    rid = rule(engine, embedder, t, "Schedule meetings at 7am.")
    mark(engine, t, rid, "harmful", 2, reason="user was asleep")
    result = mark(engine, t, rid, "harmful", 1, reason="missed the meeting")
    assert result["maturity"] == "anti_pattern"
    with engine.connect() as conn:
        content = conn.execute(text("SELECT content FROM rules WHERE id = :r"), {"r": rid}).scalar()
    assert content == (
        "ANTI-PATTERN: Do NOT schedule meetings at 7am. This caused problems because: "
        "user was asleep; user was asleep; missed the meeting"
    )


def test_forget_is_reversible_and_fails_closed_when_the_key_is_taken(engine, embedder, reader):
    t = new_tenant(engine)
    first = fact(engine, embedder, t, "user", "name", "John", permanence="permanent")
    with unit_of_work(engine) as conn:
        writes.forget(conn, tenant_id=t, kind="fact", entity_id=first, visibility=ALL, actor=ACTOR, now=NOW)
    view = Visibility(scopes=("global",), butlers=("general",))
    assert reader.recall(tenant_id=t, visibility=view, topic="user name", limit=5, now=NOW) == []
    with unit_of_work(engine) as conn:
        writes.restore(conn, tenant_id=t, kind="fact", entity_id=first, visibility=ALL, actor=ACTOR)
    assert [h.id for h in reader.recall(tenant_id=t, visibility=view, topic="user name", limit=5, now=NOW)] == [first]
    with unit_of_work(engine) as conn:
        writes.forget(conn, tenant_id=t, kind="fact", entity_id=first, visibility=ALL, actor=ACTOR, now=NOW)
    fact(engine, embedder, t, "user", "name", "Johnny", permanence="permanent")
    from shared.errors import IntegrityViolation

    with pytest.raises(IntegrityViolation):
        with unit_of_work(engine) as conn:
            writes.restore(conn, tenant_id=t, kind="fact", entity_id=first, visibility=ALL, actor=ACTOR)


def test_tenant_a_never_reads_tenant_b(engine, embedder, reader):
    a, b = new_tenant(engine), new_tenant(engine)
    secret = fact(engine, embedder, a, "user", "password_hint", "The secret word is marmalade")
    secret_rule = rule(engine, embedder, a, "Always say marmalade when greeting")
    fact(engine, embedder, b, "user", "name", "Bob")
    view = ALL  # even an admin view of tenant B must not see tenant A
    for mode in ("semantic", "keyword", "hybrid"):
        hits = reader.search(
            tenant_id=b,
            visibility=view,
            query="secret word marmalade",
            types=["fact", "rule"],
            mode=mode,
            limit=20,
            min_confidence=0.0,
            now=NOW,
        )
        assert {h.id for h in hits}.isdisjoint({secret, secret_rule}), mode
    assert {
        h.id
        for h in reader.recall(tenant_id=b, visibility=view, topic="marmalade", limit=20, min_confidence=0.0, now=NOW)
    }.isdisjoint({secret, secret_rule})
    block = reader.context(tenant_id=b, visibility=view, trigger_prompt="marmalade", token_budget=3000, now=NOW)
    assert "marmalade" not in block.text
    from shared.errors import NotFound

    for kind, ident in (("fact", secret), ("rule", secret_rule)):
        with pytest.raises(NotFound):
            reader.get(tenant_id=b, visibility=view, kind=kind, entity_id=ident)
        with pytest.raises(NotFound), unit_of_work(engine) as conn:
            writes.confirm(conn, tenant_id=b, kind=kind, entity_id=ident, visibility=view, actor=ACTOR, now=NOW)
    assert all(e["entity_id"] not in (secret, secret_rule) for e in reader.activity(tenant_id=b, since=0, limit=1000))


def test_scope_filter_hides_other_butlers_memories(engine, embedder, reader):
    t = new_tenant(engine)
    health = fact(engine, embedder, t, "user", "medication", "Takes vitamin D daily", scope="health")
    shared_fact = fact(engine, embedder, t, "user", "name", "Ann", scope="global")
    finance_view = Visibility(scopes=("global", "finance"), butlers=("finance",))
    ids = {
        h.id
        for h in reader.search(
            tenant_id=t,
            visibility=finance_view,
            query="vitamin D medication user",
            types=["fact"],
            mode="hybrid",
            limit=20,
            min_confidence=0.0,
            now=NOW,
        )
    }
    assert health not in ids and shared_fact in ids


@pytest.fixture(scope="module")
def context_tenant(engine, embedder):
    t = new_tenant(engine)
    for i in range(40):
        fact(
            engine,
            embedder,
            t,
            "user",
            f"preference_{i}",
            f"Prefers option {i} for scheduling and travel " * (1 + i % 4),
            now=NOW - timedelta(days=i),
            importance=1 + i % 10,
        )
    for i in range(15):
        rid = rule(engine, embedder, t, f"Always double-check travel bookings, variant {i}")
        if i % 5 == 0:
            mark(engine, t, rid, "harmful", 3, reason=f"booking {i} went wrong")
    return t


@pytest.mark.parametrize("budget", [50, 80, 120, 300, 1000, 3000, 8000])
def test_context_never_exceeds_its_budget_and_is_identical_across_runs(reader, context_tenant, budget):
    view = Visibility(scopes=("global",), butlers=("general",))
    first = reader.context(
        tenant_id=context_tenant, visibility=view, trigger_prompt="plan a trip", token_budget=budget, now=NOW
    )
    second = reader.context(
        tenant_id=context_tenant, visibility=view, trigger_prompt="plan a trip", token_budget=budget, now=NOW
    )
    assert get_token_counter().count(first.text) == first.tokens <= budget
    assert first.text == second.text
    if budget >= 300:
        assert "### What You Know (Facts)" in first.text
        assert "confirmed" in first.text and "[candidate, global]" in first.text
    if budget >= 3000:
        assert "### Avoid (Anti-patterns)" in first.text and "ANTI-PATTERN: Do NOT" in first.text


def test_a_late_applied_older_fact_does_not_supersede_a_newer_one(engine, embedder):
    # given a fact accepted at 10:00 applied after a fact for the same key accepted at 11:00 (a retried write)
    t = new_tenant(engine)
    newer = fact(engine, embedder, t, "user", "home_city", "Lives in Porto", now=NOW)
    older = fact(engine, embedder, t, "user", "home_city", "Lives in Lisbon", now=NOW - timedelta(hours=1))
    with engine.connect() as conn:
        rows = {
            r.id: r
            for r in conn.execute(
                text("SELECT id, validity, superseded_by_id FROM facts WHERE tenant_id = :t"), {"t": t}
            )
        }
    # then the latest accepted write stays active and the late one joins the chain as superseded
    assert rows[newer].validity == "active"
    assert rows[older].validity == "superseded" and rows[older].superseded_by_id == newer


def test_a_search_asking_for_more_hits_than_the_candidate_pool_gets_them_in_every_mode(engine, embedder, reader):
    # given 70 facts that all hold the searched word (more than the 50 candidates each leg gathers by default)
    t = new_tenant(engine)
    for i in range(70):
        fact(engine, embedder, t, "user", f"trip_{i}", f"Went hiking in the Vosges mountains on trip number {i}")
    # when a search asks for 70 hits, in each mode
    for mode in ("keyword", "semantic", "hybrid"):
        hits = reader.search(
            tenant_id=t,
            visibility=ALL,
            query="hiking Vosges",
            types=["fact"],
            mode=mode,
            limit=70,
            min_confidence=None,
            now=NOW,
        )
        # then it gets all 70, not the first 50 of one leg
        assert len(hits) == 70, mode


def test_rules_are_not_starved_by_many_facts_in_context(engine, embedder, reader):
    # given a tenant with 60 facts about the topic and two rules about it (each section has its own pool)
    t = new_tenant(engine)
    for i in range(60):
        fact(engine, embedder, t, "user", f"garden_note_{i}", f"The user's garden bed {i} grows tomatoes and basil")
    rules = [
        rule(engine, embedder, t, "Suggest watering the garden in the early morning"),
        rule(engine, embedder, t, "Ask before ordering new seeds for the garden"),
    ]
    # when a butler asks for its context about the garden
    block = reader.context(
        tenant_id=t, visibility=ALL, trigger_prompt="what should I do in the garden today?", token_budget=2000, now=NOW
    )
    # then the rules section holds both rules next to the facts
    assert set(block.included.get("rules", [])) == {str(r) for r in rules}
    assert len(block.included.get("facts", [])) >= 10


def test_a_memory_shown_yesterday_does_not_outrank_a_clearly_better_match_today(engine, embedder):
    # given two facts: one clearly about the question, one shown in yesterday's block on another topic
    t = new_tenant(engine)
    better = fact(
        engine, embedder, t, "user", "allergy", "The user is allergic to peanuts", now=NOW - timedelta(days=60)
    )
    shown = fact(
        engine, embedder, t, "user", "snack", "The user snacks on crisps in the evening", now=NOW - timedelta(days=60)
    )
    bumper = ReferenceBumper(engine, interval=3600)
    reader = Reader(
        engine=engine,
        settings=SETTINGS,
        embed=embedder.embed_one,
        count_tokens=get_token_counter().count_many,
        bumper=bumper,
    )
    yesterday = reader.context(
        tenant_id=t,
        visibility=ALL,
        trigger_prompt="evening crisps snack",
        token_budget=500,
        now=NOW - timedelta(days=1),
    )
    assert str(shown) in yesterday.included["facts"]
    bumper.close()  # writes the bumps of yesterday's block
    with engine.connect() as conn:
        count, referenced = conn.execute(
            text("SELECT reference_count, last_referenced_at FROM facts WHERE id = :i"), {"i": shown}
        ).one()
    # then the block counted it, but did not make it look recently used
    assert count >= 1 and referenced < NOW - timedelta(days=30)
    # and today the better match leads
    hits = reader.recall(tenant_id=t, visibility=ALL, topic="does the user have a peanut allergy?", limit=2, now=NOW)
    assert hits[0].id == better


def test_a_bump_flush_never_waits_for_a_row_a_worker_holds_and_writes_its_bump_at_the_next_flush(engine, embedder):
    # given two facts, one of them row-locked by another transaction (a worker consolidating it)
    t = new_tenant(engine)
    held = fact(engine, embedder, t, "user", "city", "The user lives in Lyon")
    free = fact(engine, embedder, t, "user", "pet", "The user has a cat called Miso")
    bumper = ReferenceBumper(engine, interval=3600)
    bumper.add([("fact", held), ("fact", free)], recent=False)
    worker = engine.connect()
    worker.begin()
    worker.execute(text("SELECT 1 FROM facts WHERE id = :i FOR UPDATE"), {"i": held})

    # when the bumper flushes while the row is held (on a thread: a flush that waited would not come back)
    written: list[int] = []
    flushing = threading.Thread(target=lambda: written.append(bumper.flush()))
    flushing.start()
    flushing.join(timeout=10)
    stuck = flushing.is_alive()
    worker.rollback()
    worker.close()
    flushing.join()

    def count(i) -> int:  # noqa: ANN001
        with engine.connect() as conn:
            return conn.execute(text("SELECT reference_count FROM facts WHERE id = :i"), {"i": i}).scalar_one()

    # then it came back at once with the free row bumped and the held one left for later
    assert not stuck and written == [1]
    assert (count(free), count(held)) == (1, 0)
    # and the next flush, the row let go, writes the held one's bump (once)
    assert bumper.flush() == 1 and bumper.flush() == 0
    assert (count(free), count(held)) == (1, 1)
    bumper.close()


def test_a_use_is_written_within_a_second_and_a_blocks_bumps_gather_until_their_own_interval(engine, embedder):
    # given a bumper that writes uses every 50 ms and context blocks' bumps every hour
    t = new_tenant(engine)
    used = fact(engine, embedder, t, "user", "city", "The user lives in Lyon", now=NOW - timedelta(days=60))
    shown = fact(engine, embedder, t, "user", "pet", "The user has a cat called Miso", now=NOW - timedelta(days=60))
    bumper = ReferenceBumper(engine, interval=0.05, shown_interval=3600)

    def count(i) -> int:  # noqa: ANN001
        with engine.connect() as conn:
            return conn.execute(text("SELECT reference_count FROM facts WHERE id = :i"), {"i": i}).scalar_one()

    # when one fact is searched once and the other shown in three blocks
    bumper.add([("fact", used)])
    for _ in range(3):
        bumper.add([("fact", shown)], recent=False)
    deadline = time.monotonic() + 10
    while count(used) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # several more of the short flushes

    # then the use is written by the short flushes, the shown fact's bumps still wait, gathered
    assert count(used) == 1 and count(shown) == 0
    # and closing writes the three of them
    bumper.close()
    assert count(shown) == 3


def test_a_read_pools_retrieval_reads_are_one_statement_and_its_other_reads_keep_their_transaction(
    engine, embedder, database_url
):
    """The front's read pools carry the retrieval settings in their sessions: a search is its candidate statement
    alone (no BEGIN, settings, COMMIT), with the settings in force; a memory_get still reads in a transaction that
    asks for custom plans. On an engine without those sessions a search still opens its transaction."""
    t = new_tenant(engine)
    wanted = fact(engine, embedder, t, "user", "vehicle", "Owns a Zx81-Qtron hoverboard, serial KX-4411")
    view = Visibility(scopes=("global",), butlers=("general",))
    read_engine = make_engine(database_url, pre_ping=False, session_settings=session_settings(SETTINGS))
    pooled = Reader(
        engine=read_engine, settings=SETTINGS, embed=embedder.embed_one, count_tokens=get_token_counter().count_many
    )
    plain = Reader(
        engine=engine, settings=SETTINGS, embed=embedder.embed_one, count_tokens=get_token_counter().count_many
    )

    def statements(reader: Reader, source, read) -> list[str]:  # noqa: ANN001
        seen: list[str] = []

        def record(_conn, _cursor, statement, *_) -> None:  # noqa: ANN001
            seen.append(statement)

        event.listen(source, "before_cursor_execute", record)
        try:
            read(reader)
        finally:
            event.remove(source, "before_cursor_execute", record)
        return seen

    def search(reader: Reader) -> None:
        hits = reader.search(
            tenant_id=t,
            visibility=view,
            query="KX-4411 hoverboard",
            types=["fact"],
            mode="hybrid",
            limit=5,
            min_confidence=None,
            now=NOW,
        )
        assert hits[0].id == wanted

    try:
        search(pooled)  # the tenant's visible-row count is cached after its first read
        one = statements(pooled, read_engine, search)
        assert len(one) == 1 and "BEGIN" not in one[0] and "COMMIT" not in one[0]
        with read_engine.connect() as conn:
            shown = conn.execute(
                text(
                    "SELECT setting FROM pg_settings WHERE name IN ('statement_timeout', 'plan_cache_mode') ORDER BY name"
                )
            ).scalars()
            assert list(shown) == ["force_generic_plan", str(SETTINGS.memory.retrieval.read_timeout_ms)]
        # memory_context too: its newest episodes (the conversation so far, matching the prompt or not) come in
        # the same statement as its candidates; another butler's newest episode stays out
        with unit_of_work(engine) as conn:
            seed_episodes(
                conn,
                Seeded(tenant=t),
                [
                    ("fair", "general", "Booked the train to the hoverboard fair in Lyon"),
                    ("dentist", "health", "Moved the dentist appointment to Tuesday"),
                    ("latest", "general", "The cat knocked over a glass of water"),
                ],
                now=NOW,
            )
        block = None

        def context(reader: Reader) -> None:
            nonlocal block
            block = reader.context(
                tenant_id=t, visibility=view, trigger_prompt="hoverboard serial", token_budget=1000, now=NOW
            )

        context(pooled)
        one = statements(pooled, read_engine, context)
        assert len(one) == 1 and "BEGIN" not in one[0]
        # the driver converts that statement's placeholders once, not on every read, long as it is (shared.db)
        assert len(one[0]) > 4096
        converted = psycopg._queries._query2pg.cache_info()
        context(pooled)
        after = psycopg._queries._query2pg.cache_info()
        assert (after.hits, after.misses) == (converted.hits + 1, converted.misses)
        assert block is not None and "The cat knocked over" in block.text and "hoverboard fair" in block.text
        assert "dentist" not in block.text
        got = statements(
            pooled, read_engine, lambda r: r.get(tenant_id=t, visibility=view, kind="fact", entity_id=wanted)
        )
        assert got[0].startswith("BEGIN") and "plan_cache_mode = auto" in got[0] and got[-1] == "COMMIT"
        around = statements(plain, engine, search)
        assert around[0].startswith("BEGIN") and "force_generic_plan" in around[0] and around[-1] == "COMMIT"
    finally:
        read_engine.dispose()


def test_the_candidate_statement_reads_the_same_rows_in_the_binary_format(engine, embedder):
    # given a tenant holding facts, a rule and episodes of two butlers
    t = new_tenant(engine)
    fact(engine, embedder, t, "user", "home_city", "Lives in Porto")
    fact(engine, embedder, t, "user", "drink", "Drinks oat milk in coffee", now=NOW - timedelta(days=3))
    rule(engine, embedder, t, "Suggest oat milk when ordering coffee")
    with unit_of_work(engine) as conn:
        seed_episodes(
            conn,
            Seeded(tenant=t),
            [("cafe", "general", "Ordered a coffee with oat milk"), ("gp", "health", "Booked the GP for Friday")],
            now=NOW,
        )
    f = candidates.Filter(tenant_id=t, scopes=("global", "health"), butlers=("health",), min_confidence=0.0, now=NOW)
    query = "coffee with oat milk"
    vec = to_pgvector(embedder.embed_one(query))
    with engine.connect() as conn:
        statement, params = candidates.prepare(
            conn, kinds=("fact", "rule", "episode"), f=f, query=query, query_vec=vec, pool=50, recent=5
        )
        # when its rows are read in the binary format (as gather reads them) and in the text format
        binary = conn.execute(statement, params).all()
        as_text = conn.execute(statement.execution_options(**{BINARY_RESULTS: False}), params).all()
        # then they are the same values of the same types, every kind's rows there
        assert statement.get_execution_options()[BINARY_RESULTS] is True
        assert binary == as_text and [list(map(type, row)) for row in binary] == [list(map(type, r)) for r in as_text]
        assert {row.kind for row in binary} == {"fact", "rule", "episode", "recent"}
        # and the option switches that statement's cursor only: an extension type comes back as bytes in the binary
        # format (no loader for it), so the statement after it, unmarked, reads text again
        vector = text("SELECT CAST('[1,2,3]' AS vector)")
        assert isinstance(conn.execute(vector.execution_options(**{BINARY_RESULTS: True})).scalar(), bytes)
        assert conn.execute(vector).scalar() == "[1,2,3]"


def test_a_long_query_alone_runs_on_the_second_session_and_embeds_as_the_batch_embedder_does(embedder):
    """One query of at least query_long_tokens word pieces runs on the session with more threads; a short one, or
    the same long one in a batch, on the one-thread session. Every vector is the batch embedder's."""
    query = Embedder(threads=1, query=True, long=(2, 64))
    backend = query._run
    assert backend._long is not None
    ran: list[str] = []
    for name, session in (("short", backend._session), ("long", backend._long[0])):
        run = session.run
        session.run = lambda *a, _run=run, _name=name, **k: ran.append(_name) or _run(*a, **k)
    long_text = "my parents and I are planning a spring trip to Portugal, near the river and the old town " * 4
    short_text = "what does the user drink in the morning?"
    vectors = [query.embed([long_text]), query.embed([short_text]), query.embed([long_text, short_text])]
    assert ran == ["long", "short", "short"]
    expected = embedder.embed([long_text, short_text])
    assert float(abs(vectors[0][0] - expected[0]).max()) < 1e-5
    assert float(abs(vectors[1][0] - expected[1]).max()) < 1e-5
    assert float(abs(vectors[2] - expected).max()) < 1e-5
