"""A small, realistic tenant for the dashboard tests, written through the real domain services (shared.writes):
episodes, facts (one superseded), rules at several maturities (feedback through mark_rule), with real embeddings."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine

from shared import writes
from shared.config import Settings
from shared.db import unit_of_work
from shared.embedding import get_query_embedder
from shared.intake import WriteRequest, accept
from shared.schemas import EpisodeWrite, FactWrite, RuleWrite
from shared.writes import Actor, NewEpisode

ACTOR = Actor("seed", "seed-request")


@dataclass
class Seeded:
    tenant: str
    facts: dict[str, uuid.UUID] = field(default_factory=dict)
    rules: dict[str, uuid.UUID] = field(default_factory=dict)
    episodes: dict[str, uuid.UUID] = field(default_factory=dict)


def _embed(text: str):  # noqa: ANN202 - numpy row
    return get_query_embedder().embed_one(text)


def fact(
    conn,
    seeded: Seeded,
    name: str,
    *,
    subject: str,
    predicate: str,
    content: str,  # noqa: ANN001
    scope: str = "global",
    permanence: str = "standard",
    now: datetime,
    butler: str = "health",
    source_episode: uuid.UUID | None = None,
) -> uuid.UUID:
    """store_fact, as a worker applies memory_store_fact."""
    write = FactWrite(
        subject=subject,
        predicate=predicate,
        content=content,
        scope=scope,
        permanence=permanence,
        source_episode_id=source_episode,
    )
    fact_id = uuid.uuid4()
    writes.store_fact(
        conn,
        tenant_id=seeded.tenant,
        fact_id=fact_id,
        write=write,
        vector=_embed(content),
        embedding_version_id=None,
        source_butler=butler,
        actor=ACTOR,
        now=now,
    )
    seeded.facts[name] = fact_id
    return fact_id


def rule(
    conn,
    seeded: Seeded,
    name: str,
    *,
    content: str,
    scope: str,
    settings: Settings,  # noqa: ANN001
    now: datetime,
    helpful: int = 0,
    harmful: int = 0,
) -> uuid.UUID:
    """store_rule, then feedback through mark_rule (which moves maturity as the evidence says)."""
    rule_id = uuid.uuid4()
    writes.store_rule(
        conn,
        tenant_id=seeded.tenant,
        rule_id=rule_id,
        write=RuleWrite(content=content, scope=scope),
        vector=_embed(content),
        embedding_version_id=None,
        source_butler=scope,
        actor=ACTOR,
        now=now - timedelta(days=31),
        rules=settings.memory.rules,
    )
    for outcome, n in (("helpful", helpful), ("harmful", harmful)):
        for _ in range(n):
            writes.mark_rule(
                conn,
                tenant_id=seeded.tenant,
                rule_id=rule_id,
                outcome=outcome,
                reason="seeded",
                visibility=writes.ALL,
                actor=ACTOR,
                now=now,
                rules=settings.memory.rules,
            )
    seeded.rules[name] = rule_id
    return rule_id


def episodes(conn, seeded: Seeded, items: list[tuple[str, str, str]], *, now: datetime) -> None:  # noqa: ANN001
    """(name, butler, content) episodes, one minute apart (the first oldest), each with a real seq."""
    requests = [WriteRequest(kind="episode", butler=butler, payload={}, idempotency_key=None) for _, butler, _ in items]
    accepted = accept(conn, tenant_id=seeded.tenant, writes=requests, actor="seed", request_id=None)
    new = [
        NewEpisode(
            id=a.id,
            seq=a.seq,
            write=EpisodeWrite(content=content, butler=butler, importance=3 + i),
            request_id=None,
            accepted_at=now - timedelta(minutes=len(items) - i),
        )
        for i, (a, (_, butler, content)) in enumerate(zip(accepted, items, strict=True))
    ]
    writes.insert_episodes(
        conn,
        tenant_id=seeded.tenant,
        episodes=new,
        vectors=get_query_embedder().embed([e.write.content for e in new]),
        embedding_version_id=None,
        ttl_days=30,
        actor=ACTOR,
    )
    seeded.episodes.update({name: a.id for (name, _, _), a in zip(items, accepted, strict=True)})


def seed(engine: Engine, tenant: str, settings: Settings) -> Seeded:
    """Two butlers (health, finance): facts about the user in global and each scope, rules, episodes."""
    now = datetime.now(timezone.utc)
    s = Seeded(tenant=tenant)
    with unit_of_work(engine) as conn:
        episodes(
            conn,
            s,
            [
                ("dentist", "health", "User asked to move the dentist appointment to a morning slot"),
                ("budget", "finance", "User set a monthly grocery budget of 400 euros"),
                ("allergy", "health", "User mentioned a peanut allergy at dinner planning"),
            ],
            now=now,
        )
        fact(
            conn,
            s,
            "color_old",
            subject="user",
            predicate="favorite_color",
            content="The user's favorite color is blue",
            now=now - timedelta(days=3),
        )
        fact(
            conn,
            s,
            "color",
            subject="user",
            predicate="favorite_color",
            content="The user's favorite color is green",
            now=now - timedelta(days=1),
        )
        fact(
            conn,
            s,
            "allergy",
            subject="user",
            predicate="allergy",
            content="The user is allergic to peanuts",
            scope="health",
            permanence="permanent",
            now=now,
            source_episode=s.episodes["allergy"],
        )
        fact(
            conn,
            s,
            "dentist",
            subject="dentist",
            predicate="preferred_slot",
            content="Dentist appointments go in the morning",
            scope="health",
            now=now,
            source_episode=s.episodes["dentist"],
        )
        fact(
            conn,
            s,
            "budget",
            subject="user",
            predicate="grocery_budget",
            content="The monthly grocery budget is 400 euros",
            scope="finance",
            now=now,
            butler="finance",
            source_episode=s.episodes["budget"],
        )
        rule(
            conn,
            s,
            "proven",
            content="Confirm medication changes with the user before acting",
            scope="health",
            settings=settings,
            now=now,
            helpful=16,
        )
        rule(
            conn,
            s,
            "candidate",
            content="Suggest morning slots for appointments",
            scope="health",
            settings=settings,
            now=now,
        )
        rule(
            conn,
            s,
            "established",
            content="Send appointment reminders a day ahead",
            scope="global",
            settings=settings,
            now=now,
            helpful=6,
        )
        rule(
            conn,
            s,
            "anti",
            content="Book appointments without asking",
            scope="health",
            settings=settings,
            now=now,
            harmful=3,
        )
        rule(
            conn,
            s,
            "finance",
            content="Round budget figures to whole euros",
            scope="finance",
            settings=settings,
            now=now,
            helpful=1,
        )
    return s
