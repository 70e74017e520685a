"""Unit tests of shared.scoring: every formula with plain values, and its invariants as hypothesis properties."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import ScoreWeights
from shared.errors import InvalidInput
from shared.scoring import (
    MATURITY_WEIGHT,
    PERMANENCE_DECAY,
    PERMANENCE_LEVELS,
    backoff_seconds,
    classify_confidence,
    composite_score,
    decay_rate_for,
    effective_confidence,
    effectiveness,
    elapsed_days,
    normalise_rrf,
    recency,
    rrf,
    rrf_fuse,
    rule_weight,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
props = settings(deadline=None, max_examples=200)
unit = st.floats(min_value=0, max_value=1, allow_nan=False)
days = st.floats(min_value=0, max_value=10_000, allow_nan=False)
rates = st.floats(min_value=0, max_value=5, allow_nan=False)


# --- permanence ------------------------------------------------------------------------------


def test_permanence_levels_match_decay_table_in_order() -> None:
    # given the seed's permanence table
    # then the levels tuple lists them from never-fading to fastest-fading
    assert PERMANENCE_LEVELS == ("permanent", "stable", "standard", "volatile", "ephemeral")
    assert tuple(PERMANENCE_DECAY) == PERMANENCE_LEVELS
    rates_in_order = [decay_rate_for(level) for level in PERMANENCE_LEVELS]
    assert rates_in_order == [0.0, 0.002, 0.008, 0.03, 0.1]
    assert rates_in_order == sorted(rates_in_order)


def test_decay_rate_for_unknown_level_names_the_field() -> None:
    # when an unknown permanence is asked for
    with pytest.raises(InvalidInput) as raised:
        decay_rate_for("forever")
    # then it is refused, naming the field
    assert raised.value.field == "permanence"


# --- effective confidence --------------------------------------------------------------------


def test_effective_confidence_follows_exponential_decay() -> None:
    # given a standard fact confirmed 100 days ago at confidence 0.9
    now = T0 + timedelta(days=100)
    # when its effective confidence is computed
    value = effective_confidence(confidence=0.9, decay_rate=0.008, last_confirmed_at=T0, now=now)
    # then it is 0.9 * e^-0.8
    assert value == pytest.approx(0.9 * math.exp(-0.8))


def test_effective_confidence_of_permanent_fact_never_fades() -> None:
    # given a permanent fact confirmed ten years ago
    now = T0 + timedelta(days=3650)
    # then its confidence is untouched
    assert effective_confidence(confidence=0.7, decay_rate=0.0, last_confirmed_at=T0, now=now) == 0.7


def test_effective_confidence_ignores_confirmations_in_the_future() -> None:
    # given a confirmation timestamp after now (clock skew between writers)
    later = T0 + timedelta(hours=5)
    # then elapsed time counts as zero rather than boosting confidence
    assert effective_confidence(confidence=0.5, decay_rate=0.1, last_confirmed_at=later, now=T0) == 0.5


def test_naive_timestamps_are_refused() -> None:
    # given a naive datetime
    naive = datetime(2025, 1, 1)
    # then no decay is computed from it
    with pytest.raises(InvalidInput):
        effective_confidence(confidence=0.5, decay_rate=0.1, last_confirmed_at=naive, now=T0)
    with pytest.raises(InvalidInput):
        elapsed_days(since=T0, now=naive)


def test_negative_decay_rate_is_refused() -> None:
    with pytest.raises(InvalidInput) as raised:
        effective_confidence(confidence=0.5, decay_rate=-0.1, last_confirmed_at=T0, now=T0)
    assert raised.value.field == "decay_rate"


@props
@given(confidence=unit, rate=rates, first=days, extra=days)
def test_effective_confidence_is_bounded_and_non_increasing(
    confidence: float, rate: float, first: float, extra: float
) -> None:
    # given two instants, the second no earlier than the first
    earlier = T0 + timedelta(days=first)
    later = earlier + timedelta(days=extra)
    # when effective confidence is computed at both
    at_earlier = effective_confidence(confidence=confidence, decay_rate=rate, last_confirmed_at=T0, now=earlier)
    at_later = effective_confidence(confidence=confidence, decay_rate=rate, last_confirmed_at=T0, now=later)
    # then it stays within [0, confidence] and never grows with time
    assert 0.0 <= at_later <= at_earlier <= confidence


# --- confidence bands ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effective", "band"),
    [(1.0, "normal"), (0.2, "normal"), (0.19999, "fading"), (0.05, "fading"), (0.04999, "expired"), (0.0, "expired")],
)
def test_classify_confidence_edges(effective: float, band: str) -> None:
    # given the seed's thresholds (retrieval 0.2, expiry 0.05)
    # then each threshold belongs to the band above it
    assert classify_confidence(effective, retrieval_threshold=0.2, expiry_threshold=0.05) == band


# --- effectiveness ---------------------------------------------------------------------------


def test_effectiveness_seed_example() -> None:
    # given 10 successes and 2 harmful marks
    # then effectiveness is 10 / (10 + 8 + 0.01)
    value = effectiveness(success_count=10, harmful_count=2)
    assert value == pytest.approx(10 / 18.01)
    assert round(value, 3) == 0.555


def test_effectiveness_without_feedback_is_zero() -> None:
    assert effectiveness(success_count=0, harmful_count=0) == 0.0


def test_effectiveness_refuses_negative_counts() -> None:
    with pytest.raises(InvalidInput) as raised:
        effectiveness(success_count=-1, harmful_count=0)
    assert raised.value.field == "success_count"
    with pytest.raises(InvalidInput) as raised:
        effectiveness(success_count=0, harmful_count=-1)
    assert raised.value.field == "harmful_count"


@props
@given(success=st.integers(0, 10_000), harmful=st.integers(0, 10_000))
def test_effectiveness_is_in_unit_interval_and_monotone(success: int, harmful: int) -> None:
    # given any feedback counts
    value = effectiveness(success_count=success, harmful_count=harmful)
    # then it is in [0, 1), rises with a success and falls with a harmful mark
    assert 0.0 <= value < 1.0
    assert effectiveness(success_count=success + 1, harmful_count=harmful) >= value
    assert effectiveness(success_count=success, harmful_count=harmful + 1) <= value


# --- recency ---------------------------------------------------------------------------------


def test_recency_is_one_when_just_referenced_and_halves_at_half_life() -> None:
    # given the default 0.05/day decay
    assert recency(last_referenced_at=T0, now=T0, decay_per_day=0.05) == 1.0
    # then after ln(2)/0.05 days recency is one half
    half_life = timedelta(days=math.log(2) / 0.05)
    assert recency(last_referenced_at=T0, now=T0 + half_life, decay_per_day=0.05) == pytest.approx(0.5)


def test_recency_refuses_negative_decay() -> None:
    with pytest.raises(InvalidInput):
        recency(last_referenced_at=T0, now=T0, decay_per_day=-1)


@props
@given(rate=rates, age=days)
def test_recency_in_unit_interval(rate: float, age: float) -> None:
    value = recency(last_referenced_at=T0, now=T0 + timedelta(days=age), decay_per_day=rate)
    assert 0.0 <= value <= 1.0


# --- reciprocal rank fusion ------------------------------------------------------------------


def test_rrf_sums_reciprocal_ranks_and_skips_absent_lists() -> None:
    # given an item ranked 1st semantically and absent from the keyword list
    # then only the present rank contributes
    assert rrf([1, None]) == pytest.approx(1 / 61)
    assert rrf([1, 3], k=60) == pytest.approx(1 / 61 + 1 / 63)
    assert rrf([None, None]) == 0.0
    assert rrf([]) == 0.0


def test_rrf_refuses_zero_based_ranks() -> None:
    with pytest.raises(InvalidInput) as raised:
        rrf([0])
    assert raised.value.field == "rank"


def test_rrf_fuse_orders_by_fused_score() -> None:
    # given a semantic and a keyword ranking
    semantic = ["a", "b", "c"]
    keyword = ["c", "a", "d"]
    # when they are fused
    fused = rrf_fuse([semantic, keyword], k=60)
    # then each id's score is its rrf over both lists, best first
    assert fused["a"] == pytest.approx(rrf([1, 2]))
    assert fused["c"] == pytest.approx(rrf([3, 1]))
    assert fused["b"] == pytest.approx(rrf([2, None]))
    assert fused["d"] == pytest.approx(rrf([None, 3]))
    assert list(fused) == ["a", "c", "b", "d"]


def test_rrf_fuse_counts_a_repeated_id_once_per_list() -> None:
    # given a list that repeats an id
    fused = rrf_fuse([["x", "y", "x"]])
    # then only its best rank counts
    assert fused["x"] == pytest.approx(1 / 61)


def test_rrf_fuse_ties_keep_first_appearance() -> None:
    fused = rrf_fuse([["p", "q"], ["q", "p"]])
    assert list(fused) == ["p", "q"]


def test_normalise_rrf_maps_best_possible_to_one() -> None:
    # given two lists and an item ranked first in both
    best = rrf([1, 1], k=60)
    # then it normalises to 1.0; absent everywhere to 0.0; no lists to 0.0
    assert normalise_rrf(best, 2, 60) == pytest.approx(1.0)
    assert normalise_rrf(0.0, 2, 60) == 0.0
    assert normalise_rrf(0.5, 0, 60) == 0.0
    assert normalise_rrf(rrf([1, None]), n_lists=2, k=60) == pytest.approx(0.5)


@props
@given(rank=st.integers(1, 10_000), k=st.integers(0, 1000))
def test_rrf_is_strictly_decreasing_in_rank(rank: int, k: int) -> None:
    # a worse rank never scores at least as well as a better one
    assert rrf([rank], k) > rrf([rank + 1], k) > 0.0


@props
@given(ranks=st.lists(st.one_of(st.none(), st.integers(1, 500)), max_size=5), k=st.integers(1, 200))
def test_normalised_rrf_is_in_unit_interval(ranks: list[int | None], k: int) -> None:
    value = normalise_rrf(rrf(ranks, k), len(ranks), k)
    assert 0.0 <= value <= 1.0


# --- composite score -------------------------------------------------------------------------


def test_composite_score_weights_each_signal() -> None:
    # given the seed's weights (0.4, 0.3, 0.2, 0.1)
    weights = ScoreWeights()
    # when a fact has relevance 0.5, importance 8, recency 0.25, confidence 0.9
    score = composite_score(relevance=0.5, importance=8, recency=0.25, effective_confidence=0.9, weights=weights)
    # then the score is the weighted sum with importance scaled to 0..1
    assert score == pytest.approx(0.4 * 0.5 + 0.3 * 0.8 + 0.2 * 0.25 + 0.1 * 0.9)


def test_composite_score_clamps_out_of_range_relevance() -> None:
    weights = ScoreWeights(relevance=1.0, importance=0.0, recency=0.0, confidence=0.0)
    assert composite_score(relevance=1.7, importance=5, recency=0, effective_confidence=0, weights=weights) == 1.0
    assert composite_score(relevance=-0.3, importance=5, recency=0, effective_confidence=0, weights=weights) == 0.0


@st.composite
def weights_summing_to_one(draw: st.DrawFn) -> ScoreWeights:
    raw = [draw(st.floats(min_value=0.01, max_value=1.0)) for _ in range(4)]
    total = sum(raw)
    relevance, importance, recency_w, confidence = (value / total for value in raw)
    return ScoreWeights(relevance=relevance, importance=importance, recency=recency_w, confidence=confidence)


@props
@given(
    weights=weights_summing_to_one(),
    relevance=unit,
    importance=st.floats(min_value=1, max_value=10),
    recency_value=unit,
    confidence=unit,
)
def test_composite_score_in_unit_interval(
    weights: ScoreWeights, relevance: float, importance: float, recency_value: float, confidence: float
) -> None:
    # given weights summing to 1 and every input in its range
    score = composite_score(
        relevance=relevance,
        importance=importance,
        recency=recency_value,
        effective_confidence=confidence,
        weights=weights,
    )
    # then the composite is in [0, 1] (with float slack)
    assert 0.0 <= score <= 1.0 + 1e-9


# --- rule maturity weight --------------------------------------------------------------------


def test_maturity_weights_rise_with_maturity() -> None:
    assert rule_weight("candidate") < rule_weight("established") < rule_weight("proven") == 1.0
    assert 0.0 < rule_weight("anti_pattern") <= 1.0
    assert set(MATURITY_WEIGHT) == {"candidate", "established", "proven", "anti_pattern"}


def test_rule_weight_refuses_unknown_maturity() -> None:
    with pytest.raises(InvalidInput) as raised:
        rule_weight("legendary")
    assert raised.value.field == "maturity"


# --- backoff ---------------------------------------------------------------------------------


def test_backoff_doubles_from_base_with_equal_jitter() -> None:
    # given base 30 s, cap 3600 s
    # then with jitter 0 the delay is half of base * 2**(attempt-1); near 1 it approaches the full value
    assert backoff_seconds(attempt=1, base=30, cap=3600, jitter=0.0) == 15.0
    assert backoff_seconds(attempt=3, base=30, cap=3600, jitter=0.0) == 60.0
    assert backoff_seconds(attempt=3, base=30, cap=3600, jitter=0.5) == 90.0
    # and the cap bounds the delay before jitter is applied
    assert backoff_seconds(attempt=20, base=30, cap=3600, jitter=0.0) == 1800.0


def test_backoff_survives_huge_attempt_numbers() -> None:
    assert backoff_seconds(attempt=100_000, base=30, cap=3600, jitter=0.999) < 3600


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attempt": 0, "base": 1, "cap": 1, "jitter": 0}, "attempt"),
        ({"attempt": 1, "base": 0, "cap": 1, "jitter": 0}, "base"),
        ({"attempt": 1, "base": 1, "cap": 0, "jitter": 0}, "cap"),
        ({"attempt": 1, "base": 1, "cap": 1, "jitter": 1.0}, "jitter"),
        ({"attempt": 1, "base": 1, "cap": 1, "jitter": -0.1}, "jitter"),
    ],
)
def test_backoff_refuses_bad_arguments(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        backoff_seconds(**kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field


@props
@given(
    attempt=st.integers(1, 2000),
    base=st.floats(min_value=0.001, max_value=1e4),
    cap=st.floats(min_value=0.001, max_value=1e6),
    jitter=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_is_bounded_by_cap_and_non_decreasing(attempt: int, base: float, cap: float, jitter: float) -> None:
    # given a fixed jitter
    now_delay = backoff_seconds(attempt=attempt, base=base, cap=cap, jitter=jitter)
    next_delay = backoff_seconds(attempt=attempt + 1, base=base, cap=cap, jitter=jitter)
    # then the delay is positive, never above the cap, and never shrinks with the next attempt
    assert 0.0 < now_delay <= cap
    assert next_delay >= now_delay
