"""LoCoMo's file read as the conversation benchmark's second set: turns, times, evidence ids, categories."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.bench import conversations as rm
from tests.conftest import ROOT

# One conversation in LoCoMo's own layout (a list of samples, as its data/locomo10.json): two sessions, listed out of
# order, both at the same stated minute; four questions: a temporal one, a multi-hop one whose evidence ids share one
# string, an adversarial one (category 5) and one whose evidence names no turn.
SAMPLE = ROOT / "tests" / "fixtures" / "locomo_sample.json"


def test_a_locomo_conversation_becomes_turns_in_session_order_and_queries_asked_after_it():
    [sample] = rm.locomo_samples(SAMPLE)
    persona = rm.load_locomo(sample)
    assert [t.key for t in persona.turns] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert persona.turns[1].content == "Ana: I adopted a dog yesterday."
    assert persona.turns[4].content == "Ana: We got a cat too! [shares a photo: a cat on a sofa]"
    start = datetime(2023, 5, 9, 10, tzinfo=timezone.utc)
    # strictly increasing times: the second session (same stated minute) starts an hour after the first
    assert persona.turns[0].occurred_at == start
    assert persona.turns[2].occurred_at == start + timedelta(hours=1)
    assert all(a.occurred_at < b.occurred_at for a, b in zip(persona.turns, persona.turns[1:]))
    assert len({t.session_id for t in persona.turns}) == 2
    # category 5 (adversarial) and a question whose evidence names no turn are left out
    assert [(q.category, q.evidence, q.sessions) for q in persona.queries] == [
        ("temporal", frozenset({(0, 1)}), frozenset({0})),
        ("multi-hop", frozenset({(0, 1), (1, 2)}), frozenset({0, 1})),
    ]
    # asked after the conversation: a session number past the last one, a time after every turn
    assert {q.session for q in persona.queries} == {2}
    assert all(q.occurred_at > persona.turns[-1].occurred_at for q in persona.queries)
