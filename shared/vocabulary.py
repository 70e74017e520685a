"""The controlled predicate vocabulary of derived facts: what each predicate means and how it decays.

Consolidation stores facts as (subject, predicate, content); supersession fires on the same subject and predicate,
so it only works across phrasings when every extractor names the same attribute the same way. This is the list
(docs/consolidation.md shows it as a table). A *set* predicate (allergies, likes, plans) holds many values at
once: the stored predicate carries the value's head after the base name (``allergic_to_peanuts``), so a second
allergy is a second fact instead of replacing the first. :func:`base_predicate` maps a stored predicate back.

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Permanence = Literal["permanent", "stable", "standard", "volatile", "ephemeral"]


@dataclass(frozen=True)
class Predicate:
    name: str
    permanence: Permanence
    importance: float
    multi: bool
    meaning: str


PREDICATES: dict[str, Predicate] = {
    p.name: p
    for p in (
        Predicate("name", "permanent", 8, False, "the subject's name"),
        Predicate("birthday", "permanent", 7, False, "date of birth"),
        Predicate("hometown", "permanent", 5, False, "where the subject is originally from"),
        Predicate("nationality", "permanent", 5, False, "citizenship or nationality"),
        Predicate("age", "stable", 4, False, "age in years"),
        Predicate("allergic_to", "permanent", 9, True, "an allergy"),
        Predicate("medical_condition", "permanent", 8, True, "a diagnosed condition"),
        Predicate("diet", "stable", 7, True, "a dietary restriction or regime (vegetarian, lactose intolerant, keto)"),
        Predicate("lives_in", "stable", 6, False, "the city or place the subject lives now"),
        Predicate("works_at", "stable", 6, False, "employer or organisation"),
        Predicate("job", "stable", 6, False, "occupation or role"),
        Predicate("studies", "stable", 5, False, "what or where the subject studies"),
        Predicate(
            "relationship",
            "permanent",
            7,
            False,
            "how the subject relates to someone (family: permanent; friends and colleagues: stable)",
        ),
        Predicate("has_pet", "stable", 5, True, "a pet"),
        Predicate("speaks", "stable", 4, True, "a language the subject speaks"),
        Predicate("prefers", "stable", 5, True, "a lasting preference"),
        Predicate("favorite", "stable", 4, True, "a favourite thing of a kind (the kind follows: favorite_color)"),
        Predicate("likes", "standard", 4, True, "something the subject enjoys"),
        Predicate("dislikes", "standard", 4, True, "something the subject dislikes"),
        Predicate("reading", "standard", 4, False, "what the subject is reading now"),
        Predicate("learning", "standard", 4, False, "what the subject is learning now"),
        Predicate("working_on", "standard", 5, False, "the subject's current project"),
        Predicate("goal", "standard", 5, True, "a longer-term aim"),
        Predicate("plans", "volatile", 4, True, "a near-term plan"),
    )
}

# A new likes_x replaces a known dislikes_x and the other way round.
OPPOSITES = {"likes": "dislikes", "dislikes": "likes"}

_BY_LENGTH = sorted(PREDICATES, key=len, reverse=True)


def base_predicate(predicate: str) -> str:
    """``allergic_to_peanuts`` → ``allergic_to``; a predicate outside the vocabulary is returned normalised."""
    norm = re.sub(r"[\s-]+", "_", predicate.strip().lower())
    for name in _BY_LENGTH:
        if norm == name or norm.startswith(name + "_"):
            return name
    return norm


_SLUG_SKIP = frozenset(
    {"a", "an", "the", "my", "our", "his", "her", "their", "to", "of", "some", "very", "really", "is", "are"}
)
_SLUG_STOP = frozenset({"on", "in", "at", "for", "with", "from", "by", "during", "about", "over", "near", "after"})


def slug(text: str, words: int = 4) -> str:
    """'a window seat on long flights' → 'window_seat': the head of a value, for a set predicate."""
    kept: list[str] = []
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in _SLUG_STOP and kept:
            break
        if word not in _SLUG_SKIP and word not in _SLUG_STOP:
            kept.append(word)
    return "_".join(kept[:words])[:60]


def stored_predicate(base: str, value: str) -> str:
    """The predicate a fact is stored under: the base, plus the value's head for a set predicate."""
    spec = PREDICATES.get(base)
    head = slug(value)
    return f"{base}_{head}" if spec is not None and spec.multi and head else base
