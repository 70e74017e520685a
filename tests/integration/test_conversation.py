"""Episodes in their conversation, on the real database and model: the preceding turn (in order and out of order),
contextual and window vectors, imported time (occurred_at, since/until), and that none of it crosses a tenant
or a butler."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

from memory_workers.extractors import HeuristicExtractor
from memory_workers.tasks import Runtime
from memory_workers.tasks.ingest import apply_pending
from shared import intake
from shared.config import Settings, load_settings
from shared.db import unit_of_work
from shared.embedding import get_embedder, get_query_embedder, get_token_counter
from shared.reads import Reader
from shared.schemas import EpisodeWrite
from shared.writes import Actor, Visibility

ACTOR = Actor("worker:test")
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(database_url=database_url, redis_url=redis_url)


@pytest.fixture(scope="module")
def rt(settings: Settings, engine: Any) -> Runtime:
    return Runtime(settings, engine, get_embedder(), HeuristicExtractor())


@pytest.fixture(scope="module")
def reader(settings: Settings, engine: Any) -> Reader:
    return Reader(
        engine=engine,
        settings=settings,
        embed=get_query_embedder().embed_one,
        count_tokens=get_token_counter().count_many,
    )


def new_tenant(engine: Any) -> str:
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant_id})
    return tenant_id


def turn(content: str, session: uuid.UUID | None, minute: int, butler: str = "general") -> intake.WriteRequest:
    write = EpisodeWrite(content=content, butler=butler, session_id=session, occurred_at=T0 + timedelta(minutes=minute))
    return intake.WriteRequest("episode", butler, write.model_dump(mode="json"), None)


def store(engine: Any, rt: Runtime, tenant: str, writes: list[intake.WriteRequest]) -> list[uuid.UUID]:
    with unit_of_work(engine) as conn:
        accepted = intake.accept(conn, tenant_id=tenant, writes=writes, actor="test", request_id=None)
    for butler in {w.butler for w in writes}:
        apply_pending(rt, tenant_id=tenant, butler=butler, actor=ACTOR)
    return [a.id for a in accepted]


def state(engine: Any, tenant: str) -> dict[str, tuple]:
    """content -> (preceding, contextual vector as text or None, number of window vectors)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT e.content, e.preceding, (SELECT v.embedding::text FROM episode_vectors v "
                "WHERE v.episode_id = e.id AND v.n = 0), (SELECT count(*) FROM episode_vectors v "
                "WHERE v.episode_id = e.id AND v.n > 0) FROM episodes e WHERE e.tenant_id = :t"
            ),
            {"t": tenant},
        ).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def test_each_turn_carries_the_turn_before_it_and_a_vector_read_in_that_context(engine, rt):
    t, s = new_tenant(engine), uuid.uuid4()
    store(
        engine,
        rt,
        t,
        [
            turn("User: Do you still play badminton?", s, 0),
            turn("Assistant: Yes, twice last month!", s, 1),
            turn("User: Nice.", s, 2),
            turn("User: unrelated, no session", None, 3),
        ],
    )
    got = state(engine, t)
    assert got["User: Do you still play badminton?"][:2] == (None, None)
    assert got["Assistant: Yes, twice last month!"][0] == "User: Do you still play badminton?"
    assert got["User: Nice."][0] == "Assistant: Yes, twice last month!"
    assert got["Assistant: Yes, twice last month!"][1] is not None and got["User: Nice."][1] is not None
    assert got["User: unrelated, no session"][:2] == (None, None)


def test_a_turn_that_arrives_before_its_predecessor_is_recontextualised_when_the_predecessor_lands(engine, rt):
    t, s = new_tenant(engine), uuid.uuid4()
    store(engine, rt, t, [turn("User: I booked the flight to Lisbon.", s, 0), turn("User: It leaves at noon.", s, 2)])
    before = state(engine, t)["User: It leaves at noon."]
    assert before[0] == "User: I booked the flight to Lisbon."

    # the turn between them arrives late (occurred_at orders the session, not arrival)
    store(engine, rt, t, [turn("Assistant: Great, which airline?", s, 1)])

    after = state(engine, t)
    assert after["Assistant: Great, which airline?"][0] == "User: I booked the flight to Lisbon."
    assert after["User: It leaves at noon."][0] == "Assistant: Great, which airline?"
    assert after["User: It leaves at noon."][1] != before[1]  # its contextual vector was re-embedded


def test_a_butler_never_gets_another_butlers_turn_as_its_context(engine, rt):
    t, s = new_tenant(engine), uuid.uuid4()
    store(
        engine,
        rt,
        t,
        [
            turn("User: my private diagnosis is X", s, 0, butler="health"),
            turn("User: book a table", s, 1, butler="general"),
        ],
    )
    assert state(engine, t)["User: book a table"][0] is None


def test_a_long_episode_is_also_embedded_as_overlapping_windows(engine, rt):
    t = new_tenant(engine)
    long = "Assistant: " + " ".join(f"step {i}: check the valve and log the pressure." for i in range(120))
    store(engine, rt, t, [turn(long, uuid.uuid4(), 0), turn("User: short one", None, 1)])
    got = state(engine, t)
    assert got[long][2] >= 3 and got["User: short one"][2] == 0


def test_a_turn_is_found_through_the_words_of_the_turn_before_it(engine, rt, reader):
    t, s = new_tenant(engine), uuid.uuid4()
    filler = [turn(f"User: note {i} about groceries and errands", uuid.uuid4(), 10 + i) for i in range(8)]
    store(
        engine,
        rt,
        t,
        [
            turn("User: How often did you go kayaking?", s, 0),
            turn("Assistant: Twice last month, both on Sundays.", s, 1),
            *filler,
        ],
    )
    hits = reader.search(
        tenant_id=t,
        visibility=Visibility(scopes=("global",), butlers=("general",)),
        query="kayaking",
        types=["episode"],
        mode="keyword",
        limit=5,
        min_confidence=None,
    )
    assert [h.content for h in hits[:2]] == [
        "User: How often did you go kayaking?",
        "Assistant: Twice last month, both on Sundays.",
    ]


def test_a_search_lists_a_sessions_answering_turns_together_and_spreads_only_below_its_head(
    settings, engine, rt, reader
):
    # one session answers in three turns; another mentions the place once
    t, trip, other = new_tenant(engine), uuid.uuid4(), uuid.uuid4()
    store(
        engine,
        rt,
        t,
        [
            turn("User: the sailing trip to Crete was wonderful", trip, 0),
            turn("Assistant: sailing around Crete in May is wonderful", trip, 1),
            turn("User: yes, sailing off Crete, wonderful weather", trip, 2),
            turn("User: my cousin lives on Crete", other, 3),
        ],
    )

    def sessions(of: Reader) -> list[str]:
        hits = of.search(
            tenant_id=t,
            visibility=Visibility(scopes=("global",), butlers=("general",)),
            query="wonderful sailing trip to Crete",
            types=["episode"],
            mode="keyword",
            limit=4,
            min_confidence=None,
        )
        return ["trip" if h.content != "User: my cousin lives on Crete" else "other" for h in hits]

    def with_settings(**update: object) -> Reader:
        of = copy.copy(reader)
        of.retrieval = settings.memory.retrieval.model_copy(update=update)
        return of

    # memory_search's head ranks by relevance alone (retrieval.search_diversity_head, 10): the session's turns lead
    assert settings.memory.retrieval.search_diversity_head >= 4
    assert sessions(reader) == ["trip", "trip", "trip", "other"]
    # below its head, a list spreads over sessions (recall and context have their own: retrieval.diversity_decay)
    assert sessions(with_settings(search_diversity_head=1, search_diversity_decay=0.01)) == [
        "trip",
        "other",
        "trip",
        "trip",
    ]
    assert sessions(with_settings(search_diversity_head=2, search_diversity_decay=0.01))[:3] == [
        "trip",
        "trip",
        "other",
    ]
    # and decay 1 never spreads
    assert sessions(with_settings(search_diversity_head=0, search_diversity_decay=1.0)) == [
        "trip",
        "trip",
        "trip",
        "other",
    ]


@pytest.mark.parametrize("mode", ["keyword", "semantic", "hybrid"])
def test_a_caller_of_two_butlers_finds_both_butlers_turns_and_never_a_thirds(engine, rt, reader, mode):
    # given the same conversation kept by three butlers of one tenant (each reads its butlers one at a time)
    t = new_tenant(engine)
    for butler in ("health", "finance", "travel"):
        s = uuid.uuid4()
        store(
            engine,
            rt,
            t,
            [
                turn(f"User: How often did you go kayaking? ({butler})", s, 0, butler=butler),
                turn(f"Assistant: Twice last month, both on Sundays. ({butler})", s, 1, butler=butler),
            ],
        )

    # when a caller of two of them searches
    def search(*butlers: str) -> list[tuple[str, float]]:
        hits = reader.search(
            tenant_id=t,
            visibility=Visibility(scopes=("global",), butlers=butlers),
            query="how often kayaking",
            types=["episode"],
            mode=mode,
            limit=10,
            min_confidence=None,
        )
        return [(h.butler, round(h.relevance, 9)) for h in hits]

    hits = search("health", "finance")
    # then it finds all four of their turns (the answer also through its preceding turn) and none of the third's
    assert sorted(butler for butler, _ in hits) == ["finance", "finance", "health", "health"]
    # and a butler named twice is read once (its rows would otherwise count twice in the keyword leg's statistics)
    assert search("health", "finance", "health") == hits


def test_imported_history_keeps_its_time_expires_from_acceptance_and_can_be_bounded(engine, rt, reader):
    t, s = new_tenant(engine), uuid.uuid4()
    store(
        engine,
        rt,
        t,
        [turn("User: we adopted a cat named Miso", s, 0), turn("User: Miso the cat turned two", s, 60 * 24 * 30)],
    )
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT occurred_at, created_at, expires_at FROM episodes WHERE tenant_id = :t ORDER BY occurred_at"),
            {"t": t},
        ).all()
    assert rows[0].occurred_at == T0 and rows[1].occurred_at == T0 + timedelta(days=30)
    assert all(r.expires_at > datetime.now(timezone.utc) and r.created_at > T0 for r in rows)
    view = Visibility(scopes=("global",), butlers=("general",))

    def contents(**bounds: datetime) -> list[str]:
        return [
            h.content
            for h in reader.search(
                tenant_id=t,
                visibility=view,
                query="Miso the cat",
                types=["episode"],
                mode="hybrid",
                limit=5,
                min_confidence=None,
                **bounds,
            )
        ]

    assert len(contents()) == 2
    assert contents(until=T0 + timedelta(days=1)) == ["User: we adopted a cat named Miso"]
    assert contents(since=T0 + timedelta(days=1)) == ["User: Miso the cat turned two"]


def test_vectors_and_context_of_another_tenant_never_answer(engine, rt, reader):
    mine, theirs = new_tenant(engine), new_tenant(engine)
    secret = "Assistant: " + " ".join(f"the vault code is 4471 and the safe is in room {i}." for i in range(80))
    store(engine, rt, theirs, [turn("User: where is the vault code?", s := uuid.uuid4(), 0), turn(secret, s, 1)])
    store(engine, rt, mine, [turn("User: I like tea", uuid.uuid4(), 0)])
    for mode in ("semantic", "keyword", "hybrid"):
        hits = reader.search(
            tenant_id=mine,
            visibility=Visibility(scopes=("global",), butlers=("general",)),
            query="vault code safe room",
            types=["episode"],
            mode=mode,
            limit=10,
            min_confidence=None,
        )
        assert all(h.content == "User: I like tea" for h in hits)


def postings(engine: Any, tenant: str) -> dict[str, dict[str, tuple[float, float]]]:
    """content -> {lexeme: (tf, ctf)} as episode_terms holds them."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT e.content, t.lexeme, t.tf, t.ctf FROM episode_terms t JOIN episodes e "
                "ON e.id = t.episode_id WHERE t.tenant_id = :t"
            ),
            {"t": tenant},
        ).all()
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for content, lexeme, tf, ctf in rows:
        out.setdefault(content, {})[lexeme] = (tf, ctf)
    return out


def test_term_postings_follow_the_turn_and_the_turn_before_it_also_when_it_arrives_late(engine, rt):
    t, s = new_tenant(engine), uuid.uuid4()
    store(engine, rt, t, [turn("User: kayaking, kayaking and more kayaking", s, 0), turn("User: on Sundays", s, 2)])
    got = postings(engine, t)
    assert got["User: kayaking, kayaking and more kayaking"]["kayak"] == (3.0, 0.0)
    assert got["User: on Sundays"]["sunday"] == (1.0, 0.0)
    assert got["User: on Sundays"]["kayak"] == (0.0, 3.0)  # from the turn before it

    # a turn arrives between them: the later turn's context (and so its postings) changes
    store(engine, rt, t, [turn("Assistant: Which lake?", s, 1)])
    got = postings(engine, t)
    assert "kayak" not in got["User: on Sundays"] and got["User: on Sundays"]["lake"] == (0.0, 1.0)
    assert got["Assistant: Which lake?"]["kayak"] == (0.0, 3.0)

    with unit_of_work(engine) as conn:  # a deleted episode takes its postings with it
        conn.execute(text("DELETE FROM episodes WHERE tenant_id = :t AND content = 'User: on Sundays'"), {"t": t})
    assert "User: on Sundays" not in postings(engine, t)
