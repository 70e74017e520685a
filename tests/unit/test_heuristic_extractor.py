"""The heuristic extractor on real sentences: which facts and rules it finds, and how it meets known memory."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_workers.extractors import HeuristicExtractor, build_extractor
from memory_workers.extractors.heuristic_patterns import KINDS
from shared.config import ConsolidationSettings
from shared.extraction import EpisodeIn, Extraction, ExtractionRequest, KnownFact, KnownRule, validate_extraction

T0 = datetime(2025, 2, 1, 8, 0, tzinfo=timezone.utc)
EXTRACTOR = HeuristicExtractor(ConsolidationSettings())


def _request(*contents: str, facts: tuple[KnownFact, ...] = (), rules: tuple[KnownRule, ...] = (),
             butler: str = "general") -> ExtractionRequest:
    episodes = [
        EpisodeIn(id=f"00000000-0000-4000-8000-{n:012d}", seq=n, butler=butler, content=text,
                  created_at=T0 + timedelta(minutes=n), importance=5)
        for n, text in enumerate(contents)
    ]
    return ExtractionRequest(tenant_id="default", butler=butler, episodes=episodes, facts=list(facts),
                             rules=list(rules))


def _extract(*contents: str, **known: object) -> Extraction:
    request = _request(*contents, **known)  # type: ignore[arg-type]
    extraction = EXTRACTOR.extract(request)
    assert validate_extraction(extraction.model_dump(), request) == extraction
    return extraction


def _known(predicate: str, content: str, subject: str = "user") -> KnownFact:
    return KnownFact(id=f"fact-{predicate}", subject=subject, predicate=predicate, content=content,
                     permanence=KINDS[_kind(predicate)].permanence, scope="global")


FACT_SENTENCES = [
    ("My name is John and I work at Acme Corp.", "user", "name", "permanent", "User's name is John"),
    ("The user is called Priya.", "user", "name", "permanent", "User's name is Priya"),
    ("hi, my name is maria", "user", "name", "permanent", "User's name is Maria"),
    ("User mentioned they are allergic to penicillin.", "user", "allergy_penicillin", "permanent",
     "User is allergic to penicillin"),
    ("I have a severe peanut allergy.", "user", "allergy_peanut", "permanent", "User is allergic to peanut"),
    ("User's birthday is on June 5, 1990.", "user", "birthday", "permanent", "User's birthday is June 5, 1990"),
    ("Maria's birthday is March 3.", "Maria", "birthday", "permanent", "Maria's birthday is March 3"),
    ("Maria is my sister and she lives in Madrid.", "Maria", "relationship_to_user", "permanent",
     "Maria is the user's sister"),
    ("My wife is called Anna.", "Anna", "relationship_to_user", "permanent", "Anna is the user's wife"),
    ("Tom is my boss.", "Tom", "social_relationship", "stable", "Tom is the user's boss"),
    ("I was diagnosed with type 2 diabetes in 2019.", "user", "medical_condition_type_2_diabetes", "permanent",
     "User was diagnosed with type 2 diabetes"),
    ("I am lactose intolerant, so no milk please.", "user", "dietary_restriction_lactose_intolerant", "stable",
     "User is lactose intolerant"),
    ("I'm on a keto diet these days.", "user", "dietary_restriction_keto", "stable", "User is on a keto diet"),
    ("I live in Berlin with my partner.", "user", "home_city", "stable", "User lives in Berlin"),
    ("We just moved to Lisbon last month!", "user", "home_city", "stable", "User lives in Lisbon"),
    ("User said they work for the city council.", "user", "employer", "stable", "User works at the city council"),
    ("I work at Google as a software engineer.", "user", "job", "stable", "User works as a software engineer"),
    ("I prefer window seats on long flights.", "user", "preference_window_seats", "stable",
     "User prefers window seats on long flights"),
    ("My favourite ice cream flavor is pistachio.", "user", "favorite_ice_cream_flavor", "stable",
     "User's favorite ice cream flavor is pistachio"),
    ("User loves hiking.", "user", "likes_hiking", "standard", "User likes hiking"),
    ("I can't stand cilantro.", "user", "dislikes_cilantro", "standard", "User dislikes cilantro"),
    ("I'm currently reading Dune.", "user", "current_reading", "standard", "User is currently reading Dune"),
    ("I just started learning Spanish.", "user", "current_learning", "standard",
     "User is currently learning Spanish"),
    ("I'm working on a birdhouse for the garden.", "user", "current_project", "standard",
     "User is currently working on a birdhouse"),
    ("I'm planning to visit Rome next week.", "user", "plan_visit_rome", "volatile",
     "User is planning to visit Rome next week"),
    ("I will see the dentist tomorrow.", "user", "plan_see_dentist", "volatile", "User will see the dentist tomorrow"),
    ("I had ramen for dinner.", "user", "recent_meal", "ephemeral", "User had ramen for dinner"),
    ("Today I ate a huge burrito.", "user", "recent_meal", "ephemeral", "User ate a huge burrito today"),
]


@pytest.mark.parametrize(("sentence", "subject", "predicate", "permanence", "content"), FACT_SENTENCES)
def test_fact_sentences(sentence, subject, predicate, permanence, content):
    extraction = _extract(sentence)
    found = {(f.subject, f.predicate): f for f in extraction.facts}
    fact = found[(subject, predicate)]
    assert (fact.permanence, fact.content) == (permanence, content)
    assert fact.source_episode_ids == ["00000000-0000-4000-8000-000000000000"]
    assert fact.importance == KINDS[_kind(predicate)].importance


def _kind(predicate: str) -> str:
    """The KINDS entry a predicate comes from: itself, or the longest prefix ('allergy' for 'allergy_cats')."""
    return max((k for k in KINDS if predicate == k or predicate.startswith(k + "_")), key=len)


def test_a_list_of_allergies_becomes_one_fact_each():
    extraction = _extract("User mentioned they are allergic to peanuts, shellfish and penicillin.")
    assert [f.predicate for f in extraction.facts] == ["allergy_peanuts", "allergy_shellfish", "allergy_penicillin"]


RULE_SENTENCES = [
    ("User said: never call after 9pm.", "Never call after 9pm", "global"),
    ("Always confirm before sending outbound messages.", "Always confirm before sending outbound messages", "global"),
    ("General butler created a recipe entity, user specified ingredients should always be listed, not prose",
     "Ingredients should always be listed, not prose", "global"),
    ("User asked me to always CC his assistant on invoices.", "Always CC his assistant on invoices", "global"),
    ("Don't schedule meetings before 10am.", "Don't schedule meetings before 10am", "general"),
    ("Please make sure to attach the agenda.", "Make sure to attach the agenda", "general"),
    ("For the recipes collection, format ingredients as a bulleted list.",
     "For the recipes collection, format ingredients as a bulleted list", "general"),
    ("From now on, send summaries as bullet points.", "From now on, send summaries as bullet points", "general"),
    ("User prefers dark mode when working at night.", "User prefers dark mode when working at night", "general"),
    ("Messages to clients should be kept short.", "Messages to clients should be kept short", "general"),
]


@pytest.mark.parametrize(("sentence", "content", "scope"), RULE_SENTENCES)
def test_rule_sentences(sentence, content, scope):
    [rule] = _extract(sentence).rules
    assert (rule.content, rule.scope) == (content, scope)


def test_a_conditional_preference_is_a_rule_not_a_fact():
    extraction = _extract("User prefers dark mode when working at night.")
    assert extraction.facts == [] and len(extraction.rules) == 1


@pytest.mark.parametrize(
    "sentence",
    [
        "The weather was nice today.",
        "Thanks, that was helpful!",
        "What is my name?",
        "Can you always remind me of this?",
        "I think the meeting went well.",
        "I should really go to bed.",
        "I'd like to book a table for two.",
        "I like that idea.",
        "I'm going to the gym.",
        "I am not allergic to cats.",
        "I don't live in Berlin anymore.",
        "",
    ],
)
def test_small_talk_questions_and_negations_yield_nothing(sentence):
    assert _extract(sentence) == Extraction()


# ---- meeting known memory ------------------------------------------------------------------------------------


def test_a_known_fact_said_again_is_confirmed_not_repeated():
    known = _known("home_city", "user lives in berlin")
    extraction = _extract("Just so you know, I live in Berlin.", "I live in Berlin!", facts=(known,))
    assert extraction.facts == []
    [confirmation] = extraction.confirmations
    assert confirmation.fact_id == known.id and len(confirmation.source_episode_ids) == 2


def test_a_new_value_supersedes_the_known_fact():
    known = _known("home_city", "User lives in Berlin")
    [fact] = _extract("I moved to Paris.", facts=(known,)).facts
    assert (fact.predicate, fact.content, fact.supersedes_fact_id) == ("home_city", "User lives in Paris", known.id)


def test_liking_what_was_disliked_supersedes_the_dislike():
    known = _known("dislikes_cilantro", "User dislikes cilantro")
    [fact] = _extract("Turns out I love cilantro.", facts=(known,)).facts
    assert (fact.predicate, fact.supersedes_fact_id) == ("likes_cilantro", known.id)


def test_a_retraction_contradicts_the_known_fact():
    home, allergy = _known("home_city", "User lives in Berlin"), _known("allergy_cats", "User is allergic to cats")
    extraction = _extract("I don't live in Berlin anymore.", "I'm no longer allergic to cats.", facts=(home, allergy))
    assert [c.fact_id for c in extraction.contradictions] == [home.id, allergy.id]
    assert extraction.contradictions[0].note == "Episode says: I don't live in Berlin anymore."
    assert extraction.facts == []


def test_a_known_rule_said_again_is_confirmed():
    rule = KnownRule(id="rule-1", content="Never call after 9pm.", scope="global", maturity="candidate")
    extraction = _extract("User said: never call after 9pm.", rules=(rule,))
    assert extraction.rules == [] and [c.rule_id for c in extraction.confirmations] == ["rule-1"]


def test_the_latest_episode_wins_a_slot_within_one_batch():
    [fact] = _extract("I live in Berlin.", "Update: I moved to Paris.").facts
    assert fact.content == "User lives in Paris"
    assert fact.source_episode_ids == ["00000000-0000-4000-8000-000000000001"]


def test_the_same_fact_in_two_episodes_is_one_fact_with_both_sources():
    [fact] = _extract("My name is John.", "As I said, my name is John.").facts
    assert len(fact.source_episode_ids) == 2


def test_extraction_is_deterministic():
    text = " ".join(s for s, *_ in FACT_SENTENCES) + " " + " ".join(s for s, *_ in RULE_SENTENCES)
    assert EXTRACTOR.extract(_request(text, text)) == EXTRACTOR.extract(_request(text, text))
    fresh = HeuristicExtractor()
    assert EXTRACTOR.extract(_request(text)).model_dump_json() == fresh.extract(_request(text)).model_dump_json()


def test_build_extractor_returns_the_heuristic_one_by_default():
    assert build_extractor(ConsolidationSettings()).name == "heuristic"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=400), min_size=1, max_size=4))
def test_any_text_yields_a_valid_extraction(contents):
    request = _request(*contents)
    extraction = EXTRACTOR.extract(request)
    assert validate_extraction(extraction.model_dump(), request) == extraction


_WORDS = st.sampled_from(
    ["I", "my", "user", "User's", "name", "is", "am", "allergic", "to", "live", "in", "always", "never", "prefer",
     "when", "should", "Maria's", "birthday", "Berlin", "and", ",", ".", "?", "don't", "like", "moved", "said:",
     "currently", "reading", "planning", "will", "tomorrow", "had", "for", "dinner", "favorite", "color", "no",
     "longer"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORDS, max_size=60).map(" ".join))
def test_pattern_soup_yields_a_valid_extraction(text):
    request = _request(text, facts=(_known("home_city", "User lives in Berlin"),))
    extraction = EXTRACTOR.extract(request)
    assert validate_extraction(extraction.model_dump(), request) == extraction
