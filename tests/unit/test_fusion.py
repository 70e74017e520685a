"""Unit tests of hybrid relevance (shared.fusion), relevance in the composite score, and window spans."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import ScoreWeights
from shared.conversation import window_spans
from shared.fusion import diversify, fuse, share_sessions
from shared.scoring import composite_score, normalise_rrf, relative_relevance, rrf

props = settings(deadline=None, max_examples=300)
unit = st.floats(min_value=0, max_value=1, allow_nan=False)


def test_fuse_weighs_the_two_legs_and_counts_a_missing_leg_as_zero():
    assert fuse(semantic=0.5, keyword=1.0, semantic_weight=0.6) == pytest.approx(0.7)
    assert fuse(semantic=0.5, keyword=None, semantic_weight=0.6) == pytest.approx(0.3)
    assert fuse(semantic=None, keyword=0.5, semantic_weight=0.6, keyword_exponent=2) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        fuse(semantic=0.5, keyword=0.5, semantic_weight=1.5)


@props
@given(s=unit, k=unit, w=unit, e=st.floats(min_value=1, max_value=4))
def test_fuse_is_a_calibrated_value_monotone_in_each_leg(s, k, w, e):
    value = fuse(semantic=s, keyword=k, semantic_weight=w, keyword_exponent=e)
    assert 0 <= value <= 1
    assert fuse(semantic=min(1, s + 0.1), keyword=k, semantic_weight=w, keyword_exponent=e) >= value
    assert fuse(semantic=s, keyword=min(1, k + 0.1), semantic_weight=w, keyword_exponent=e) >= value


def test_fusion_by_value_keeps_how_strong_a_match_is_where_rank_fusion_flattens_it():
    # given a near-perfect match and a barely-better-than-noise one, each first in one list
    strong = fuse(semantic=0.9, keyword=0.0, semantic_weight=0.6)
    weak = fuse(semantic=0.0, keyword=0.15, semantic_weight=0.6)
    # then by value the strong one is far ahead, while by rank the two tie
    assert strong > 5 * weak
    assert normalise_rrf(rrf([1, None]), 2) == normalise_rrf(rrf([None, 1]), 2)


def test_diversify_lets_another_session_in_before_a_session_repeats_itself():
    items = [("a", 1.0), ("a", 0.95), ("a", 0.9), ("b", 0.8), ("c", 0.5)]
    out = diversify(items, score=lambda t: t[1], group=lambda t: t[0], decay=0.8, limit=4)
    # a2 (0.95 * 0.8 = 0.76) now yields to b (0.8); c (0.5) still cannot pass a2 or a3 (0.9 * 0.64 = 0.58)
    assert out == [("a", 1.0), ("b", 0.8), ("a", 0.95), ("a", 0.9)]
    assert diversify(items, score=lambda t: t[1], group=lambda t: t[0], decay=1.0, limit=3) == items[:3]
    # ungrouped items are never discounted
    assert diversify(items, score=lambda t: t[1], group=lambda t: None, decay=0.1, limit=5) == items


def test_diversify_below_a_head_keeps_the_head_and_counts_it_as_shown():
    items = [("a", 1.0), ("a", 0.95), ("a", 0.9), ("b", 0.8), ("c", 0.5)]
    # the two best keep their places; the third of a (0.9 * 0.5 ** 2) then yields to b and c
    out = diversify(items, score=lambda t: t[1], group=lambda t: t[0], decay=0.5, limit=5, head=2)
    assert out == [("a", 1.0), ("a", 0.95), ("b", 0.8), ("c", 0.5), ("a", 0.9)]
    assert diversify(items, score=lambda t: t[1], group=lambda t: t[0], decay=0.5, limit=3, head=3) == items[:3]
    with pytest.raises(ValueError, match="head"):
        diversify(items, score=lambda t: t[1], group=lambda t: t[0], decay=0.5, limit=3, head=-1)


@props
@given(
    scores=st.lists(unit, min_size=1, max_size=30),
    groups=st.lists(st.integers(0, 4), min_size=30, max_size=30),
    decay=st.floats(min_value=0.05, max_value=1),
    limit=st.integers(1, 40),
    head=st.integers(0, 12),
)
def test_diversify_returns_a_prefix_sized_permutation_and_keeps_the_best_first(scores, groups, decay, limit, head):
    items = sorted(zip(scores, groups[: len(scores)], range(len(scores))), key=lambda t: -t[0])
    out = diversify(items, score=lambda t: t[0], group=lambda t: t[1], decay=decay, limit=limit, head=head)
    assert len(out) == min(limit, len(items))
    assert len(set(out)) == len(out) and set(out) <= set(items)
    assert out[0] == items[0]
    assert out[: min(head, limit)] == items[: min(head, limit)]


def test_a_session_answering_in_several_turns_lifts_them_over_a_lone_turn_of_the_same_strength():
    # a: two good turns; b: one turn as good as a's best; None: a row of no session (a session of one)
    out = share_sessions([0.6, 0.5, 0.6, 0.6], ["a", "a", "b", None], share=0.3, top=2)
    assert out == pytest.approx(
        [0.7 * 0.6 + 0.3 * 0.55, 0.7 * 0.5 + 0.3 * 0.55, 0.7 * 0.6 + 0.3 * 0.3, 0.7 * 0.6 + 0.3 * 0.3]
    )
    assert out[0] > out[2] == out[3]
    assert share_sessions([0.6, 0.5], ["a", "a"], share=0.0, top=2) == [0.6, 0.5]
    with pytest.raises(ValueError, match="share"):
        share_sessions([0.5], ["a"], share=1.5, top=2)
    with pytest.raises(ValueError, match="top"):
        share_sessions([0.5], ["a"], share=0.3, top=0)


@props
@given(
    rels=st.lists(unit, min_size=1, max_size=30),
    sessions=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=30, max_size=30),
    share=unit,
    top=st.integers(1, 5),
)
def test_share_sessions_stays_calibrated_and_keeps_the_order_within_a_session(rels, sessions, share, top):
    out = share_sessions(rels, sessions[: len(rels)], share=share, top=top)
    assert all(-1e-9 <= v <= 1 + 1e-9 for v in out)
    for i, j in ((i, j) for i in range(len(rels)) for j in range(len(rels))):
        if sessions[i] is not None and sessions[i] == sessions[j] and rels[i] > rels[j]:
            assert out[i] >= out[j]


candidate = st.fixed_dictionaries(
    {
        "relevance": st.floats(min_value=0.01, max_value=1),
        "importance": st.floats(1, 10),
        "recency": unit,
        "confidence": unit,
    }
)


@props
@given(cands=st.lists(candidate, min_size=2, max_size=50))
def test_the_best_match_wins_unless_another_is_clearly_more_important_recent_or_confident(cands):
    # given a read's candidates (seed 000's weights), relevance taken relative to the best match
    weights = ScoreWeights()
    best = max(c["relevance"] for c in cands)
    top = max(cands, key=lambda c: c["relevance"])

    def score(c: dict) -> float:
        return composite_score(
            relevance=relative_relevance(c["relevance"], best),
            importance=c["importance"],
            recency=c["recency"],
            effective_confidence=c["confidence"],
            weights=weights,
        )

    for other in cands:
        # a match at most half as good, up to 4 points more important (seed 000's example: 9 against 5), no more
        # recent and no more confident, never outranks the best match
        if (
            other["relevance"] <= best / 2
            and other["importance"] - top["importance"] <= 4
            and other["recency"] <= top["recency"]
            and other["confidence"] <= top["confidence"]
        ):
            assert score(top) > score(other)


def test_the_issue_example_the_fiftieth_candidate_with_importance_9_no_longer_outranks_the_best_match():
    weights = ScoreWeights()
    # relevance as value fusion gives it on a conversation: the best match ~0.55, the 50th ~0.25
    best = composite_score(
        relevance=relative_relevance(0.55, 0.55), importance=5, recency=0.5, effective_confidence=1, weights=weights
    )
    fiftieth = composite_score(
        relevance=relative_relevance(0.25, 0.55), importance=9, recency=0.5, effective_confidence=1, weights=weights
    )
    assert best > fiftieth
    # (the rank-based relevance it replaces: RRF normalised to [0.28, 0.5] for ranks 50 and 1)
    rank_best = composite_score(relevance=0.5, importance=5, recency=0.5, effective_confidence=1, weights=weights)
    rank_fiftieth = composite_score(relevance=0.28, importance=9, recency=0.5, effective_confidence=1, weights=weights)
    assert rank_fiftieth > rank_best


def test_window_spans_cover_a_long_text_with_overlap_and_leave_a_short_one_alone():
    offsets = [(i * 4, i * 4 + 3) for i in range(600)]
    spans = window_spans(offsets, size=200, stride=150, longer_than=250)
    # the episode's own vector reads the first 250 word pieces: the first window starts inside them
    assert spans[0] == (offsets[150][0], offsets[349][1])
    assert spans[-1][1] == offsets[-1][1]
    assert all(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # consecutive windows overlap
    assert window_spans(offsets[:250], size=200, stride=150, longer_than=250) == []
