"""The context builder adds up token counts instead of tokenizing the block (shared.context.build): a line is its
annotation's count plus the content's count stored at write time. That holds only if the model's tokenizer is
additive over whitespace-joined pieces: checked here on arbitrary text, and on a block built both ways."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import SectionQuotas
from shared.context import MAX_LINE_TOKENS, _clip, build, content_tokens
from shared.embedding import get_token_counter
from shared.schemas import Hit

PIECES = st.lists(st.text(max_size=60), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(PIECES, st.sampled_from(["\n", " ", "\n\n"]))
def test_the_count_of_joined_pieces_is_the_sum_of_their_counts(pieces, separator):
    counter = get_token_counter()
    assert counter.count(separator.join(pieces)) == sum(counter.count_many(pieces))


def test_count_many_matches_count_one_by_one():
    counter = get_token_counter()
    texts = ["## Your Memory", "- Lives in Porto [stable, confirmed 2d ago]", "", "naïve café 東京 🙂"]
    assert counter.count_many(texts) == [counter.count(t) for t in texts]


def test_a_block_built_from_stored_counts_equals_one_built_by_counting():
    counter = get_token_counter()
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    contents = ["Lives in  Porto\nnear the river", "Drinks two espressos before noon", "naïve café 東京 🙂 x" * 20]
    facts = [
        Hit.model_construct(
            type="fact",
            id=uuid.UUID(int=i),
            content=c,
            score=1.0 - i / 10,
            relevance=1.0,
            created_at=now - timedelta(days=i),
            last_confirmed_at=now - timedelta(days=i),
            permanence="stable",
            importance=5.0,
            content_tokens=None,
        )
        for i, c in enumerate(contents)
    ]
    stored = [
        h.model_copy(update={"content_tokens": content_tokens([h.content], counter.count_many)[0]}) for h in facts
    ]
    blocks = [
        build(
            facts=hits,
            rules=[],
            warnings=[],
            episodes=[],
            budget=500,
            quotas=SectionQuotas(),
            count=counter.count_many,
            now=now,
        )
        for hits in (facts, stored)
    ]
    assert blocks[0] == blocks[1]
    assert counter.count(blocks[0].text) == blocks[0].tokens


WORD = st.text(st.characters(categories=("L", "N", "P", "S")), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(WORD, min_size=1, max_size=300), st.integers(min_value=3, max_value=MAX_LINE_TOKENS))
def test_a_clipped_line_is_its_longest_word_prefix_that_fits(words, limit):
    counter = get_token_counter()
    clipped = _clip(" ".join(words), counter.count_many, limit)
    kept = clipped.removesuffix(" …").split(" ")
    assert kept == words[: len(kept)]
    assert counter.count(clipped) <= limit or len(kept) == 1
    if len(kept) < len(words):
        assert counter.count(" ".join(words[: len(kept) + 1]) + " …") > limit
