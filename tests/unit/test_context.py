"""The context block's budget policy and annotations (shared.context), with a whitespace word count standing in
for the tokenizer: additive over whitespace-joined pieces, as build() requires of its counter."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.candidates import Filter
from shared.config import SectionQuotas
from shared.context import LINE_CHUNK, MAX_LINE_TOKENS, age, build, line_for
from shared.retrieval import LazyHits
from shared.schemas import Hit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def words(texts: Sequence[str]) -> list[int]:
    return [len(text.split()) for text in texts]


def hits(kind: str, n: int, *, length: int = 8, maturity: str = "candidate", start: int = 0) -> list[Hit]:
    return [
        Hit.model_construct(
            type=kind,
            id=uuid.UUID(int=start + i),
            content=" ".join([f"{kind}{i}"] * length),
            score=1.0 - i / 1000,
            relevance=1.0,
            created_at=NOW - timedelta(hours=i + 1),
            last_confirmed_at=NOW - timedelta(days=12),
            permanence="stable",
            maturity=maturity,
            scope="global",
            importance=5.0,
            content_tokens=None,
        )
        for i in range(n)
    ]


def ids(block, section: str) -> list[str]:
    return block.included.get(section, [])


def test_ages_use_the_seeds_units():
    assert [
        age(NOW - delta, NOW)
        for delta in (
            timedelta(seconds=45),
            timedelta(minutes=12),
            timedelta(hours=2),
            timedelta(days=12),
            timedelta(days=400),
        )
    ] == ["45s", "12m", "2h", "12d", "400d"]
    line = build(
        facts=hits("fact", 1),
        rules=[],
        warnings=[],
        episodes=[],
        budget=100,
        quotas=SectionQuotas(),
        count=words,
        now=NOW,
    ).text.splitlines()[-1]
    assert line.endswith("[stable, confirmed 12d ago]")


def spent(block) -> int:
    """Budget a block used: its tokens plus the line-break margins (header, a blank line and title per section,
    each line)."""
    return block.tokens + 1 + 2 * len(block.included) + sum(map(len, block.included.values()))


# A fact line is 13 words ("- <8 words> [stable, confirmed 12d ago]"), a rule or episode line 11; each costs one more
# for its line break. A section's title costs 7 with its blank line.
def test_when_every_section_has_plenty_each_keeps_its_share():
    # given far more candidates than the budget holds in every section, and no anti-patterns
    facts, rules, episodes = hits("fact", 100), hits("rule", 100, start=1000), hits("episode", 100, start=2000)
    block = build(
        facts=facts,
        rules=rules,
        warnings=[],
        episodes=episodes,
        budget=1000,
        quotas=SectionQuotas(),
        count=words,
        now=NOW,
    )
    # then each section fills its share and no more: facts 500 -> (500-7)//14 = 35, 3 left over; rules 0.75 of 300
    # + 3 -> (228-7)//12 = 18, 5 left; the warnings' 75 + 5 flow on to episodes: 200 + 80 -> (280-7)//12 = 22
    assert {name: len(chosen) for name, chosen in block.included.items()} == {"facts": 35, "rules": 18, "episodes": 22}
    # and the 6 tokens still spare fit no further line
    assert spent(block) == 994


def test_spare_budget_goes_back_to_the_sections_that_were_cut():
    # given only facts and rules (no episodes, no anti-patterns), far more than the budget holds
    facts, rules = hits("fact", 100), hits("rule", 100, start=1000)
    block = build(
        facts=facts, rules=rules, warnings=[], episodes=[], budget=1000, quotas=SectionQuotas(), count=words, now=NOW
    )
    # then the shares nobody used go back, facts first: the block is filled until no line of either fits
    assert 1000 - 12 < spent(block) <= 1000
    assert len(ids(block, "rules")) == 18 and len(ids(block, "facts")) > 35
    # and each section is still its candidates' top ranks, in rank order
    assert ids(block, "facts") == [str(h.id) for h in facts[: len(ids(block, "facts"))]]
    assert ids(block, "rules") == [str(h.id) for h in rules[: len(ids(block, "rules"))]]
    assert block.dropped == 200 - len(ids(block, "facts")) - len(ids(block, "rules"))


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(50, 3000),
    n_facts=st.integers(0, 60),
    n_rules=st.integers(0, 30),
    n_warnings=st.integers(0, 10),
    n_episodes=st.integers(0, 30),
    length=st.integers(1, 200),
)
def test_the_block_never_exceeds_its_budget_and_keeps_rank_order(
    budget, n_facts, n_rules, n_warnings, n_episodes, length
):
    facts = hits("fact", n_facts, length=length)
    rules = hits("rule", n_rules, length=length, start=1000)
    warnings = hits("rule", n_warnings, length=length, maturity="anti_pattern", start=2000)
    episodes = hits("episode", n_episodes, length=length, start=3000)
    block = build(
        facts=facts,
        rules=rules,
        warnings=warnings,
        episodes=episodes,
        budget=budget,
        quotas=SectionQuotas(),
        count=words,
        now=NOW,
    )
    assert words([block.text])[0] == block.tokens <= budget
    assert all(n <= MAX_LINE_TOKENS for n in words(block.text.splitlines()))
    ranked = {"facts": facts, "rules": rules, "warnings": warnings, "episodes": episodes}
    for section, chosen in block.included.items():
        assert chosen == [str(h.id) for h in ranked[section][: len(chosen)]], section
    assert block.dropped == n_facts + n_rules + n_warnings + n_episodes - sum(map(len, block.included.values()))


def test_only_the_lines_a_block_reaches_are_made():
    """Fifty long episodes and room for a few: the rest are never made into lines (their contents never counted),
    yet they are counted as dropped."""
    seen: set[str] = set()

    def counting(texts: Sequence[str]) -> list[int]:
        seen.update(texts)
        return words(texts)

    episodes = hits("episode", 50, length=100)
    block = build(
        facts=[], rules=[], warnings=[], episodes=episodes, budget=400, quotas=SectionQuotas(), count=counting, now=NOW
    )
    shown = len(ids(block, "episodes"))
    assert 0 < shown < LINE_CHUNK
    assert block.dropped == 50 - shown
    made = {h.content for h in episodes} & seen
    assert made == {h.content for h in episodes[:LINE_CHUNK]}


@pytest.mark.parametrize("section", ["facts", "rules", "warnings", "episodes"])
def test_a_block_over_lazy_hits_makes_only_the_hits_it_shows(section):
    """memory_context's sections come as LazyHits: a candidate's Hit is made when the block reaches it. Rows past
    the first chunk here cannot be made at all (no content), and the block is still built and counts them."""
    kind = {"facts": "fact", "rules": "rule", "warnings": "rule", "episodes": "episode"}[section]
    confidence = {"confidence": 0.9, "decay_rate": 0.0, "last_confirmed_at": NOW}
    by_kind = {
        "fact": {"permanence": "stable", **confidence},
        "rule": {"maturity": "anti_pattern" if section == "warnings" else "candidate", "scope": "global", **confidence},
        "episode": {},
    }

    def row(i: int) -> dict:
        return (
            {
                "id": uuid.UUID(int=i),
                "relevance": 0.5,
                "created_at": NOW - timedelta(hours=i + 1),
                "occurred_at": None,
                "importance": 5.0,
                "content_tokens": None,
                **{name: None for name in ("session_id", "scope", "butler", "subject", "predicate", "permanence")},
                **{name: None for name in ("validity", "maturity", "effectiveness_score", "last_confirmed_at")},
                "last_referenced_at": NOW,
            }
            | by_kind[kind]
            | ({"content": " ".join([f"memory{i}"] * 100)} if i < LINE_CHUNK else {})
        )

    f = Filter(tenant_id="t", scopes=None, butlers=None, min_confidence=None, now=NOW)
    lazy = LazyHits([(1.0 - i / 100, kind, row(i)) for i in range(50)], f)
    sections = {"facts": [], "rules": [], "warnings": [], "episodes": []} | {section: lazy}
    block = build(**sections, budget=400, quotas=SectionQuotas(), count=words, now=NOW)
    assert 0 < len(block.shown) < LINE_CHUNK
    assert ids(block, section) == [str(uuid.UUID(int=i)) for i in range(len(block.shown))]
    assert block.dropped == 50 - len(block.shown)
    assert [h.id for h in lazy[:2]] == [uuid.UUID(int=0), uuid.UUID(int=1)]
    with pytest.raises(KeyError):
        lazy[-1]  # never made: its row has no content


def test_a_fact_line_names_its_subject_when_its_content_does_not():
    def fact(subject: str, content: str) -> Hit:
        [hit] = hits("fact", 1)
        return hit.model_copy(update={"subject": subject, "content": content})

    lines = [
        line_for(fact(subject, content), NOW)
        for subject, content in (
            ("maria", "lives in Porto"),
            ("Maria", "Maria lives in Porto"),
            ("user", "User's name is John"),
            ("user", "Allergic to peanuts"),
            ("Anna Lopez", "Anna Lopez is the user's wife"),
        )
    ]
    assert [line.removesuffix(" [stable, confirmed 12d ago]") for line in lines] == [
        "- maria: lives in Porto",
        "- Maria lives in Porto",
        "- User's name is John",
        "- user: Allergic to peanuts",
        "- Anna Lopez is the user's wife",
    ]
