"""Unit tests of shared.lifecycle: every allowed and forbidden transition, and the maturity decision."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import HarmfulToAntiPattern, PromoteToEstablished, PromoteToProven, RuleSettings
from shared.errors import InvalidInput, InvalidTransition
from shared.lifecycle import (
    rule_evidence,
    EPISODE_RUN_OUTCOMES,
    EPISODE_STATES,
    EPISODE_TRANSITIONS,
    FACT_STATES,
    FACT_TRANSITIONS,
    RULE_MATURITIES,
    RULE_TRANSITIONS,
    anti_pattern_content,
    check_transition,
    consolidation_outcome,
    is_allowed,
    next_maturity,
    normalise_validity,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RULES = RuleSettings()
props = settings(deadline=None, max_examples=300)

# The contract's transitions, written out independently of the module's tables.
EXPECTED = {
    "episode": (
        EPISODE_STATES,
        {
            ("pending", "consolidated"),
            ("pending", "failed"),
            ("pending", "dead_letter"),
            ("failed", "consolidated"),
            ("failed", "failed"),
            ("failed", "dead_letter"),
            ("dead_letter", "pending"),
        },
    ),
    "fact": (
        FACT_STATES,
        {
            ("active", "fading"),
            ("active", "expired"),
            ("active", "superseded"),
            ("active", "retracted"),
            ("fading", "active"),
            ("fading", "expired"),
            ("fading", "superseded"),
            ("fading", "retracted"),
            ("expired", "active"),
            ("expired", "retracted"),
            ("retracted", "active"),
            # issue 16: superseded history can be forgotten, and a restore puts it back in the history
            ("superseded", "retracted"),
            ("retracted", "superseded"),
        },
    ),
    "rule": (
        RULE_MATURITIES,
        {
            ("candidate", "established"),
            ("established", "proven"),
            ("established", "candidate"),
            ("proven", "established"),
            ("proven", "candidate"),
            ("candidate", "anti_pattern"),
            ("established", "anti_pattern"),
            ("proven", "anti_pattern"),
        },
    ),
}
ALL_PAIRS = [
    (machine, src, dst, (src, dst) in allowed)
    for machine, (states, allowed) in EXPECTED.items()
    for src, dst in itertools.product(states, states)
]


# --- transition tables -----------------------------------------------------------------------


def test_state_tuples_and_tables_cover_the_same_states() -> None:
    # given each machine's states and table
    # then every state has a row and every target is a known state
    for states, table in (
        (EPISODE_STATES, EPISODE_TRANSITIONS),
        (FACT_STATES, FACT_TRANSITIONS),
        (RULE_MATURITIES, RULE_TRANSITIONS),
    ):
        assert set(table) == set(states)
        assert all(targets <= set(states) for targets in table.values())
    assert EPISODE_STATES == ("pending", "consolidated", "failed", "dead_letter")
    assert FACT_STATES == ("active", "fading", "superseded", "expired", "retracted")
    assert RULE_MATURITIES == ("candidate", "established", "proven", "anti_pattern")


@pytest.mark.parametrize(("machine", "src", "dst", "allowed"), ALL_PAIRS)
def test_every_pair_of_states_is_allowed_exactly_when_the_contract_lists_it(
    machine: str, src: str, dst: str, allowed: bool
) -> None:
    # given any pair of states of a machine
    # when the transition is checked
    # then it passes if the contract lists it and raises InvalidTransition naming machine, from, to otherwise
    assert is_allowed(machine, src, dst) is allowed
    if allowed:
        check_transition(machine, src, dst)
    else:
        with pytest.raises(InvalidTransition) as raised:
            check_transition(machine, src, dst)
        assert machine in raised.value.message
        assert repr(src) in raised.value.message and repr(dst) in raised.value.message
        assert raised.value.code == "invalid_transition"


def test_terminal_states_have_no_way_out() -> None:
    assert EPISODE_TRANSITIONS["consolidated"] == frozenset()
    assert FACT_TRANSITIONS["superseded"] == frozenset({"retracted"})  # never back to active
    assert RULE_TRANSITIONS["anti_pattern"] == frozenset()


def test_episode_run_outcomes() -> None:
    assert EPISODE_RUN_OUTCOMES == {"consolidated", "failed", "dead_letter"}
    assert all(outcome in EPISODE_TRANSITIONS["pending"] for outcome in EPISODE_RUN_OUTCOMES)


def test_unknown_state_is_an_invalid_transition() -> None:
    with pytest.raises(InvalidTransition) as raised:
        check_transition("episode", "pending", "archived")
    assert "unknown state 'archived'" in raised.value.message


def test_unknown_machine_is_invalid_input() -> None:
    with pytest.raises(InvalidInput) as raised:
        check_transition("tool", "a", "b")
    assert raised.value.field == "machine"


# --- fact validity names ---------------------------------------------------------------------


def test_legacy_forgotten_normalises_to_retracted() -> None:
    # given the legacy validity value
    # then it reads as retracted, both alone and inside a transition check
    assert normalise_validity("forgotten") == "retracted"
    assert normalise_validity("active") == "active"
    check_transition("fact", "active", "forgotten")
    check_transition("fact", "forgotten", "active")
    check_transition("fact", "superseded", "forgotten")
    with pytest.raises(InvalidTransition):
        check_transition("fact", "superseded", "active")


def test_normalise_validity_refuses_unknown_values() -> None:
    with pytest.raises(InvalidInput) as raised:
        normalise_validity("deleted")
    assert raised.value.field == "validity"


# --- consolidation outcome -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "outcome"),
    [(1, 5, "failed"), (4, 5, "failed"), (5, 5, "dead_letter"), (6, 5, "dead_letter"), (1, 1, "dead_letter")],
)
def test_consolidation_outcome_dead_letters_when_attempts_are_spent(
    attempts: int, max_attempts: int, outcome: str
) -> None:
    assert consolidation_outcome(attempts=attempts, max_attempts=max_attempts) == outcome


def test_consolidation_outcome_refuses_impossible_counts() -> None:
    with pytest.raises(InvalidInput):
        consolidation_outcome(attempts=0, max_attempts=5)
    with pytest.raises(InvalidInput):
        consolidation_outcome(attempts=1, max_attempts=0)


@given(attempts=st.integers(1, 50), max_attempts=st.integers(1, 50))
def test_consolidation_outcome_is_legal_from_pending_and_failed(attempts: int, max_attempts: int) -> None:
    outcome = consolidation_outcome(attempts=attempts, max_attempts=max_attempts)
    check_transition("episode", "pending", outcome)
    check_transition("episode", "failed", outcome)


# --- rule maturity ---------------------------------------------------------------------------


def _next(maturity: str, success: int, harmful: int, age_days: float = 0.0, rules: RuleSettings = RULES) -> str:
    created = T0 - timedelta(days=age_days)
    return next_maturity(
        maturity=maturity, success_count=success, harmful_count=harmful, created_at=created, now=T0, rules=rules
    )


def test_seed_example_stays_candidate() -> None:
    # given 10 successes and 2 harmful marks (effectiveness ~0.555 < 0.6)
    # then the rule stays a candidate
    assert _next("candidate", 10, 2) == "candidate"


def test_candidate_promotes_to_established_at_the_thresholds() -> None:
    # given exactly 5 successes and no harm (effectiveness ~0.998)
    assert _next("candidate", 5, 0) == "established"
    # but 4 successes is not enough
    assert _next("candidate", 4, 0) == "candidate"


def test_promotion_is_one_step_per_call() -> None:
    # given a candidate with evidence good enough for proven
    # then one call makes it established, the next proven
    assert _next("candidate", 20, 0, age_days=60) == "established"
    assert _next("established", 20, 0, age_days=60) == "proven"


def test_proven_needs_successes_effectiveness_and_age() -> None:
    assert _next("established", 15, 0, age_days=30) == "proven"
    assert _next("established", 14, 0, age_days=30) == "established"
    assert _next("established", 15, 0, age_days=29.9) == "established"
    # 15 successes, 1 harmful: 15/19.01 ~ 0.789 < 0.8
    assert _next("established", 15, 1, age_days=90) == "established"


def test_repeated_harm_with_low_effectiveness_makes_an_anti_pattern() -> None:
    # given 3 harmful marks and 1 success (effectiveness ~0.077 < 0.3)
    for maturity in ("candidate", "established", "proven"):
        assert _next(maturity, 1, 3) == "anti_pattern"
    # but 2 harmful marks are not enough, however bad the ratio
    assert _next("candidate", 0, 2) == "candidate"
    # and 3 harmful marks with effectiveness >= 0.3 are not either (6/18.01 ~ 0.333)
    assert _next("candidate", 6, 3) == "candidate"


def test_demotion_follows_effectiveness() -> None:
    # proven with effectiveness 0.7 (between 0.6 and 0.8): back to established
    # (28 successes, 3 harmful: 28/40.01 ~ 0.70)
    assert _next("proven", 28, 3, age_days=90) == "established"
    # proven with effectiveness ~0.5: straight to candidate
    assert _next("proven", 8, 2, age_days=90) == "candidate"
    # established below 0.6: candidate
    assert _next("established", 10, 2) == "candidate"


def test_no_feedback_keeps_maturity() -> None:
    for maturity in RULE_MATURITIES:
        assert _next(maturity, 0, 0) == maturity


def test_anti_pattern_is_final() -> None:
    assert _next("anti_pattern", 1000, 0, age_days=1000) == "anti_pattern"


def test_next_maturity_refuses_unknown_maturity() -> None:
    with pytest.raises(InvalidInput) as raised:
        _next("legendary", 1, 0)
    assert raised.value.field == "maturity"


@st.composite
def rule_settings(draw: st.DrawFn) -> RuleSettings:
    return RuleSettings(
        promote_to_established=PromoteToEstablished(
            min_successes=draw(st.integers(0, 30)), min_effectiveness=draw(st.floats(0, 1))
        ),
        promote_to_proven=PromoteToProven(
            min_successes=draw(st.integers(0, 60)),
            min_effectiveness=draw(st.floats(0, 1)),
            min_age_days=draw(st.floats(0, 365)),
        ),
        harmful_to_antipattern=HarmfulToAntiPattern(
            min_harmful=draw(st.integers(1, 10)), max_effectiveness=draw(st.floats(0, 1))
        ),
    )


@props
@given(
    maturity=st.sampled_from(RULE_MATURITIES),
    success=st.integers(0, 200),
    harmful=st.integers(0, 50),
    age=st.floats(0, 1000),
    rules=st.one_of(st.just(RULES), rule_settings()),
)
def test_next_maturity_is_always_a_legal_transition_and_settles(
    maturity: str, success: int, harmful: int, age: float, rules: RuleSettings
) -> None:
    # given any maturity, feedback, age and thresholds
    # when next_maturity is applied repeatedly with the same evidence
    seen = [maturity]
    for _ in range(4):
        seen.append(_next(seen[-1], success, harmful, age_days=age, rules=rules))
    # then every step is the same state or a legal transition
    for src, dst in itertools.pairwise(seen):
        assert dst == src or dst in RULE_TRANSITIONS[src]
    # and the decision settles within three calls (no oscillation on fixed evidence)
    assert seen[3] == seen[4]


# --- anti-pattern text -----------------------------------------------------------------------


def test_anti_pattern_content_inverts_the_rule() -> None:
    text = anti_pattern_content("Use rebase on shared branches.", ["lost commits", "force pushes"])
    assert text == (
        "ANTI-PATTERN: Do NOT use rebase on shared branches. This caused problems because: lost commits; force pushes"
    )


def test_anti_pattern_content_keeps_acronyms_and_defaults_the_reason() -> None:
    text = anti_pattern_content("API keys in env files", [])
    assert text == (
        "ANTI-PATTERN: Do NOT API keys in env files. This caused problems because: it was marked harmful repeatedly"
    )


def test_anti_pattern_content_ignores_blank_reasons() -> None:
    text = anti_pattern_content("Retry forever", ["  ", "queue flooded "])
    assert text.endswith("because: queue flooded")


def test_anti_pattern_content_refuses_empty_rule() -> None:
    with pytest.raises(InvalidInput) as raised:
        anti_pattern_content(" . ", [])
    assert raised.value.field == "rule"


@given(
    rule=st.text(min_size=1, max_size=80).filter(
        lambda s: s.strip().rstrip(".").strip() and not s.strip().upper().startswith("ANTI-PATTERN:")
    ),
    reasons=st.lists(st.text(max_size=30), max_size=3),
    more=st.lists(st.text(max_size=30), max_size=3),
)
def test_anti_pattern_content_never_double_wraps(rule: str, reasons: list[str], more: list[str]) -> None:
    # given a rule already turned into a warning
    once = anti_pattern_content(rule, reasons)
    # then wrapping it again changes nothing
    assert once.startswith("ANTI-PATTERN: Do NOT ")
    assert anti_pattern_content(once, more) == once


def test_rule_evidence_weighs_each_application_by_its_age() -> None:
    # a success today weighs 1, one a half-life ago 0.5; harm weighs 4x (the seed's formula)
    fresh = rule_evidence([("helpful", T0), ("helpful", T0 - timedelta(days=90))], now=T0, half_life_days=90)
    assert (fresh.helpful, fresh.harmful) == (2, 0)
    assert fresh.effectiveness == pytest.approx(1.5 / 1.51)
    mixed = rule_evidence(
        [("helpful", T0 - timedelta(days=180)), ("harmful", T0), ("ignored", T0)], now=T0, half_life_days=90
    )
    assert (mixed.helpful, mixed.harmful) == (1, 1)
    assert mixed.effectiveness == pytest.approx(0.25 / (0.25 + 4 + 0.01))
    assert rule_evidence([], now=T0, half_life_days=90).effectiveness == 0.0


def test_recent_effectiveness_replaces_the_counters_judgement() -> None:
    # 15 successes and 2 harms keep an established rule by the counters (0.65 >= 0.6), not by recent evidence
    args = {
        "maturity": "established",
        "success_count": 15,
        "harmful_count": 2,
        "created_at": T0,
        "now": T0,
        "rules": RULES,
    }
    assert next_maturity(**args) == "established"
    assert next_maturity(**args, recent_effectiveness=0.1) == "candidate"


def test_anti_pattern_content_is_bounded_and_keeps_the_newest_reasons() -> None:
    reasons = [f"r{i} " + "x" * 1_500 for i in range(50)]
    text = anti_pattern_content("Cache " + "everything " * 3_000, reasons)
    assert len(text) <= 20_000
    assert text.endswith(reasons[-1]) and reasons[-2] not in text  # two do not fit in 2,000 characters
    assert anti_pattern_content("Use X", ["z" * 5_000]).endswith("z" * 2_000)
    assert len(anti_pattern_content("ANTI-PATTERN: " + "w" * 30_000)) == 20_000
