"""Decay, effectiveness, recency, rank fusion and the composite score: pure functions, time passed in.

Nothing here reads a clock, a database or the environment, so every number the read path and the
sweeps compute can be reproduced from plain values in a unit test.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Literal

from shared.config import ScoreWeights
from shared.errors import InvalidInput

SECONDS_PER_DAY = 86_400.0

# Per-day exponential decay of a fact's confidence; "permanent" never fades.
PERMANENCE_DECAY: Mapping[str, float] = MappingProxyType(
    {"permanent": 0.0, "stable": 0.002, "standard": 0.008, "volatile": 0.03, "ephemeral": 0.1}
)
PERMANENCE_LEVELS: tuple[str, ...] = ("permanent", "stable", "standard", "volatile", "ephemeral")

# A harmful mark outweighs a success: one bad outcome costs four good ones (the seed's formula).
HARMFUL_WEIGHT = 4
# Keeps 0/0 defined (= 0.0) without visibly moving real ratios.
EFFECTIVENESS_EPSILON = 0.01

# How much a rule's maturity scales its score. Anti-patterns rank high (0.9) because a warning about
# a known-bad practice is worth reading, but callers present them as warnings, never as advice.
MATURITY_WEIGHT: Mapping[str, float] = MappingProxyType(
    {"candidate": 0.7, "established": 0.85, "proven": 1.0, "anti_pattern": 0.9}
)

ConfidenceBand = Literal["normal", "fading", "expired"]


def decay_rate_for(permanence: str) -> float:
    """The per-day decay rate of a permanence level; unknown levels are refused, never defaulted."""
    try:
        return PERMANENCE_DECAY[permanence]
    except KeyError:
        raise InvalidInput(
            f"unknown permanence {permanence!r}; expected one of {', '.join(PERMANENCE_LEVELS)}", field="permanence"
        ) from None


def elapsed_days(*, since: datetime, now: datetime) -> float:
    """Days from ``since`` to ``now``, never negative; both must be timezone-aware."""
    # Naive datetimes would silently compare wall clocks from different zones.
    if since.tzinfo is None or now.tzinfo is None:
        raise InvalidInput("timestamps must be timezone-aware (UTC)", field="now")
    return max(0.0, (now - since).total_seconds() / SECONDS_PER_DAY)


def effective_confidence(*, confidence: float, decay_rate: float, last_confirmed_at: datetime, now: datetime) -> float:
    """``confidence * exp(-decay_rate * days)``: in [0, confidence], non-increasing as ``now`` advances."""
    if decay_rate < 0:
        raise InvalidInput("decay_rate must be >= 0", field="decay_rate")
    days = elapsed_days(since=last_confirmed_at, now=now)
    return confidence * math.exp(-decay_rate * days)


def effective_confidence_sql(alias: str, now: str = "CAST(:now AS timestamptz)") -> str:
    """The SQL twin of :func:`effective_confidence` for rows ``alias`` (filters, sweeps and stats in one query).

    float8 throughout (date_part, not extract, which is numeric and ~3x slower per row); the exponent is capped
    because PostgreSQL raises on exp() underflow, and exp(-700) is 0 for every purpose here.
    """
    return (
        f"{alias}.confidence * exp(-least({alias}.decay_rate * greatest(0, date_part('epoch', {now} - "
        f"{alias}.last_confirmed_at) / 86400.0), 700))"
    )


def classify_confidence(effective: float, *, retrieval_threshold: float, expiry_threshold: float) -> ConfidenceBand:
    """``normal`` at or above retrieval, ``expired`` below expiry, ``fading`` in between."""
    if effective >= retrieval_threshold:
        return "normal"
    if effective >= expiry_threshold:
        return "fading"
    return "expired"


def effectiveness(*, success_count: float, harmful_count: float) -> float:
    """``success / (success + 4*harmful + 0.01)``: in [0, 1), 0 with no feedback."""
    if success_count < 0:
        raise InvalidInput("success_count must be >= 0", field="success_count")
    if harmful_count < 0:
        raise InvalidInput("harmful_count must be >= 0", field="harmful_count")
    return success_count / (success_count + HARMFUL_WEIGHT * harmful_count + EFFECTIVENESS_EPSILON)


def recency(*, last_referenced_at: datetime, now: datetime, decay_per_day: float) -> float:
    """``exp(-decay_per_day * days)`` since the last reference: in (0, 1], 1 when just referenced."""
    if decay_per_day < 0:
        raise InvalidInput("decay_per_day must be >= 0", field="decay_per_day")
    return math.exp(-decay_per_day * elapsed_days(since=last_referenced_at, now=now))


def _check_k(k: int) -> None:
    if k < 0:
        raise InvalidInput("rrf k must be >= 0", field="k")


def rrf(ranks: Sequence[int | None], k: int = 60) -> float:
    """Reciprocal rank fusion of one item's 1-based ranks; ``None`` (absent from a list) adds nothing."""
    _check_k(k)
    total = 0.0
    for rank in ranks:
        if rank is None:
            continue
        if rank < 1:
            raise InvalidInput(f"ranks are 1-based, got {rank}", field="rank")
        total += 1.0 / (k + rank)
    return total


def rrf_fuse(rankings: Sequence[Sequence[Hashable]], k: int = 60) -> dict[Hashable, float]:
    """Fuse ranked id lists into ``{id: rrf score}``, ordered best first (ties keep first appearance)."""
    _check_k(k)
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        seen: set[Hashable] = set()
        for position, item in enumerate(ranking, start=1):
            # A list that repeats an id must not vote for it twice; its best rank counts.
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + position)
    # sorted() is stable, so equal scores keep the order in which ids were first met.
    return dict(sorted(scores.items(), key=lambda pair: -pair[1]))


def normalise_rrf(score: float, n_lists: int, k: int = 60) -> float:
    """Scale an RRF score so rank 1 in all ``n_lists`` lists maps to 1.0; in [0, 1], 0 with no lists."""
    _check_k(k)
    if n_lists <= 0:
        return 0.0
    best = n_lists / (k + 1)
    return min(1.0, max(0.0, score / best))


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def relative_relevance(relevance: float, best: float) -> float:
    """Relevance as the composite score weighs it: a share of the best match of the same read, in [0, 1].

    Fused relevance is calibrated but narrow (a good conversation match scores ~0.5, a poor one ~0.3), so on its
    raw scale relevance would move the composite score too little and importance, recency or confidence would pick
    the winner among near-ties of meaning. Relative to the best match, the best scores 1 and a match half as good
    0.5: it wins unless the others are clearly more important, recent or confident."""
    return min(1.0, max(0.0, relevance / best)) if best > 0 else 0.0


def composite_score(
    *, relevance: float, importance: float, recency: float, effective_confidence: float, weights: ScoreWeights
) -> float:
    """Weighted sum of relevance, importance/10, recency and confidence; in [0, sum of weights]."""
    # Inputs are clamped to their ranges so one bad upstream value cannot dominate a mixed ordering.
    return (
        weights.relevance * _clamp(relevance, 0.0, 1.0)
        + weights.importance * _clamp(importance, 0.0, 10.0) / 10.0
        + weights.recency * _clamp(recency, 0.0, 1.0)
        + weights.confidence * _clamp(effective_confidence, 0.0, 1.0)
    )


def rule_weight(maturity: str) -> float:
    """The score multiplier of a rule's maturity; unknown maturities are refused."""
    try:
        return MATURITY_WEIGHT[maturity]
    except KeyError:
        raise InvalidInput(f"unknown rule maturity {maturity!r}", field="maturity") from None


def backoff_seconds(*, attempt: int, base: float, cap: float, jitter: float) -> float:
    """Equal-jitter exponential backoff: ``d * (0.5 + jitter/2)`` with ``d = min(cap, base * 2**(attempt-1))``.

    The result lies in [d/2, d), so it never exceeds ``cap`` and, for a fixed ``jitter``, never
    shrinks as ``attempt`` grows. ``jitter`` in [0, 1) is passed in (e.g. ``random.random()``) so the
    function stays deterministic; keeping half of ``d`` fixed stops retries from bunching at zero.
    """
    if attempt < 1:
        raise InvalidInput("attempt is 1-based", field="attempt")
    if base <= 0:
        raise InvalidInput("base must be > 0", field="base")
    if cap <= 0:
        raise InvalidInput("cap must be > 0", field="cap")
    if not 0.0 <= jitter < 1.0:
        raise InvalidInput("jitter must be in [0, 1)", field="jitter")
    # Past 2**1000 every realistic cap is already reached; bounding the exponent avoids int->float overflow.
    delay = min(cap, base * 2.0 ** min(attempt - 1, 1000))
    return delay * (0.5 + jitter / 2.0)
