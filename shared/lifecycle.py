"""The state machines of the contract as tables of allowed transitions, and the pure decisions that move them.

Three machines: episode consolidation status, fact validity, rule maturity. A transition not in a
table is refused with :class:`InvalidTransition` (fail closed). Staying in the same state is a
transition too, and is allowed only where a table lists it (``failed -> failed``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Literal

from shared.config import RuleSettings
from shared.errors import InvalidInput, InvalidTransition
from shared.scoring import effectiveness, elapsed_days

Machine = Literal["episode", "fact", "rule"]

# --- Episode consolidation -------------------------------------------------------------------
EPISODE_STATES: tuple[str, ...] = ("pending", "consolidated", "failed", "dead_letter")
EPISODE_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"consolidated", "failed", "dead_letter"}),
    "consolidated": frozenset(),
    # failed -> failed records another unsuccessful attempt while retries remain.
    "failed": frozenset({"consolidated", "failed", "dead_letter"}),
    # Only an operator's redrive leaves the dead letter, and it starts over as pending.
    "dead_letter": frozenset({"pending"}),
}
# A consolidation run ends each episode it touched in one of these.
EPISODE_RUN_OUTCOMES: frozenset[str] = frozenset({"consolidated", "failed", "dead_letter"})

# --- Fact validity ---------------------------------------------------------------------------
FACT_STATES: tuple[str, ...] = ("active", "fading", "superseded", "expired", "retracted")
FACT_TRANSITIONS: dict[str, frozenset[str]] = {
    "active": frozenset({"fading", "expired", "superseded", "retracted"}),
    # fading -> active is an explicit confirm resetting the decay clock.
    "fading": frozenset({"active", "expired", "superseded", "retracted"}),
    # A superseded fact is history: the successor carries the truth, so it never comes back. It can be forgotten
    # (wrong history must go too), and a restore puts it back in the history.
    "superseded": frozenset({"retracted"}),
    # An explicit confirm revives an expired fact; forgetting it is still possible.
    "expired": frozenset({"active", "retracted"}),
    # Forgetting is reversible per the contract (restore): to active, or to the history it was forgotten from.
    "retracted": frozenset({"active", "superseded"}),
}
# Earlier clients wrote "forgotten"; it means what "retracted" means now.
LEGACY_VALIDITY: Mapping[str, str] = MappingProxyType({"forgotten": "retracted"})

# --- Rule maturity ---------------------------------------------------------------------------
RULE_MATURITIES: tuple[str, ...] = ("candidate", "established", "proven", "anti_pattern")
RULE_TRANSITIONS: dict[str, frozenset[str]] = {
    # Promotion is one step at a time: candidate -> proven is not a transition.
    "candidate": frozenset({"established", "anti_pattern"}),
    "established": frozenset({"proven", "candidate", "anti_pattern"}),
    "proven": frozenset({"established", "candidate", "anti_pattern"}),
    # An anti-pattern's text has been inverted into a warning; it cannot become advice again.
    "anti_pattern": frozenset(),
}

MACHINES: Mapping[str, Mapping[str, frozenset[str]]] = MappingProxyType(
    {"episode": EPISODE_TRANSITIONS, "fact": FACT_TRANSITIONS, "rule": RULE_TRANSITIONS}
)

ANTI_PATTERN_PREFIX = "ANTI-PATTERN:"
DEFAULT_HARM_REASON = "it was marked harmful repeatedly"


def normalise_validity(value: str) -> str:
    """A fact validity in today's words (``forgotten`` -> ``retracted``); unknown values are refused."""
    normalised = LEGACY_VALIDITY.get(value, value)
    if normalised not in FACT_TRANSITIONS:
        raise InvalidInput(f"unknown validity {value!r}; expected one of {', '.join(FACT_STATES)}", field="validity")
    return normalised


def _table(machine: str) -> Mapping[str, frozenset[str]]:
    try:
        return MACHINES[machine]
    except KeyError:
        raise InvalidInput(
            f"unknown state machine {machine!r}; expected one of {', '.join(MACHINES)}", field="machine"
        ) from None


def is_allowed(machine: str, from_state: str, to_state: str) -> bool:
    """Whether ``from_state -> to_state`` is in the machine's table (fact states accept legacy names)."""
    table = _table(machine)
    if machine == "fact":
        from_state = LEGACY_VALIDITY.get(from_state, from_state)
        to_state = LEGACY_VALIDITY.get(to_state, to_state)
    return to_state in table.get(from_state, frozenset())


def check_transition(machine: str, from_state: str, to_state: str) -> None:
    """Return if the transition is in the table, else raise InvalidTransition naming machine, from and to."""
    if is_allowed(machine, from_state, to_state):
        return
    table = _table(machine)
    known = set(table)
    if machine == "fact":
        known |= set(LEGACY_VALIDITY)
    unknown = [state for state in (from_state, to_state) if state not in known]
    detail = f" (unknown state {', '.join(repr(s) for s in unknown)})" if unknown else ""
    raise InvalidTransition(f"{machine} transition {from_state!r} -> {to_state!r} is not allowed{detail}")


def consolidation_outcome(*, attempts: int, max_attempts: int) -> Literal["failed", "dead_letter"]:
    """Where an episode goes after a failed attempt (``attempts`` counts this one): dead_letter once spent."""
    if attempts < 1:
        raise InvalidInput("attempts counts the failed attempt, so it is >= 1", field="attempts")
    if max_attempts < 1:
        raise InvalidInput("max_attempts must be >= 1", field="max_attempts")
    return "dead_letter" if attempts >= max_attempts else "failed"


@dataclass(frozen=True)
class Evidence:
    """What a rule's applications say: plain counts, and effectiveness with each application weighted by age."""

    helpful: int
    harmful: int
    effectiveness: float


def rule_evidence(applications: Sequence[tuple[str, datetime]], *, now: datetime, half_life_days: float) -> Evidence:
    """Evidence from (outcome, occurred_at) pairs: ``w = 0.5 ** (age_days / half_life)``, and the seed's
    effectiveness formula over the weighted helpful and harmful sums."""
    weight = {"helpful": 0.0, "harmful": 0.0}
    count = {"helpful": 0, "harmful": 0}
    for outcome, at in applications:
        if outcome in weight:
            weight[outcome] += 0.5 ** (elapsed_days(since=at, now=now) / half_life_days)
            count[outcome] += 1
    return Evidence(
        count["helpful"],
        count["harmful"],
        effectiveness(success_count=weight["helpful"], harmful_count=weight["harmful"]),
    )


def next_maturity(
    *,
    maturity: str,
    success_count: int,
    harmful_count: int,
    created_at: datetime,
    now: datetime,
    rules: RuleSettings,
    recent_effectiveness: float | None = None,
) -> str:
    """The maturity the evidence supports: the same state or one legal transition from ``maturity``.

    Order of judgement: anti-pattern first (repeated harm with low effectiveness), then demotion
    (effectiveness fell below the current level's minimum), then promotion by one level. The caller
    runs this after every feedback mark, so a rule climbs one level per mark at most. With no
    feedback at all there is no evidence, and the maturity stays. ``recent_effectiveness`` (from
    :func:`rule_evidence`) replaces the counters' effectiveness where the applications are known.
    """
    if maturity not in RULE_TRANSITIONS:
        raise InvalidInput(f"unknown rule maturity {maturity!r}", field="maturity")
    if maturity == "anti_pattern":
        return maturity
    eff = (
        effectiveness(success_count=success_count, harmful_count=harmful_count)
        if recent_effectiveness is None
        else recent_effectiveness
    )
    harm = rules.harmful_to_antipattern
    if harmful_count >= harm.min_harmful and eff < harm.max_effectiveness:
        return "anti_pattern"
    if success_count == 0 and harmful_count == 0:
        return maturity
    to_established = rules.promote_to_established
    to_proven = rules.promote_to_proven
    # Demotion compares effectiveness only: counts and age never shrink, so they cannot undo a level.
    if maturity == "proven" and eff < to_proven.min_effectiveness:
        return "established" if eff >= to_established.min_effectiveness else "candidate"
    if maturity == "established" and eff < to_established.min_effectiveness:
        return "candidate"
    if (
        maturity == "candidate"
        and success_count >= to_established.min_successes
        and eff >= to_established.min_effectiveness
    ):
        return "established"
    if (
        maturity == "established"
        and success_count >= to_proven.min_successes
        and eff >= to_proven.min_effectiveness
        and elapsed_days(since=created_at, now=now) >= to_proven.min_age_days
    ):
        return "proven"
    return maturity


def _lower_first(text: str) -> str:
    # "Use X" reads as "do NOT use X"; "API keys ..." keeps its acronym.
    if len(text) >= 2 and text[1].islower():
        return text[0].lower() + text[1:]
    return text


# A rule's text is at most RULE_MAX_CHARS (the column's CHECK). An anti-pattern keeps the newest harmful reasons
# that fit in ANTI_PATTERN_REASONS_CHARS (each cut to that length) and at most ANTI_PATTERN_BODY_CHARS of the rule,
# so the warning always fits, however many reasons piled up (one over-long rule must not fail a sweep batch).
RULE_MAX_CHARS = 20_000
ANTI_PATTERN_REASONS_CHARS = 2_000
ANTI_PATTERN_BODY_CHARS = RULE_MAX_CHARS - ANTI_PATTERN_REASONS_CHARS - 200  # room for the fixed words


def anti_pattern_content(rule: str, reasons: Sequence[str] = ()) -> str:
    """The warning text that replaces a harmful rule (at most RULE_MAX_CHARS); text that is already a warning is
    returned as is. ``reasons`` oldest first; the newest that fit are kept, in that order."""
    text = rule.strip()
    if text.upper().startswith(ANTI_PATTERN_PREFIX):
        return text[:RULE_MAX_CHARS]
    text = text.rstrip(".").rstrip()
    if not text:
        raise InvalidInput("rule text must not be empty", field="rule")
    text = _lower_first(text)[:ANTI_PATTERN_BODY_CHARS]
    because = "; ".join(_newest_that_fit(reasons)) or DEFAULT_HARM_REASON
    return f"{ANTI_PATTERN_PREFIX} Do NOT {text}. This caused problems because: {because}"


def _newest_that_fit(reasons: Sequence[str]) -> list[str]:
    """The newest trimmed, non-empty reasons whose total (each + 2 for "; ") is within the budget, oldest first."""
    kept: list[str] = []
    used = 0
    for reason in reversed([r.strip()[:ANTI_PATTERN_REASONS_CHARS] for r in reasons if r.strip()]):
        used += len(reason) + 2
        if used > ANTI_PATTERN_REASONS_CHARS + 2:
            break
        kept.append(reason)
    return kept[::-1]
