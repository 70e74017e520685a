"""The extraction contract: prompt, schema and the validating gate every extractor's answer passes."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import ExtractionError
from shared.consolidation_plan import same_meaning
from shared.extraction import (
    EXTRACTION_JSON_SCHEMA,
    EpisodeIn,
    Extraction,
    ExtractionRequest,
    KnownFact,
    KnownRule,
    build_prompt,
    validate_extraction,
)

E1, E2 = "0b5f4bde-6f36-4e0c-9a3d-1f2e3d4c5b01", "0b5f4bde-6f36-4e0c-9a3d-1f2e3d4c5b02"
F1, R1 = "7d1c9e2a-0000-4000-8000-00000000f001", "7d1c9e2a-0000-4000-8000-00000000a001"


def _request(**changes: Any) -> ExtractionRequest:
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    values: dict[str, Any] = {
        "tenant_id": "default",
        "butler": "health",
        "episodes": [
            EpisodeIn(
                id=E1,
                seq=1,
                butler="health",
                content="User logged weight 75kg.\nStarted a new diet.",
                created_at=at,
                importance=5,
            ),
            EpisodeIn(id=E2, seq=2, butler="health", content="Always log weight in kg.", created_at=at, importance=7.5),
        ],
        "facts": [
            KnownFact(
                id=F1,
                subject="user",
                predicate="name",
                content="User's name is John",
                permanence="permanent",
                scope="global",
            )
        ],
        "rules": [KnownRule(id=R1, content="Confirm before sending messages", scope="global", maturity="candidate")],
    }
    return ExtractionRequest(**{**values, **changes})


def _fact(**changes: Any) -> dict[str, Any]:
    return {
        "subject": "user",
        "predicate": "weight",
        "content": "User weighs 75kg",
        "permanence": "volatile",
        "importance": 4,
        "scope": "global",
        "source_episode_ids": [E1],
        "supersedes_fact_id": None,
        **changes,
    }


def _answer(**sections: Any) -> dict[str, Any]:
    return {"facts": [], "rules": [], "confirmations": [], "contradictions": [], **sections}


def _raises(raw: Any, match: str) -> ExtractionError:
    with pytest.raises(ExtractionError, match=match) as info:
        validate_extraction(raw, _request())
    return info.value


# ---- prompt ------------------------------------------------------------------------------------------------


def test_prompt_carries_the_seed_instructions_the_ids_and_the_schema():
    prompt = build_prompt(_request())
    assert prompt.startswith("Review these recent episodes from the health butler")
    for must in (
        "a) NEW FACTS",
        "- allergic_to (set): an allergy; permanent",
        "names its subject",
        'scope: always "health"',
        "reminders, deadlines and one-off instructions",
        "b) UPDATED FACTS",
        "c) NEW RULES",
        "d) CONFIRMATIONS",
        "Do NOT extract:",
        "- ephemeral: what happened today",
        "Existing facts for reference:",
        "Existing rules for reference:",
        "Episodes to process:",
        "Answer with ONLY a JSON object",
    ):
        assert must in prompt
    assert f"- fact {F1}: user | name | User's name is John (permanence: permanent, scope: global)" in prompt
    assert f"- rule {R1}: Confirm before sending messages (scope: global, maturity: candidate)" in prompt
    first = f"- episode {E1} (at 2025-01-02T03:04:05+00:00, importance 5):\n    User logged weight 75kg.\n    Started"
    assert first in prompt
    assert f"- episode {E2} (at 2025-01-02T03:04:05+00:00, importance 7.5):\n    Always log weight in kg." in prompt
    assert json.dumps(EXTRACTION_JSON_SCHEMA, sort_keys=True, separators=(",", ":")) in prompt


def test_prompt_is_deterministic_and_says_none_when_nothing_is_known():
    request = _request(facts=[], rules=[])
    assert build_prompt(request) == build_prompt(request.model_copy(deep=True))
    assert "Existing facts for reference:\n(none)" in build_prompt(request)
    assert "Existing rules for reference:\n(none)" in build_prompt(request)


def test_schema_is_strict_mode_compatible():
    # OpenAI strict mode: every object closed and every property required; no defaults anywhere.
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            assert "default" not in node
            if "properties" in node:
                assert node["additionalProperties"] is False
                assert sorted(node["required"]) == sorted(node["properties"])
            for key, value in node.items():
                walk(value if key != "properties" else list(value.values()))
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(EXTRACTION_JSON_SCHEMA)
    assert set(EXTRACTION_JSON_SCHEMA["$defs"]) == {"NewFact", "NewRule", "Confirmation", "Contradiction"}


# ---- the gate: accepted shapes -------------------------------------------------------------------------------


def test_valid_answer_is_accepted_as_dict_string_or_fenced_text():
    answer = _answer(facts=[_fact()], confirmations=[{"fact_id": F1, "rule_id": None, "source_episode_ids": [E2]}])
    expected = validate_extraction(answer, _request())
    assert expected.facts[0].content == "User weighs 75kg" and expected.confirmations[0].fact_id == F1
    assert validate_extraction(json.dumps(answer), _request()) == expected
    assert validate_extraction(f"```json\n{json.dumps(answer, indent=2)}\n```", _request()) == expected
    assert validate_extraction(f"Here you go:\n```\n{json.dumps(answer)}\n```\nAnything else?", _request()) == expected
    assert validate_extraction(f"Result: {json.dumps(answer)} -- end", _request()) == expected


def test_missing_sections_and_defaults_are_filled():
    extraction = validate_extraction(
        '{"facts": [{"subject": "user", "predicate": "Home City", "content": "Lisbon", '
        f'"permanence": "stable", "source_episode_ids": ["{E1}"]}}]}}',
        _request(),
    )
    [fact] = extraction.facts
    assert (fact.predicate, fact.importance, fact.scope, fact.supersedes_fact_id) == ("home_city", 5, "global", None)
    assert extraction.rules == [] and validate_extraction("{}", _request()) == Extraction()


def test_ids_are_matched_case_insensitively_and_rewritten_to_the_request_spelling():
    answer = _answer(facts=[_fact(source_episode_ids=[E1.upper()], supersedes_fact_id=F1.upper())])
    [fact] = validate_extraction(answer, _request()).facts
    assert fact.source_episode_ids == [E1] and fact.supersedes_fact_id == F1


def test_identical_facts_are_merged_and_rule_references_follow_them():
    answer = _answer(
        facts=[
            _fact(),
            _fact(predicate="mood", content="Tired"),
            _fact(content=" user WEIGHS  75kg", source_episode_ids=[E2]),
        ],
        rules=[
            {
                "content": "Log weight in kg",
                "scope": "health",
                "source_episode_ids": [E2],
                "supporting_fact_refs": ["facts[2]", "facts[1]", F1],
            }
        ],
    )
    extraction = validate_extraction(answer, _request())
    assert [f.predicate for f in extraction.facts] == ["weight", "mood"]
    assert extraction.facts[0].source_episode_ids == [E1, E2]
    assert extraction.rules[0].supporting_fact_refs == ["facts[0]", "facts[1]", F1]


def test_duplicate_rules_and_confirmations_collapse():
    answer = _answer(
        rules=[
            {"content": "Log weight in kg", "scope": "health", "source_episode_ids": [E1]},
            {"content": "log weight in KG", "scope": "health", "source_episode_ids": [E2]},
        ],
        confirmations=[{"rule_id": R1, "source_episode_ids": [E1]}, {"rule_id": R1, "source_episode_ids": [E1, E2]}],
    )
    extraction = validate_extraction(answer, _request())
    assert [(r.content, r.source_episode_ids) for r in extraction.rules] == [("Log weight in kg", [E1, E2])]
    assert [(c.rule_id, c.source_episode_ids) for c in extraction.confirmations] == [(R1, [E1, E2])]


# ---- the gate: refusals name the field -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("", "not JSON"),
        ("The user seems happy.", "not JSON.*'The user seems happy.'"),
        ("[1, 2]", "must be a JSON object, got list"),
        ('{"facts": [}', "not JSON"),
    ],
)
def test_text_that_is_not_a_json_object_is_refused(raw, match):
    _raises(raw, match)


@pytest.mark.parametrize(
    ("answer", "path"),
    [
        (_answer(facts=[_fact(permanence="forever")]), "facts[0].permanence"),
        (_answer(facts=[_fact(importance=11)]), "facts[0].importance"),
        (_answer(facts=[_fact(subject="")]), "facts[0].subject"),
        (_answer(facts=[_fact(content="x" * 2001)]), "facts[0].content"),
        (_answer(facts=[_fact(source_episode_ids=[])]), "facts[0].source_episode_ids"),
        (_answer(facts=[_fact(colour="red")]), "facts[0].colour"),
        (_answer(rules=[{"content": "Be kind", "source_episode_ids": [E1], "why": "x"}]), "rules[0].why"),
        (_answer(confirmations=[{"fact_id": F1, "rule_id": R1, "source_episode_ids": []}]), "confirmations[0]"),
        (_answer(confirmations=[{"source_episode_ids": [E1]}]), "confirmations[0]"),
        ({**_answer(), "notes": "hi"}, "notes"),
    ],
)
def test_schema_violations_name_the_field(answer, path):
    error = _raises(answer, "does not match the schema")
    assert error.field == path and path in error.message


@pytest.mark.parametrize(
    ("answer", "path", "kind"),
    [
        (_answer(facts=[_fact(source_episode_ids=[E1, "e-404"])]), "facts[0].source_episode_ids[1]", "episode"),
        (_answer(facts=[_fact(supersedes_fact_id="f-404")]), "facts[0].supersedes_fact_id", "fact"),
        (
            _answer(rules=[{"content": "Be kind", "source_episode_ids": ["e-404"]}]),
            "rules[0].source_episode_ids[0]",
            "episode",
        ),
        (
            _answer(rules=[{"content": "Be kind", "source_episode_ids": [E1], "supporting_fact_refs": ["f-404"]}]),
            "rules[0].supporting_fact_refs[0]",
            "fact",
        ),
        (_answer(confirmations=[{"fact_id": "f-404", "source_episode_ids": [E1]}]), "confirmations[0].fact_id", "fact"),
        (_answer(confirmations=[{"rule_id": F1, "source_episode_ids": [E1]}]), "confirmations[0].rule_id", "rule"),
        (_answer(contradictions=[{"fact_id": R1, "source_episode_ids": [E1]}]), "contradictions[0].fact_id", "fact"),
        (
            _answer(contradictions=[{"fact_id": F1, "source_episode_ids": ["e-404"]}]),
            "contradictions[0].source_episode_ids[0]",
            "episode",
        ),
    ],
)
def test_unknown_references_name_the_field(answer, path, kind):
    error = _raises(answer, rf"unknown {kind} id")
    assert error.field == path and error.message.startswith(path)


def test_a_new_fact_reference_past_the_end_is_refused():
    answer = _answer(
        facts=[_fact()],
        rules=[{"content": "Weigh daily", "source_episode_ids": [E1], "supporting_fact_refs": ["facts[1]"]}],
    )
    error = _raises(answer, r"'facts\[1\]' points past the 1 new facts")
    assert error.field == "rules[0].supporting_fact_refs[0]" and error.retryable


@given(st.text(max_size=300))
def test_any_text_is_either_accepted_or_refused_with_an_extraction_error(text):
    try:
        assert isinstance(validate_extraction(text, _request()), Extraction)
    except ExtractionError as exc:
        assert exc.message


# ---- matching known memory by meaning ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("new", "known", "same"),
    [
        ("Always use metric units in every answer", "Always answer me in metric units", True),
        ("Never call after 9 pm, ever", "Never call after 9pm", True),
        ("Never call before 9am", "Never call after 9pm", False),  # another time
        ("Always answer me in Spanish", "Always answer me in French", False),  # another name
        ("Always add a summary", "Never add a summary", False),  # the other polarity
    ],
)
def test_a_rule_means_the_same_only_with_the_same_numbers_names_and_polarity(new, known, same):
    assert same_meaning(new, known, cosine=0.9, threshold=0.75) is same
    assert same_meaning(new, known, cosine=0.7, threshold=0.75) is False  # and close enough in meaning
