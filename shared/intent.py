"""Query intent routing (seed 001 §6.5): a rule-based classifier of what a read is looking for, and how that
weighs facts against rules and durable facts against passing ones. Pure: plain strings in, numbers out.

- identity: who the user is (name, age, home, job, family, health): facts first, permanent and stable ones most;
- preference: what the user likes or prefers: facts, stable and standard ones;
- procedure: how to do something, how to behave: rules first;
- event: what happened when: facts and episodes as they are, passing facts not discounted;
- general: no routing (every weight 1).

Accuracy on the labelled questions in tests/unit/test_intent.py is printed by that test and recorded in
BENCHMARKS.md; the weights are deliberately mild (a nudge among comparable matches, never a filter).
"""

from __future__ import annotations

import re
from typing import Literal

Intent = Literal["identity", "preference", "procedure", "event", "general"]

_SOURCES: tuple[tuple[Intent, str], ...] = (
    (
        "procedure",
        r"\bhow (do|should|can|would) (i|we|you)\b|\bhow to\b|\bsteps?\b|\bprocess\b|\bprocedure\b|"
        r"\bwhat should (i|you) do\b|\bbest way\b|\bremind me how\b|\binstructions?\b",
    ),
    (
        "event",
        r"\bwhen did\b|\blast time\b|\bwhat happened\b|\byesterday\b|\blast (week|month|year|night)\b|"
        r"\b\d+ (days?|weeks?|months?|years?) ago\b|\bhow long ago\b|\bdid (i|we) (go|visit|meet|see)\b",
    ),
    (
        "identity",
        r"\bwho am i\b|\bmy (name|age|birthday|address|job|occupation|wife|husband|partner|son|daughter|"
        r"kids?|children|family|allerg\w*|diagnos\w*|blood type|nationality|hometown)\b|"
        r"\bwhere (do|did) i (live|work|grow up|come from)\b|\bhow old am i\b|\bwhat do i do for (a )?work\b|"
        r"\bam i allergic\b|\bwhere am i from\b",
    ),
    (
        "preference",
        r"\b(do|would) i (like|love|enjoy|prefer|hate|dislike)\b|\bfavou?rite\b|\bprefer\w*\b|"
        r"\bwhat kind of\b|\bmy taste\b|\bwhat (do|would) i (like|enjoy)\b|\brecommend\w*\b|"
        r"\bsuggest\w*\b|\bwhich .* (should|would) i (pick|choose|like)\b",
    ),
)
_PATTERNS = tuple((intent, re.compile(pattern, re.IGNORECASE)) for intent, pattern in _SOURCES)

# Multipliers of the composite score: by type, and for facts by permanence.
_WEIGHTS: dict[Intent, dict[str, float]] = {
    "identity": {"fact": 1.15, "rule": 0.85, "permanent": 1.1, "stable": 1.05, "volatile": 0.9, "ephemeral": 0.85},
    "preference": {"fact": 1.1, "rule": 0.9, "stable": 1.05, "standard": 1.05, "ephemeral": 0.9},
    "procedure": {"fact": 0.9, "rule": 1.2},
    "event": {"volatile": 1.05, "ephemeral": 1.05},
    "general": {},
}


def classify(query: str) -> Intent:
    """The first intent whose pattern the query matches, in the order procedure, event, identity, preference
    (a "how do I" question about a favourite thing is a procedure); otherwise general."""
    for intent, pattern in _PATTERNS:
        if pattern.search(query):
            return intent
    return "general"


def weight(intent: Intent, *, kind: str, permanence: str | None) -> float:
    """The composite score's multiplier for a memory of ``kind`` (and ``permanence``) under ``intent``."""
    table = _WEIGHTS[intent]
    by_permanence = table.get(permanence, 1.0) if kind == "fact" and permanence else 1.0
    return table.get(kind, 1.0) * by_permanence
