"""The embedded, offline consolidation extractor: pattern matching over plain English sentences.

It does not understand text. It splits each episode into sentences and matches the phrasings listed in
:mod:`heuristic_patterns` ("my name is X", "I am allergic to X", "always ..."): anything said another way
is missed, and a sentence that only looks like a pattern can be misread. It is deterministic and needs no
network or model, which makes it the default; configure the ``openai`` or ``command`` extractor for an LLM.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from memory_workers.extractors.heuristic_patterns import (
    CONDITIONAL_PREFERENCE,
    FACT_PATTERNS,
    GLOBAL_CUE,
    KINDS,
    OPPOSITES,
    QUESTION,
    REPORTED,
    RETRACTION_PATTERNS,
    RULE_SHAPES,
    FactPattern,
)
from shared.config import ConsolidationSettings
from shared.extraction import (
    Confirmation,
    Contradiction,
    Extraction,
    ExtractionRequest,
    KnownFact,
    NewFact,
    NewRule,
    validate_extraction,
)

# Natural sentences are far shorter; the cap bounds regex work on pasted logs and other walls of text.
_MAX_SENTENCE = 1000
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_LIST_SPLIT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or|&)\s+", re.IGNORECASE)
_VAGUE = frozenset({"it", "that", "this", "them", "him", "her", "one", "so", "me", "you", "there", "something"})
_VAGUE_START = re.compile(r"^(?:not|that|this|it|to\s+be|you|being|when|how|what|if)\b", re.IGNORECASE)
_NOT_A_NAME = frozenset(
    {"this", "that", "it", "he", "she", "they", "there", "here", "what", "who", "today", "tomorrow", "yesterday",
     "which", "and", "but", "so", "then", "also", "now", "my", "i", "we", "the", "a", "an"}
)
_SLUG_SKIP = frozenset({"a", "an", "the", "my", "our", "their", "to", "of", "some", "very", "really", "is", "are"})
_SLUG_STOP = frozenset({"on", "in", "at", "for", "with", "from", "by", "during", "about", "over", "near", "after"})


@dataclass
class _Candidate:
    subject: str
    predicate: str
    content: str
    kind: str
    sources: list[str] = field(default_factory=list)


def sentences(text: str) -> Iterator[str]:
    """The episode's sentences, whitespace-collapsed, list bullets dropped, each at most _MAX_SENTENCE chars."""
    for part in _SPLIT.split(text):
        sentence = " ".join(part.split()).lstrip("-*• ")[:_MAX_SENTENCE]
        if sentence:
            yield sentence


def slug(text: str, words: int = 4) -> str:
    """'a window seat on long flights' → 'window_seat': the head of a value, for a predicate."""
    kept: list[str] = []
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in _SLUG_STOP and kept:
            break
        if word not in _SLUG_SKIP and word not in _SLUG_STOP:
            kept.append(word)
    return "_".join(kept[:words])[:60]


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[\w']+", text.casefold()))


def _snake(predicate: str) -> str:
    return re.sub(r"\s+", "_", predicate.strip().lower())


def _value_ok(value: str) -> bool:
    return bool(value) and value.casefold() not in _VAGUE and not _VAGUE_START.match(value)


def _facts_in(sentence: str) -> Iterator[_Candidate]:
    """Every fact the pattern table finds in one sentence; the first pattern to fill a slot wins."""
    if QUESTION.search(sentence):
        return
    seen: set[tuple[str, str]] = set()
    for pattern in FACT_PATTERNS:
        for match in pattern.regex.finditer(sentence):
            for candidate in _from_match(pattern, match):
                slot = (candidate.subject.casefold(), candidate.predicate)
                if slot not in seen:
                    seen.add(slot)
                    yield candidate


def _from_match(pattern: FactPattern, match: re.Match[str]) -> Iterator[_Candidate]:
    groups = {k: " ".join((v or "").split()) for k, v in match.groupdict().items()}
    groups["when"] = " " + groups["when"] if groups.get("when") else ""
    groups["a"] = groups["a"] + " " if groups.get("a") else ""
    subject = "user"
    if pattern.subject == "{who}":
        who = groups["who"]
        if who.casefold() in _NOT_A_NAME:
            return
        subject = "user" if who.casefold() == "user" else who
    kind = pattern.predicate.split("_{")[0]
    raw = groups.get("v", groups.get("who", ""))
    values = [p.strip(" '") for p in _LIST_SPLIT.split(raw)] if pattern.listing else [raw]
    for value in values:
        if not _value_ok(value):
            continue
        if pattern.predicate == "name" and value[:1].islower():
            value = value.title()
        if kind != pattern.predicate:  # a templated predicate: favorite_{k}
            predicate = f"{kind}_{slug(groups['k']) or 'thing'}"
        elif KINDS[kind].multi and slug(value):
            predicate = f"{kind}_{slug(value)}"
        else:
            predicate = kind
        content = pattern.content.format_map({**groups, "v": value})
        yield _Candidate(subject, predicate, content[:1].upper() + content[1:], kind)


def _rule_in(sentence: str) -> str | None:
    """Imperative guidance in the sentence, as a rule's text, or None."""
    if QUESTION.search(sentence):
        return None
    preference = CONDITIONAL_PREFERENCE.search(sentence)
    if preference:
        x, c, y = (" ".join(preference.group(g).split()) for g in ("x", "c", "y"))
        return _clean_rule(f"User prefers {x} {c} {y}")
    reported = REPORTED.search(sentence)
    text = (sentence[reported.end() :] if reported else sentence).strip(" \"'“”‘’")
    if any(shape.search(text) for shape in RULE_SHAPES):
        return _clean_rule(text)
    return None


def _clean_rule(text: str) -> str | None:
    text = re.sub(r"^(?:(?:please|also|and|so|but)\s+)+", "", text, flags=re.IGNORECASE)
    text = text.strip(" \"'“”‘’.!;:,")
    if len(text.split()) < 2:
        return None
    return (text[:1].upper() + text[1:])[:2000].strip()


@dataclass
class _Batch:
    """What the sentences of one request yielded, before it is compared with the known facts and rules."""

    facts: dict[tuple[str, str], _Candidate] = field(default_factory=dict)
    rules: dict[str, NewRule] = field(default_factory=dict)
    retractions: list[tuple[str, str, str, str]] = field(default_factory=list)  # kind, value, sentence, episode

    def add_fact(self, found: _Candidate, episode_id: str) -> None:
        # A later episode's value for the same slot replaces an earlier one ("moved to Paris" after "lives in Berlin").
        slot = (found.subject.casefold(), found.predicate)
        held = self.facts.get(slot)
        if held is not None and _norm(held.content) == _norm(found.content):
            held.sources = list(dict.fromkeys([*held.sources, episode_id]))
        else:
            found.sources = [episode_id]
            self.facts[slot] = found

    def add_rule(self, text: str, scope: str, episode_id: str) -> None:
        key = _norm(text)
        held = self.rules.get(key)
        sources = list(dict.fromkeys([*(held.source_episode_ids if held else []), episode_id]))
        self.rules[key] = NewRule(content=held.content if held else text, scope=scope, source_episode_ids=sources)


class HeuristicExtractor:
    """Offline, deterministic extractor over English phrasing; see the module docstring for its limits."""

    name = "heuristic"

    def __init__(self, settings: ConsolidationSettings | None = None) -> None:
        self._settings = settings

    def extract(self, request: ExtractionRequest) -> Extraction:
        """Facts, rules, confirmations and contradictions found in the request's episodes, oldest first."""
        batch = _Batch()
        for episode in sorted(request.episodes, key=lambda e: (e.created_at, e.seq)):
            for sentence in sentences(episode.content):
                for found in _facts_in(sentence):
                    batch.add_fact(found, episode.id)
                rule = _rule_in(sentence)
                if rule:
                    scope = "global" if GLOBAL_CUE.search(rule) or not episode.butler else episode.butler
                    batch.add_rule(rule, scope, episode.id)
                for retraction in RETRACTION_PATTERNS:
                    for match in retraction.regex.finditer(sentence):
                        batch.retractions.append((retraction.kind, match.group("v"), sentence, episode.id))
        return validate_extraction(_reconcile(batch, request).model_dump(), request)


def _reconcile(batch: _Batch, request: ExtractionRequest) -> Extraction:
    """Compare with what is known: the same fact confirms, a new value supersedes, a retraction contradicts."""
    confirmed: dict[tuple[str | None, str | None], list[str]] = {}
    facts = list(_new_facts(batch, request.facts, confirmed))
    known_rules = {_norm(rule.content): rule.id for rule in request.rules}
    rules = []
    for key, rule in batch.rules.items():
        if key in known_rules:
            confirmed.setdefault((None, known_rules[key]), []).extend(rule.source_episode_ids)
        else:
            rules.append(rule)
    superseded = {f.supersedes_fact_id for f in facts}
    contradictions = [c for c in _contradictions(batch, request.facts) if c.fact_id not in superseded]
    confirmations = [
        Confirmation(fact_id=f, rule_id=r, source_episode_ids=list(dict.fromkeys(s))) for (f, r), s in confirmed.items()
    ]
    return Extraction(facts=facts, rules=rules, confirmations=confirmations, contradictions=contradictions)


def _new_facts(
    batch: _Batch, known_facts: list[KnownFact], confirmed: dict[tuple[str | None, str | None], list[str]]
) -> Iterator[NewFact]:
    """The batch's facts that are news; one already known with the same content is added to ``confirmed``."""
    known: dict[tuple[str, str], KnownFact] = {}
    for fact in known_facts:
        known.setdefault((fact.subject.casefold(), _snake(fact.predicate)), fact)
    for (subject, predicate), found in batch.facts.items():
        same = known.get((subject, predicate))
        if same is not None and _norm(same.content) == _norm(found.content):
            confirmed.setdefault((same.id, None), []).extend(found.sources)
            continue
        opposite = OPPOSITES.get(found.kind)
        replaced = same or (opposite and known.get((subject, opposite + predicate[len(found.kind) :])))
        kind = KINDS[found.kind]
        yield NewFact(
            subject=found.subject, predicate=found.predicate, content=found.content[:2000],
            permanence=kind.permanence, importance=kind.importance, source_episode_ids=found.sources,
            supersedes_fact_id=replaced.id if replaced else None,
        )


def _contradictions(batch: _Batch, known: list[KnownFact]) -> Iterator[Contradiction]:
    """Known user facts that a retraction ("no longer lives in Berlin") names by kind and value."""
    for kind, value, sentence, episode_id in batch.retractions:
        said, head = f" {_norm(value)} ", slug(value)
        for fact in known:
            predicate = _snake(fact.predicate)
            if fact.subject.casefold() != "user" or not (predicate == kind or predicate.startswith(kind + "_")):
                continue
            if said.strip() and (predicate == f"{kind}_{head}" or said in f" {_norm(fact.content)} "):
                note = f"Episode says: {sentence}"
                yield Contradiction(fact_id=fact.id, source_episode_ids=[episode_id], note=note)
