"""The labelled extraction set is well formed, and bench_extraction scores a known answer as expected."""

from __future__ import annotations

from collections import Counter

import pytest

from shared.extraction import Extraction, NewFact, NewRule
from shared.vocabulary import PREDICATES
from tests.bench.bench_extraction import Score, request_for, score_case, subject_key
from tests.bench.extraction_dataset import CASES, Case, GoldFact

FAMILY = ("wife", "husband", "son", "daughter", "sister", "brother", "mother", "father", "mom", "dad")


def test_the_set_is_large_split_40_60_and_every_form_is_in_both_splits():
    assert len(CASES) >= 200 and len({c.id for c in CASES}) == len(CASES)
    held = sum(c.split == "held" for c in CASES) / len(CASES)
    assert 0.35 <= held <= 0.45
    by_form = Counter((c.form, c.split) for c in CASES)
    assert all(by_form[(form, split)] > 0 for form in {c.form for c in CASES} for split in ("dev", "held"))


def test_gold_facts_use_the_vocabulary_name_their_subject_and_decay_as_it_says():
    for case in CASES:
        for fact in case.facts + case.known:
            assert fact.predicate in PREDICATES, (case.id, fact)
            assert ("User" if fact.subject == "user" else fact.subject) in fact.content, (case.id, fact)
            if fact.predicate == "relationship":
                family = any(f" {word}" in fact.content for word in FAMILY)
                assert fact.permanence == ("permanent" if family else "stable"), (case.id, fact)
            else:
                assert fact.permanence == PREDICATES[fact.predicate].permanence, (case.id, fact)


class Exact:
    """Texts are similar only when equal (so the scoring is checked without the model)."""

    def __call__(self, a: str, b: str) -> float:
        return 1.0 if a == b else 0.0

    def vectors(self, texts: object) -> None:
        pass


def test_scoring_counts_matches_misses_and_extras():
    case = Case(
        id="t",
        form="multi",
        split="dev",
        butler="health",
        content="...",
        facts=(
            GoldFact("user", "lives_in", "stable", "User lives in Oslo"),
            GoldFact("user", "allergic_to", "permanent", "User is allergic to cats"),
        ),
        rules=("Always answer in metric units",),
    )
    request = request_for(case)
    source = [request.episodes[0].id]
    got = Extraction(
        facts=[
            NewFact(
                subject="User",
                predicate="lives_in",
                content="User lives in Oslo",
                permanence="volatile",
                scope="health",
                source_episode_ids=source,
            ),
            NewFact(
                subject="Maria",
                predicate="lives_in",
                content="User lives in Oslo",
                permanence="stable",
                scope="health",
                source_episode_ids=source,
            ),
            NewFact(
                subject="user",
                predicate="likes_tea",
                content="User likes tea",
                permanence="standard",
                scope="global",
                source_episode_ids=source,
            ),
        ],
        rules=[NewRule(content="Always answer in metric units", source_episode_ids=source)],
    )
    score = Score()
    score_case(case, request, got, Exact(), score)
    figures = score.figures()
    # one of three predicted facts is right; one of two gold facts is found
    assert (figures["fact P"], figures["fact R"]) == (pytest.approx(1 / 3), 0.5)
    # the Maria fact has the right predicate and content but the wrong subject; the first one its subject
    assert figures["subject"] == 0.5
    assert (figures["permanence"], figures["scope"]) == (0.0, 1.0)
    assert (figures["rule P"], figures["rule R"]) == (1.0, 1.0)
    assert len(score.errors) == 4  # a permanence, two extra facts, one miss
    assert subject_key("The User") == "user"
