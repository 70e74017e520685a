"""A labeled retrieval set, generated (no downloads): memories across tenants with overlapping topics, and
questions of three classes, each with exactly one relevant memory in its tenant.

- paraphrase: the question shares (almost) no words with the memory; only meaning links them.
- keyword: the question is a rare token of the memory (a code, a name) with little meaning around it.
- mixed: a rare token plus a paraphrased intent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# (subject, predicate, memory content, paraphrased question): the question avoids the memory's words.
PARAPHRASES = [
    ("user", "dietary_restriction", "Cannot digest milk products", "is the person lactose intolerant?"),
    ("user", "allergy", "Gets hives after eating peanuts", "which nut allergy should the chef know about?"),
    ("user", "home_city", "Lives in a flat in Lisbon near the river", "where is their apartment located?"),
    ("user", "employer", "Works as an engineer at a railway company", "what does the person do for a living?"),
    ("user", "exercise", "Goes jogging every morning before work", "what is their running routine?"),
    ("user", "sleep", "Usually falls asleep around midnight", "when does the person go to bed?"),
    ("user", "music", "Listens to jazz while cooking dinner", "what kind of songs do they enjoy in the kitchen?"),
    ("user", "pet", "Has a tabby cat that sleeps on the keyboard", "does the person own a feline?"),
    ("user", "vehicle", "Drives an old electric hatchback", "what car does the user have?"),
    ("user", "language", "Is learning Japanese with evening classes", "which foreign tongue are they studying?"),
    ("user", "coffee", "Drinks two espressos before noon", "how do they take their caffeine?"),
    ("user", "travel", "Is afraid of flying and prefers trains", "do they like airplanes?"),
    ("user", "reading", "Currently reading a long fantasy novel about dunes", "what book is on their nightstand?"),
    ("user", "family", "Has two younger sisters who live abroad", "how many siblings does the person have?"),
    ("user", "medication", "Takes a blood pressure pill every evening", "what medicine is the user on?"),
    ("user", "appointments", "Prefers meetings before lunch", "what time of day suits them for a call?"),
    ("user", "birthday", "Was born on the ninth of March", "when should we send birthday wishes?"),
    ("user", "hobby", "Paints watercolour landscapes at weekends", "what artistic pastime do they have?"),
    ("user", "diet", "Avoids meat and fish entirely", "is the person vegetarian?"),
    ("user", "budget", "Saves a fifth of each salary", "how much money do they put aside?"),
    ("user", "commute", "Cycles to the office when it is dry", "how do they get to work?"),
    ("user", "weather", "Hates cold and rainy winters", "what climate does the user dislike?"),
    ("user", "garden", "Grows tomatoes on the balcony", "do they have any vegetable plants?"),
    ("user", "phone", "Never answers calls from unknown numbers", "will they pick up if a stranger rings?"),
    ("user", "email", "Reads messages only twice a day", "how often do they check their inbox?"),
    ("user", "shopping", "Buys groceries online on Sundays", "when are the weekly food orders placed?"),
    ("user", "health", "Recovering from a knee surgery", "is there any injury we should consider?"),
    ("user", "movies", "Loves old black and white films", "what cinema do they like?"),
    ("user", "sports_team", "Supports the local football club", "which soccer side do they cheer for?"),
    ("user", "tea", "Dislikes herbal infusions", "would they enjoy a chamomile brew?"),
]

NAMES = [
    "Marisol",
    "Thaddeus",
    "Ingrid",
    "Oluwaseun",
    "Perpetua",
    "Casimir",
    "Wilhelmina",
    "Bartholomew",
    "Xiomara",
    "Leopold",
    "Genoveva",
    "Ignatius",
    "Rosalind",
    "Zebedee",
    "Anastasia",
    "Florian",
]
RELATIONS = ["dentist", "landlord", "accountant", "piano teacher", "neighbour", "mechanic", "vet", "tutor"]
CITIES = ["Oslo", "Porto", "Quito", "Hanoi", "Dakar", "Lima", "Perth", "Riga"]
ROLE_QUESTIONS = {
    "dentist": "who looks after their teeth?",
    "landlord": "who owns the place they rent?",
    "accountant": "who handles their taxes?",
    "piano teacher": "who gives them music lessons?",
    "neighbour": "who lives next door?",
    "mechanic": "who repairs their car?",
    "vet": "who treats their animals?",
    "tutor": "who helps them study?",
}
PRODUCTS = ["router", "blender", "laptop", "e-bike", "heat pump", "camera", "printer", "smartwatch"]
INTENTS = {
    "router": "internet box",
    "blender": "kitchen mixer",
    "laptop": "computer",
    "e-bike": "bicycle",
    "heat pump": "heating system",
    "camera": "photo device",
    "printer": "paper output machine",
    "smartwatch": "wrist gadget",
}

# Distractors share the topics and the common words, so every tenant has near-misses.
DISTRACTORS = [
    "Asked about the weather forecast for the weekend",
    "Wanted a reminder to water the plants",
    "Mentioned that the office moved to a new floor",
    "Discussed a plan to repaint the kitchen",
    "Had a call with a friend about holiday plans",
    "Ordered a new pair of running shoes",
    "Asked for a summary of the news",
    "Booked a table at a restaurant for Friday",
    "Talked about a documentary on ocean life",
    "Requested a recipe for lentil soup",
]


@dataclass(frozen=True)
class Memory:
    key: str
    tenant: str
    subject: str
    predicate: str
    content: str


@dataclass(frozen=True)
class Question:
    tenant: str
    text: str
    kind: str  # paraphrase | keyword | mixed
    relevant: str  # Memory.key


def _code(rng: random.Random) -> str:
    return f"{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}-{rng.randint(1000, 9999)}"


def generate(*, tenants: int = 6, seed: int = 7) -> tuple[list[Memory], list[Question]]:
    """Deterministic for a seed: ``tenants`` × (paraphrase facts + keyword facts + distractors)."""
    rng = random.Random(seed)
    memories: list[Memory] = []
    questions: list[Question] = []
    for t in range(tenants):
        tenant = f"bench-{t:02d}"
        for i, (subject, predicate, content, question) in enumerate(rng.sample(PARAPHRASES, 20)):
            key = f"{tenant}/p{i}"
            memories.append(Memory(key, tenant, subject, predicate, content))
            questions.append(Question(tenant, question, "paraphrase", key))
        for i, (name, relation, city) in enumerate(
            zip(rng.sample(NAMES, 8), rng.sample(RELATIONS, 8), rng.sample(CITIES, 8))
        ):
            # two memories share the rare name: the name finds both, only the meaning picks the right one
            key = f"{tenant}/n{i}"
            memories.append(
                Memory(key, tenant, name.lower(), "relation", f"{name} is the user's {relation} and calls on Tuesdays")
            )
            memories.append(
                Memory(
                    f"{tenant}/m{i}",
                    tenant,
                    name.lower(),
                    "postcard",
                    f"{name} sent a postcard from {city} last summer",
                )
            )
            questions.append(Question(tenant, f"{name}: {ROLE_QUESTIONS[relation]}", "mixed", key))
        for i, product in enumerate(rng.sample(PRODUCTS, 6)):
            key = f"{tenant}/c{i}"
            code = _code(rng)
            memories.append(
                Memory(key, tenant, "user", f"device_{i}", f"Registered the {product} with warranty number {code}")
            )
            questions.append(Question(tenant, code, "keyword", key))
            questions.append(Question(tenant, f"{code} which {INTENTS[product]} is covered?", "mixed", key))
        for i, text in enumerate(DISTRACTORS):
            memories.append(Memory(f"{tenant}/d{i}", tenant, "user", f"episode_note_{i}", text))
    return memories, questions
