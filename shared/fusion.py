"""Hybrid relevance and result diversity: pure functions over plain values.

Fusion by value: every candidate carries both legs' scores (cosine similarity; BM25 over the query's idf total), each
already on a calibrated [0, 1] scale, and relevance is their weighted sum. Unlike rank fusion (RRF), a strong match
on one leg is not flattened to its rank, and a row found by one leg still gets what the other leg says of it.

Session evidence: a conversation turn is also judged by the company it keeps. Its relevance shares a part with the
mean of the best few candidates of its session, so a session that answers the question in several turns lifts each
of them over a lone turn of the same strength elsewhere (the evidence-aggregation idea of passage ranking: a document
is as good as its best passages).

Diversity: a greedy re-ranking in which each further hit of a group already shown (an episode's session; a fact's
subject and predicate) has its score multiplied by ``decay`` once more, so the top of a list covers more sessions
and subjects instead of repeating one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")


def fuse(
    *, semantic: float | None, keyword: float | None, semantic_weight: float, keyword_exponent: float = 1.0
) -> float:
    """``w * semantic + (1 - w) * keyword ** e``, each clamped to [0, 1]; a leg that did not run counts 0.

    An exponent above 1 discounts partial keyword matches (a row holding a third of the query's term weight gets
    a ninth at 2) while a row holding every term keeps its full share."""
    if not 0 <= semantic_weight <= 1:
        raise ValueError(f"semantic_weight must be in [0, 1], got {semantic_weight}")
    s = min(1.0, max(0.0, semantic or 0.0))
    k: float = min(1.0, max(0.0, keyword or 0.0)) ** keyword_exponent  # a float: the base is not negative
    return semantic_weight * s + (1 - semantic_weight) * k


def share_sessions(
    relevances: Sequence[float], sessions: Sequence[Hashable | None], *, share: float, top: int
) -> list[float]:
    """``(1 - share) * own + share * session``, where ``session`` is the mean of the best ``top`` relevances among the
    candidates of the row's session, a missing one counting 0 (a row without a session is a session of one).

    Stays in [0, 1] for inputs in [0, 1]; ``share`` 0 returns the input."""
    if not 0 <= share <= 1:
        raise ValueError(f"share must be in [0, 1], got {share}")
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    if share == 0:
        return list(relevances)
    groups = [("row", i) if session is None else session for i, session in enumerate(sessions)]
    members: dict[Hashable, list[float]] = {}
    for rel, group in zip(relevances, groups, strict=True):
        members.setdefault(group, []).append(rel)
    mean = {group: sum(sorted(rels, reverse=True)[:top]) / top for group, rels in members.items()}
    return [(1 - share) * rel + share * mean[group] for rel, group in zip(relevances, groups)]


def diversify(
    items: Sequence[T],
    *,
    score: Callable[[T], float],
    group: Callable[[T], Hashable | None],
    decay: float,
    limit: int,
    head: int = 0,
) -> list[T]:
    """The first ``limit`` of ``items`` (given best first, scores >= 0) re-ranked greedily by ``score * decay ** shown`` where
    ``shown`` counts the items of the same group already taken (None = no group). ``decay`` 1 keeps the order.

    The first ``head`` items keep their places (and count as shown): the top of the list stays the best matches,
    and only what follows it is spread over groups.

    Ties keep the given order, so the result is deterministic for a deterministic input."""
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    if head < 0:
        raise ValueError(f"head must be at least 0, got {head}")
    if decay == 1 or head >= limit:
        return list(items[:limit])
    out = list(items[:head])
    pool = list(items[head:])
    shown: Counter[Hashable] = Counter(g for g in map(group, out) if g is not None)
    while pool and len(out) < limit:
        best_i, best = 0, float("-inf")
        for i, item in enumerate(pool):
            raw = score(item)
            if raw <= best:  # given best first, and a discount only lowers a score: no later item can win
                break
            g = group(item)
            value = raw * (decay ** shown[g] if g is not None else 1.0)
            if value > best:
                best_i, best = i, value
        item = pool.pop(best_i)
        out.append(item)
        g = group(item)
        if g is not None:
            shown[g] += 1
    return out
