"""The heuristic extractor on real sentences: which facts and rules it finds, and how it meets known memory."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_workers.extractors import HeuristicExtractor, build_extractor
from shared.config import ConsolidationSettings
from shared.extraction import EpisodeIn, Extraction, ExtractionRequest, KnownFact, KnownRule, validate_extraction
from shared.vocabulary import PREDICATES, base_predicate

T0 = datetime(2025, 2, 1, 8, 0, tzinfo=timezone.utc)
EXTRACTOR = HeuristicExtractor(ConsolidationSettings())


def _request(
    *contents: str, facts: tuple[KnownFact, ...] = (), rules: tuple[KnownRule, ...] = (), butler: str = "general"
) -> ExtractionRequest:
    episodes = [
        EpisodeIn(
            id=f"00000000-0000-4000-8000-{n:012d}",
            seq=n,
            butler=butler,
            content=text,
            created_at=T0 + timedelta(minutes=n),
            importance=5,
        )
        for n, text in enumerate(contents)
    ]
    return ExtractionRequest(
        tenant_id="default", butler=butler, episodes=episodes, facts=list(facts), rules=list(rules)
    )


def _extract(*contents: str, **known: object) -> Extraction:
    request = _request(*contents, **known)  # type: ignore[arg-type]
    extraction = EXTRACTOR.extract(request)
    assert validate_extraction(extraction.model_dump(), request) == extraction
    return extraction


def _known(predicate: str, content: str, subject: str = "user") -> KnownFact:
    return KnownFact(
        id=f"fact-{predicate}",
        subject=subject,
        predicate=predicate,
        content=content,
        permanence=PREDICATES[base_predicate(predicate)].permanence,
        scope="general",
    )


# (episode, subject, stored predicate, permanence, content)
FACT_SENTENCES = [
    ("My name is John and I work at Acme Corp.", "user", "name", "permanent", "User's name is John"),
    ("My name is John and I work at Acme Corp.", "user", "works_at", "stable", "User works at Acme Corp"),
    ("The user is called Priya.", "user", "name", "permanent", "User's name is Priya"),
    ("hi, my name is maria", "user", "name", "permanent", "User's name is Maria"),
    (
        "User mentioned they are allergic to penicillin.",
        "user",
        "allergic_to_penicillin",
        "permanent",
        "User is allergic to penicillin",
    ),
    ("I have a severe peanut allergy.", "user", "allergic_to_peanut", "permanent", "User is allergic to peanut"),
    ("User's birthday is on June 5, 1990.", "user", "birthday", "permanent", "User's birthday is June 5, 1990"),
    ("Maria's birthday is March 3.", "Maria", "birthday", "permanent", "Maria's birthday is March 3"),
    ("Maria is my sister and she lives in Madrid.", "Maria", "relationship", "permanent", "Maria is the user's sister"),
    ("Maria is my sister and she lives in Madrid.", "Maria", "lives_in", "stable", "Maria lives in Madrid"),
    ("My wife is called Anna.", "Anna", "relationship", "permanent", "Anna is the user's wife"),
    ("Tom is my boss.", "Tom", "relationship", "stable", "Tom is the user's boss"),
    (
        "I was diagnosed with type 2 diabetes in 2019.",
        "user",
        "medical_condition_type_2_diabetes",
        "permanent",
        "User has type 2 diabetes",
    ),
    (
        "I am lactose intolerant, so no milk please.",
        "user",
        "diet_lactose_intolerant",
        "stable",
        "User is lactose intolerant",
    ),
    ("I'm on a keto diet these days.", "user", "diet_keto", "stable", "User is on a keto diet"),
    ("I live in Berlin with my partner.", "user", "lives_in", "stable", "User lives in Berlin"),
    ("We just moved to Lisbon last month!", "user", "lives_in", "stable", "User lives in Lisbon"),
    ("User said they work for the city council.", "user", "works_at", "stable", "User works at the city council"),
    ("I work at Google as a software engineer.", "user", "job", "stable", "User works as a software engineer"),
    (
        "I prefer window seats on long flights.",
        "user",
        "prefers_window_seats",
        "stable",
        "User prefers window seats on long flights",
    ),
    (
        "My favourite ice cream flavor is pistachio.",
        "user",
        "favorite_ice_cream_flavor",
        "stable",
        "User's favorite ice cream flavor is pistachio",
    ),
    ("User loves hiking.", "user", "likes_hiking", "standard", "User likes hiking"),
    ("I can't stand cilantro.", "user", "dislikes_cilantro", "standard", "User dislikes cilantro"),
    ("I'm currently reading Dune.", "user", "reading", "standard", "User is reading Dune"),
    ("I just started learning Spanish.", "user", "learning", "standard", "User is learning Spanish"),
    ("I'm working on a birdhouse for the garden.", "user", "working_on", "standard", "User is working on a birdhouse"),
    (
        "I'm planning to visit Rome next week.",
        "user",
        "plans_visit_rome",
        "volatile",
        "User is planning to visit Rome next week",
    ),
    # speakers: a named turn speaks for its speaker; an assistant confirmation restates the user
    ("Bob: I moved to Lisbon in May.", "Bob", "lives_in", "stable", "Bob lives in Lisbon"),
    ("Maria: my husband Tom and I are back. He's a nurse.", "Tom", "job", "stable", "Tom is a nurse"),
    (
        "Maria: my husband Tom and I are back. He's a nurse.",
        "Tom",
        "relationship",
        "permanent",
        "Tom is Maria's husband",
    ),
    (
        "Assistant: Got it - you're allergic to peanuts, I'll keep that in mind.",
        "user",
        "allergic_to_peanuts",
        "permanent",
        "User is allergic to peanuts",
    ),
    ("User: I speak Portuguese and Spanish.", "user", "speaks_portuguese", "stable", "User speaks Portuguese"),
    # a third-person summary, its pronouns and its left-out subjects
    (
        "Session summary: Daniel came by to plan meals. He is lactose intolerant, moved to Berlin last year and "
        "works at Siemens.",
        "Daniel",
        "works_at",
        "stable",
        "Daniel works at Siemens",
    ),
    (
        "Session summary: Daniel came by to plan meals. He is lactose intolerant, moved to Berlin last year and "
        "works at Siemens.",
        "Daniel",
        "lives_in",
        "stable",
        "Daniel lives in Berlin",
    ),
    (
        "Session summary: Daniel came by to plan meals. He is lactose intolerant, moved to Berlin last year and "
        "works at Siemens.",
        "Daniel",
        "diet_lactose_intolerant",
        "stable",
        "Daniel is lactose intolerant",
    ),
    ("My sister Ana told me she works at Siemens.", "Ana", "works_at", "stable", "Ana works at Siemens"),
    ("We adopted a dog named Rex.", "user", "has_pet_dog_named_rex", "stable", "User has a dog named Rex"),
    # seed 000's first example episode
    (
        "User asked health butler to log weight 75kg, mentioned they started a new diet last week",
        "user",
        "diet_new",
        "stable",
        "User started a new diet",
    ),
]


@pytest.mark.parametrize(("episode", "subject", "predicate", "permanence", "content"), FACT_SENTENCES)
def test_fact_sentences(episode, subject, predicate, permanence, content):
    extraction = _extract(episode)
    found = {(f.subject, f.predicate): f for f in extraction.facts}
    fact = found[(subject, predicate)]
    assert (fact.permanence, fact.content) == (permanence, content)
    assert fact.source_episode_ids == ["00000000-0000-4000-8000-000000000000"]
    assert fact.importance == PREDICATES[base_predicate(predicate)].importance
    assert fact.scope == "general"  # the batch butler's, never global by default


def test_every_fact_names_its_subject_and_uses_the_vocabulary():
    for episode, *_ in FACT_SENTENCES:
        for fact in _extract(episode).facts:
            assert base_predicate(fact.predicate) in PREDICATES
            assert ("User" if fact.subject == "user" else fact.subject) in fact.content


def test_a_list_of_allergies_becomes_one_fact_each():
    extraction = _extract("User mentioned they are allergic to peanuts, shellfish and penicillin.")
    assert [f.predicate for f in extraction.facts] == [
        "allergic_to_peanuts",
        "allergic_to_shellfish",
        "allergic_to_penicillin",
    ]


RULE_SENTENCES = [
    ("User said: never call after 9pm.", "Never call after 9pm"),
    ("Always confirm before sending outbound messages.", "Always confirm before sending outbound messages"),
    (
        "General butler created a recipe entity, user specified ingredients should always be listed, not prose",
        "Ingredients should always be listed, not prose",
    ),
    ("User asked me to always CC his assistant on invoices.", "Always CC his assistant on invoices"),
    ("Don't schedule meetings before 10am.", "Don't schedule meetings before 10am"),
    (
        "For the recipes collection, format ingredients as a bulleted list.",
        "For the recipes collection, format ingredients as a bulleted list",
    ),
    ("From now on, send summaries as bullet points.", "From now on, send summaries as bullet points"),
    ("User prefers dark mode when working at night.", "User prefers dark mode when working at night"),
    ("Messages to clients should be kept short.", "Messages to clients should be kept short"),
    # seed 000's second example episode: an edit shows a preference
    (
        "Relationship butler drafted a birthday message for Maria, user edited the tone to be more casual",
        "User prefers the tone to be more casual",
    ),
]


@pytest.mark.parametrize(("sentence", "content"), RULE_SENTENCES)
def test_rule_sentences(sentence, content):
    [rule] = _extract(sentence).rules
    assert (rule.content, rule.scope) == (content, "general")


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
        # the cases: a team is not a hometown, a reminder is not a rule, fragments are not likes
        "I'm from the support team.",
        "Don't forget: the meeting moved to 3pm",
        "Remind me tomorrow to call the bank.",
        "Please make sure to attach the agenda.",
        "I love the power you were talking about.",
        "I love it 'cause nature brings such peace.",
        "I love to.",
        "Assistant: Lisbon is lovely in May. You should visit the Alfama.",
        "If I moved to Paris, I would learn French.",
        "Do you think I should learn Spanish?",
        "I'd love to live in Japan one day.",
        "Don't worry about it.",
    ],
)
def test_small_talk_questions_and_negations_yield_nothing(sentence):
    assert _extract(sentence) == Extraction()


# ---- meeting known memory ------------------------------------------------------------------------------------


def test_a_known_fact_said_again_is_confirmed_not_repeated():
    known = _known("lives_in", "user lives in berlin")
    extraction = _extract("Just so you know, I live in Berlin.", "I live in Berlin!", facts=(known,))
    assert extraction.facts == []
    [confirmation] = extraction.confirmations
    assert confirmation.fact_id == known.id and len(confirmation.source_episode_ids) == 2


def test_a_new_value_supersedes_the_known_fact():
    known = _known("lives_in", "User lives in Berlin")
    [fact] = _extract("I moved to Paris.", facts=(known,)).facts
    assert (fact.predicate, fact.content, fact.supersedes_fact_id) == ("lives_in", "User lives in Paris", known.id)


def test_liking_what_was_disliked_supersedes_the_dislike():
    known = _known("dislikes_cilantro", "User dislikes cilantro")
    [fact] = _extract("Turns out I love cilantro.", facts=(known,)).facts
    assert (fact.predicate, fact.supersedes_fact_id) == ("likes_cilantro", known.id)


def test_a_retraction_contradicts_the_known_fact():
    home, allergy = _known("lives_in", "User lives in Berlin"), _known("allergic_to_cats", "User is allergic to cats")
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
    [
        "I",
        "my",
        "user",
        "User's",
        "name",
        "is",
        "am",
        "allergic",
        "to",
        "live",
        "in",
        "always",
        "never",
        "prefer",
        "when",
        "should",
        "Maria's",
        "birthday",
        "Berlin",
        "and",
        ",",
        ".",
        "?",
        "don't",
        "like",
        "moved",
        "said:",
        "currently",
        "reading",
        "planning",
        "will",
        "tomorrow",
        "had",
        "for",
        "dinner",
        "favorite",
        "color",
        "no",
        "longer",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORDS, max_size=60).map(" ".join))
def test_pattern_soup_yields_a_valid_extraction(text):
    request = _request(text, facts=(_known("lives_in", "User lives in Berlin"),))
    extraction = EXTRACTOR.extract(request)
    assert validate_extraction(extraction.model_dump(), request) == extraction
