"""What a load test writes: tenants with a unique marker each, butlers, and realistic, varied episode text.

Every episode embeds its tenant's marker (``lt<run>t<NN>``, one keyword token) and its client's send position,
so the database can be checked afterwards: the marker says which tenant's generator wrote a row (a row of
tenant A carrying B's marker is a cross-tenant leak), and the position makes every text unique (two rows with
one text are a duplicate). The text is deterministic for a seed; about a third of it is phrased the way the
heuristic extractor turns into facts and rules, so consolidation has real work to do.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass

BUTLER_NAMES = ("health", "travel", "finance", "home", "work", "family", "garden", "learning")

PEOPLE = ("Anna", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Keiko", "Liam")
CITIES = ("Lisbon", "Berlin", "Osaka", "Toronto", "Lyon", "Porto", "Oslo", "Austin", "Kyoto", "Dublin", "Quito")
TOPICS = {
    "health": (
        "the dentist appointment",
        "a morning run",
        "blood pressure readings",
        "the new vitamin routine",
        "sleep quality",
        "knee physiotherapy",
        "the allergy medication",
        "a yoga class",
    ),
    "travel": (
        "the flight to {city}",
        "a hotel near the station in {city}",
        "the train pass",
        "a rental car",
        "the visa paperwork",
        "a weekend in {city}",
        "the museum tickets",
        "travel insurance",
    ),
    "finance": (
        "the monthly budget",
        "the electricity bill",
        "a savings goal",
        "the tax return",
        "the mortgage rate",
        "a refund from the airline",
        "quarterly invoices",
        "the pension plan",
    ),
    "home": (
        "the leaking kitchen tap",
        "a new sofa",
        "the heating schedule",
        "recycling day",
        "the window cleaner",
        "paint for the hallway",
        "the smoke alarm battery",
        "a shelf in the study",
    ),
    "work": (
        "the quarterly review",
        "a slide deck for {person}",
        "the release checklist",
        "a hiring interview",
        "the team offsite",
        "the on-call rota",
        "a contract renewal",
        "the roadmap meeting",
    ),
    "family": (
        "{person}'s birthday dinner",
        "the school play",
        "a visit to grandma",
        "the summer camp form",
        "piano lessons",
        "the family photo album",
        "a babysitter for Friday",
        "the dog's vet visit",
    ),
}
OPENERS = (
    "User asked about {topic}",
    "We went over {topic}",
    "User wanted a reminder about {topic}",
    "Talked through {topic} with the user",
    "User mentioned {topic} again",
    "Reviewed {topic} together",
    "User was unsure about {topic}",
    "Followed up on {topic}",
)
DETAILS = (
    "It should happen before {day}.",
    "The user seemed relieved afterwards.",
    "{person} will help with it.",
    "Nothing was decided yet.",
    "The user wants a summary by {day}.",
    "It took about {n} minutes.",
    "The user asked to keep it short next time.",
    "A second option costs about {n} euros.",
)
# Phrased like the heuristic extractor's sentence shapes (facts and rules), so consolidation extracts something.
EXTRACTABLE = (
    "I live in {city}.",
    "My name is {person}.",
    "I am allergic to {food}.",
    "I really like {food}.",
    "My sister is {person}.",
    "I work at {company}.",
    "I am planning to visit {city} next month.",
    "Always confirm the {thing} before paying.",
    "Never book {thing} without asking first.",
    "User said to always reply in short bullet points.",
    "I had {food} for lunch.",
    "My favorite city is {city}.",
)
FOODS = ("peanuts", "shellfish", "sushi", "lentil soup", "dark chocolate", "ramen", "kiwi", "oat milk")
COMPANIES = ("Acme Labs", "Northwind", "Globex", "Initech", "Umbrella Studio", "Vandelay Imports")
THINGS = ("hotel", "flight", "restaurant", "taxi", "repair", "delivery")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "the weekend", "the end of the month")


@dataclass(frozen=True)
class TenantPlan:
    """One tenant of the run: its id, its marker (found only in its own episodes), its butlers."""

    index: int
    tenant_id: str
    marker: str
    butlers: tuple[str, ...]


@dataclass(frozen=True)
class Episode:
    """One write of the burst: ``position`` is its place in its client's send order."""

    tenant_id: str
    butler: str
    client: int
    position: int
    content: str
    idempotency_key: str


def new_run_id() -> str:
    """Eight hex characters: short enough for tenant names, random enough not to collide between runs."""
    return secrets.token_hex(4)


def tenant_marker(run_id: str, index: int) -> str:
    """One keyword token (letters and digits) that only this tenant's generator writes."""
    return f"lt{run_id}t{index:02d}"


def butler_names(count: int) -> tuple[str, ...]:
    if count <= len(BUTLER_NAMES):
        return BUTLER_NAMES[:count]
    return BUTLER_NAMES + tuple(f"butler{i:02d}" for i in range(len(BUTLER_NAMES), count))


def plan_tenants(run_id: str, *, count: int, butlers: int, tenant_ids: list[str] | None = None) -> list[TenantPlan]:
    """The run's tenants: ``lt-<run>-NN`` unless the caller names existing ones (remote deployments)."""
    names = tenant_ids or [f"lt-{run_id}-{i:02d}" for i in range(count)]
    return [TenantPlan(i, name, tenant_marker(run_id, i), butler_names(butlers)) for i, name in enumerate(names)]


def client_tenant(client: int, tenants: list[TenantPlan]) -> TenantPlan:
    """Clients are dealt to tenants round-robin: every tenant gets traffic from the first clients on."""
    return tenants[client % len(tenants)]


def client_episodes(run_id: str, *, client: int, count: int, tenant: TenantPlan, seed: int) -> list[Episode]:
    """The ``count`` episodes client ``client`` sends, in order, cycling over its tenant's butlers."""
    rng = random.Random(f"{seed}:{client}")
    out = []
    for position in range(count):
        butler = tenant.butlers[(position + client) % len(tenant.butlers)]
        text = episode_text(rng, butler)
        content = f"{text} (ref {tenant.marker} c{client:03d}-{position:05d})"
        out.append(
            Episode(tenant.tenant_id, butler, client, position, content, f"lt-{run_id}-c{client:03d}-{position:05d}")
        )
    return out


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` items over ``parts`` shares that differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def episode_text(rng: random.Random, butler: str) -> str:
    """One to three sentences about something a butler of this kind would hear in a session."""
    topics = TOPICS.get(butler) or TOPICS[rng.choice(sorted(TOPICS))]
    fill = {
        "city": rng.choice(CITIES),
        "person": rng.choice(PEOPLE),
        "food": rng.choice(FOODS),
        "company": rng.choice(COMPANIES),
        "thing": rng.choice(THINGS),
        "day": rng.choice(DAYS),
        "n": rng.randint(5, 180),
    }
    topic = rng.choice(topics).format(**fill)
    parts = [rng.choice(OPENERS).format(topic=topic) + "."]
    if rng.random() < 0.6:
        parts.append(rng.choice(DETAILS).format(**fill))
    if rng.random() < 0.35:
        parts.append(rng.choice(EXTRACTABLE).format(**fill))
    return " ".join(parts)
