"""Query intent routing (shared.intent): accuracy on a labelled set of questions written for it, and the weights."""

from __future__ import annotations

from collections import Counter

from shared.intent import classify, weight

# Written for this test (not taken from any benchmark): how butlers ask, with the intent a reader would name.
LABELLED = [
    ("What is my name again?", "identity"),
    ("How old am I?", "identity"),
    ("Where do I live now?", "identity"),
    ("What do I do for work?", "identity"),
    ("Am I allergic to anything?", "identity"),
    ("What's my wife's name?", "identity"),
    ("Where did I grow up?", "identity"),
    ("What is my blood type?", "identity"),
    ("When is my birthday?", "identity"),
    ("Who am I talking to you as?", "identity"),
    ("Do I like spicy food?", "preference"),
    ("What's my favourite band?", "preference"),
    ("Which airline do I prefer?", "preference"),
    ("What kind of books do I enjoy?", "preference"),
    ("Would I enjoy a jazz concert?", "preference"),
    ("Can you recommend a restaurant for me?", "preference"),
    ("What's my favorite coffee order?", "preference"),
    ("Do I prefer window or aisle seats?", "preference"),
    ("Suggest a weekend activity I'd like", "preference"),
    ("Do I hate early meetings?", "preference"),
    ("How do I reset the router?", "procedure"),
    ("How should I format the weekly report?", "procedure"),
    ("What are the steps to file an expense?", "procedure"),
    ("How to book the meeting room?", "procedure"),
    ("What should I do before a dentist visit?", "procedure"),
    ("Remind me how to water the orchids", "procedure"),
    ("What's the process for renewing my passport?", "procedure"),
    ("Best way to reach the office by bike?", "procedure"),
    ("How can we split the grocery bill?", "procedure"),
    ("Any instructions for feeding the cat?", "procedure"),
    ("When did I last see the doctor?", "event"),
    ("What happened at the meeting yesterday?", "event"),
    ("Did I go to the gym last week?", "event"),
    ("What did we decide 3 days ago?", "event"),
    ("When did we visit Porto?", "event"),
    ("How long ago did I start the new job?", "event"),
    ("What happened with the landlord?", "event"),
    ("Last time I ordered pizza, which place was it?", "event"),
    ("Summarise the project status", "general"),
    ("Tell me about the budget", "general"),
    ("Any notes on the Lisbon trip?", "general"),
    ("What's on the agenda?", "general"),
]


def test_the_classifier_names_the_intent_of_most_questions_and_says_how_many():
    predicted = [(classify(q), label) for q, label in LABELLED]
    accuracy = sum(p == label for p, label in predicted) / len(predicted)
    per_label = Counter(label for _, label in LABELLED)
    right = Counter(label for p, label in predicted if p == label)
    print(
        f"intent accuracy {accuracy:.3f} on {len(LABELLED)} questions; "
        + ", ".join(f"{k} {right[k]}/{n}" for k, n in sorted(per_label.items()))
    )
    assert accuracy >= 0.85
    assert all(right[k] >= n * 0.7 for k, n in per_label.items())


def test_the_weights_nudge_the_right_type_and_leave_general_alone():
    assert weight("identity", kind="fact", permanence="permanent") > weight("identity", kind="rule", permanence=None)
    assert weight("procedure", kind="rule", permanence=None) > weight("procedure", kind="fact", permanence="standard")
    assert (
        weight("general", kind="fact", permanence="permanent") == weight("general", kind="rule", permanence=None) == 1
    )
    assert all(
        0.7 <= weight(i, kind=k, permanence=p) <= 1.3
        for i in ("identity", "preference", "procedure", "event", "general")
        for k in ("fact", "rule", "episode")
        for p in (None, "permanent", "ephemeral")
    )
