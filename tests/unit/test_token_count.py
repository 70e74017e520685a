"""The context builder reports a block's tokens as the sum of its lines' counts (shared.context.build): that holds
only if the model's tokenizer is additive over whitespace-joined pieces. Checked here on arbitrary text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.embedding import get_token_counter

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
