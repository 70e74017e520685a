"""The embedded, offline consolidation extractor: clause patterns over English, with speakers and subjects.

It does not understand text. It reads each episode as turns (``"Maria: ..."`` speaks for Maria; ``"User: ..."``
and an unprefixed first person for the user; an assistant's turn counts only where it confirms what the user
said), splits them into sentences, and matches the clause shapes of :mod:`heuristic_patterns` with a subject in
front: *I* is the speaker, *he/she/they* the last person named (or "the user" of a summary), a capitalised name
that person. Facts use the controlled vocabulary of :mod:`shared.vocabulary` and name their subject in their
content ("Maria lives in Porto"). Questions, hypotheticals, modal clauses, vague values ("likes it") and
one-off reminders yield nothing; a negated clause ("no longer lives in Berlin") can only contradict.

Deterministic, no network or model: the default. Anything said another way is missed
(``tests/bench/bench_extraction.py`` measures how much); configure the ``openai`` extractor for a language model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from memory_workers.extractors.heuristic_patterns import (
    ASSISTANT_SPEAKERS,
    BAD_FIRST,
    CONDITIONAL_PREFERENCE,
    CONFIRMING,
    CORRECTION,
    FACT_PATTERNS,
    FAMILY_WORDS,
    HYPOTHETICAL,
    LIKES_FIRST,
    LONGER,
    MODAL,
    NEGATION,
    NOT_A_NAME,
    NOT_SPEAKERS,
    ONE_OFF,
    QUESTION,
    REPORTED,
    RELATIVE,
    RETRACTIONS,
    REPORTING,
    ROLE_SPEAKERS,
    NOT_AN_ORDER,
    RULE_SHAPES,
    SPEAKER,
    THE_USER,
    USER_SPEAKERS,
    VAGUE_LEAD,
    VAGUE_WORDS,
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
from shared.vocabulary import OPPOSITES, PREDICATES, base_predicate, slug, stored_predicate

# Natural sentences are far shorter; the cap bounds regex work on pasted logs and other walls of text.
_MAX_SENTENCE = 600
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+|\s+-{1,2}\s+|;\s+")
_ABBREVIATION = re.compile(r"\b(?:Dr|Mr|Mrs|Ms|Prof|St|Mt|Jr|Sr|vs|etc|e\.g|i\.e)\.$")
_LIST_SPLIT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or|&)\s+", re.IGNORECASE)
_GENERAL = re.compile(
    r"\b(?:always|never|every\s+time|whenever|from\s+now\s+on|in\s+(?:the\s+)?future|"
    r"going\s+forward|by\s+default)\b",
    re.IGNORECASE,
)
# A rule tells the butler how to act for the user: "I ..." describes the speaker, "your inbox" advises the user,
# "again" scolds one answer.
_NOT_FOR_THE_BUTLER = re.compile(
    r"\b(?:I|I'm|I'll|I've|I'd|your(?!\s+(?:answers|replies|responses|messages|summaries))|yours|yourself|again)\b",
    re.IGNORECASE,
)
# A reason after the instruction is not part of it: "Always answer in metric units, I never think in miles."
_REASON = re.compile(r"(?:,|\s+-+|;)\s+(?:I|I'm|I've|as|since|because|it's)\b.*$", re.IGNORECASE)
_ENDS_VAGUE = frozenset({"it", "that", "this", "them", "so", "there", "too"})
_OWNER = re.compile(r"\b(?:my|our)\b", re.IGNORECASE)
# "those campgrounds", "these points": about the conversation at hand, not a standing rule.
_DEICTIC = re.compile(r"\b(?:those|these)\b", re.IGNORECASE)
_CONDITION = re.compile(r"^(?:when|whenever|if|before|after|every\s+time)\b[^,]{1,120},\s*", re.IGNORECASE)
_REMINDER = re.compile(r"\b(?:forget|remind\s+me|reminder)\b", re.IGNORECASE)
_YOU = re.compile(r"\byou(?:'re|'ve)?\b|\byour\b", re.IGNORECASE)
_SECOND_PERSON = (
    (re.compile(r"\byou\s+are\b", re.IGNORECASE), "I am"),
    (re.compile(r"\byou're\b", re.IGNORECASE), "I'm"),
    (re.compile(r"\byou've\b", re.IGNORECASE), "I've"),
    (re.compile(r"\byour\b", re.IGNORECASE), "my"),
    (re.compile(r"\byou\b", re.IGNORECASE), "I"),
)
_TYPOS = (
    (re.compile(r"\bim\b"), "I'm"),
    (re.compile(r"\bi\b"), "I"),
    (re.compile(r"\bdont\b"), "don't"),
    (re.compile(r"\bive\b"), "I've"),
)

USER = "user"
_CUT_WORD = re.compile(r"[.'’-]\w")
_QUOTED = re.compile(r"[\"“”‘’]|'\s|\s'|'$")
_NUMBERS = frozenset("one two three four five six seven eight nine ten eleven twelve hundred thousand".split())


@dataclass
class _Candidate:
    subject: str
    predicate: str  # stored predicate (base + value head for a set)
    base: str
    content: str
    sources: list[str] = field(default_factory=list)


@dataclass
class _Turn:
    speaker: str  # the entity "I" stands for: "user" or a name
    assistant: bool
    text: str


def sentences(text: str) -> Iterator[str]:
    """The text's sentences, whitespace-collapsed, list bullets dropped, each at most _MAX_SENTENCE chars; a
    period after an abbreviation ("Dr. Osei", "St. Louis") does not end one."""
    held = ""
    for part in _SPLIT.split(text):
        part = held + part
        held = part + " " if _ABBREVIATION.search(part) else ""
        sentence = " ".join(part.split()).lstrip("-*• ")[:_MAX_SENTENCE]
        if sentence and not held:
            yield sentence
    if held.strip():
        yield " ".join(held.split())[:_MAX_SENTENCE]


def turns(content: str) -> Iterator[_Turn]:
    """The episode as turns: a ``Name:`` line speaks for Name until the next speaker; unprefixed text is the user's."""
    speaker, assistant = USER, False
    lines: list[str] = []
    for line in content.replace("’", "'").replace("‘", "'").splitlines():
        match = SPEAKER.match(line)
        who = match.group("sp") if match else ""
        if match and who.casefold() not in NOT_SPEAKERS:
            if lines:
                yield _Turn(speaker, assistant, "\n".join(lines))
            key = who.casefold()
            assistant = key in ASSISTANT_SPEAKERS or key in ROLE_SPEAKERS
            speaker = USER if key in USER_SPEAKERS or assistant else who
            lines = [line[match.end() :]]
        else:
            lines.append(line)
    if lines:
        yield _Turn(speaker, assistant, "\n".join(lines))


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[\w']+", text.casefold()))


def _display(entity: str) -> str:
    return "User" if entity == USER else entity


def _value_ok(value: str, base: str) -> bool:
    """A concrete object: not a pronoun, not a clause fragment, not a filler."""
    words = re.findall(r"[\w']+", value.casefold())
    if not words or not value[:1].isalnum() or len(words) > 8 or words[0] in BAD_FIRST or _QUOTED.search(value):
        return False
    if words[0] in _NUMBERS or (value[:1].isupper() and words[0] in NOT_A_NAME and words[0] not in VAGUE_LEAD):
        return False
    if words[-1] in VAGUE_LEAD or words[-1] in {"of", "in", "at", "for", "with"}:
        return False
    if base in ("likes", "dislikes") and (words[0] in LIKES_FIRST or len(words) > 4):
        return False
    if words[0] in VAGUE_LEAD and len(words) == 1:
        return False
    return not any(w in VAGUE_WORDS for w in words)


class _Subjects:
    """Who a clause's subject stands for, given the turn's speaker and the people named so far."""

    def __init__(self, people: set[str]) -> None:
        self.last: str | None = None  # the antecedent of he/she/they
        # Names a clause may have as its subject: people the episode introduces as such (a speaker, "my sister
        # Ana", "Tom said"), or that memory already knows. A capitalised word alone is not a person ("Work
        # likes...", "Lagos is...").
        self.people = {p.casefold() for p in people}

    @staticmethod
    def introduced(text: str) -> set[str]:
        """The people a text introduces: relatives named with their relation, people who say or do things."""
        return {m.group("who") or m.group("who2") for m in RELATIVE.finditer(text)} | {
            m.group("who") for m in REPORTING.finditer(text)
        }

    def mentions(self, sentence: str) -> list[tuple[int, str]]:
        """(position, entity) of every person the sentence names, in order."""
        found = [(m.start(), USER) for m in THE_USER.finditer(sentence)]
        found += [
            (m.start(), m.group("who"))
            for m in REPORTING.finditer(sentence)
            if m.group("who").split()[0].casefold() not in NOT_A_NAME
        ]
        found += [(m.start(), m.group("who") or m.group("who2")) for m in RELATIVE.finditer(sentence)]
        return sorted(found)

    def resolve(self, word: str, turn: _Turn, at: int, named: list[tuple[int, str]]) -> str | None:
        key = word.casefold()
        if key in {"i", "we", "my", "our"}:
            return turn.speaker
        if key in {"he", "she", "they", "his", "her", "their"}:
            before = [who for pos, who in named if pos < at]
            return before[-1] if before else self.last
        bare = re.sub(r"^the\s+", "", key.removesuffix("'s")).rstrip("'")
        if bare in {"user", "users"}:
            return USER
        name = word.removesuffix("'s")
        if name.split()[0].casefold() in NOT_A_NAME or (name == word and name.casefold() not in self.people):
            return None
        return name


def _clauses(sentence: str, turn: _Turn, subjects: _Subjects) -> Iterator[tuple[str, FactPattern, re.Match[str]]]:
    """(entity, pattern, match) for every fact-shaped clause of the sentence; the subject resolved.

    A clause whose subject is left out ("..., moved to Berlin and works at Siemens") takes the subject of the
    nearest clause before it in the sentence.
    """
    named = subjects.mentions(sentence)
    found: list[tuple[int, str, FactPattern, re.Match[str]]] = []
    for pattern in FACT_PATTERNS:
        for match in pattern.regex.finditer(sentence):
            if "s" in match.groupdict() and match.group("s"):
                entity = subjects.resolve(match.group("s"), turn, match.start("s"), named)
            else:
                entity = turn.speaker
            if entity is not None:
                found.append((match.start(), entity, pattern, match))
    found.sort(key=lambda item: item[0])
    spans = [(start, match.end()) for start, _, _, match in found]
    for pattern in FACT_PATTERNS:
        if pattern.elided is None:
            continue
        for match in pattern.elided.finditer(sentence):
            if any(start <= match.start() < end for start, end in spans):
                continue
            before = [entity for start, entity, _, _ in found if start < match.start()]
            if before:
                found.append((match.start(), before[-1], pattern, match))
    for _, entity, pattern, match in found:
        yield entity, pattern, match
    if named:
        subjects.last = named[-1][1]
    elif found:
        subjects.last = found[-1][1]


def _facts(entity: str, pattern: FactPattern, match: re.Match[str]) -> Iterator[_Candidate]:
    groups = {k: " ".join((v or "").split()) for k, v in match.groupdict().items()}
    if pattern.predicate == "relationship":
        who = groups["who"]
        if who.split()[0].casefold() in NOT_A_NAME or who.casefold() == entity.casefold():
            return
        owner = "the user's" if entity == USER else f"{entity}'s"
        rel = groups["rel"].lower()
        content = pattern.content.format(who=who, P=owner, rel=rel)
        predicate = "relationship"
        yield _Candidate(who, predicate, predicate, content)
        return
    raw = groups.get("v") or groups.get("lv", "").title()
    if "v" in match.groupdict() and _CUT_WORD.match(match.string, match.end("v")):
        return  # the value stops inside a token ("emailjoy" of "emailjoy.com")
    values = [p.strip(" '") for p in _LIST_SPLIT.split(raw)] if pattern.listing else [raw]
    if pattern.listing and values[0].startswith("to "):  # "to relax or meet friends": the "to" is shared
        values = [v if v.startswith("to ") else f"to {v}" for v in values]
    for n, value in enumerate(values):
        if pattern.predicate == "name":
            if value.split()[0].casefold() in NOT_A_NAME:
                continue
            value = value[:1].upper() + value[1:]
        elif not _value_ok(value, pattern.predicate):
            if n == 0:
                return  # a list whose head is not a thing ("how you've ... and given ...") is not a list of things
            continue
        fill = {
            **groups,
            "v": _OWNER.sub("their", value),
            "S": _display(entity),
            "when": " " + groups["when"] if groups.get("when") else "",
            "a": groups["a"] + " " if groups.get("a") else "",
        }
        content = pattern.content.format_map(fill)
        if pattern.kind:
            predicate = f"favorite_{slug(groups[pattern.kind]) or 'thing'}"
        else:
            predicate = stored_predicate(pattern.predicate, value)
        yield _Candidate(entity, predicate, pattern.predicate, content[:1].upper() + content[1:])


def _rule_in(sentence: str) -> str | None:
    """Lasting guidance in the sentence, as a rule's text, or None (reminders and one-offs are not rules)."""
    if QUESTION.search(sentence):
        return None
    correction = CORRECTION.search(sentence)
    if correction:
        return _clean_rule(f"User prefers the {correction.group('x').strip()} to be {correction.group('y').strip()}")
    preference = CONDITIONAL_PREFERENCE.search(sentence)
    if preference:
        x, c, y = (" ".join(preference.group(g).split()) for g in ("x", "c", "y"))
        return _clean_rule(f"User prefers {x} {c} {y}")
    reported = REPORTED.search(sentence)
    text = _REASON.sub("", (sentence[reported.end() :] if reported else sentence).strip(" \"'“”‘’"))
    if not any(shape.search(text) for shape in RULE_SHAPES):
        return None
    general = _GENERAL.search(text)
    if _REMINDER.search(text) or NOT_AN_ORDER.search(text) or (not general and ONE_OFF.search(text)):
        return None
    return _clean_rule(text)


def _clean_rule(text: str) -> str | None:
    text = re.sub(r"^(?:(?:please|also|and|so|but)\s+)+", "", text, flags=re.IGNORECASE)
    text = text.strip(" \"'“”‘’.!;:,")
    words = re.findall(r"[\w']+", text.casefold())
    main = _CONDITION.sub("", text)  # "When I ask for a recipe, list ..." is about the butler's action
    if (
        not 3 <= len(words) <= 40
        or words[-1] in _ENDS_VAGUE
        or _NOT_FOR_THE_BUTLER.search(main)
        or _DEICTIC.search(text)
    ):
        return None
    return (text[:1].upper() + text[1:])[:2000].strip()


@dataclass
class _Batch:
    """What the sentences of one request yielded, before it is compared with the known facts and rules."""

    facts: dict[tuple[str, str], _Candidate] = field(default_factory=dict)
    rules: dict[str, NewRule] = field(default_factory=dict)
    retractions: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # entity, base, value, …

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
        known_people = {f.subject for f in request.facts if f.subject != USER}
        for episode in sorted(request.episodes, key=lambda e: (e.created_at, e.seq)):
            episode_turns = list(turns(episode.content))
            subjects = _Subjects(
                known_people | _Subjects.introduced(episode.content) | {t.speaker for t in episode_turns}
            )
            for turn in episode_turns:
                if turn.assistant and not CONFIRMING.search(turn.text):
                    continue
                for sentence in sentences(turn.text):
                    self._sentence(sentence, turn, subjects, batch, episode.id, episode.butler or request.butler)
        return validate_extraction(_reconcile(batch, request).model_dump(), request)

    def _sentence(
        self, sentence: str, turn: _Turn, subjects: _Subjects, batch: _Batch, episode_id: str, butler: str
    ) -> None:
        for typo, fixed in _TYPOS:
            sentence = typo.sub(fixed, sentence)
        if turn.assistant:  # only what it says back about the user ("you're allergic..."), as the user's
            if not _YOU.search(sentence):
                return
            for you, me in _SECOND_PERSON:
                sentence = you.sub(me, sentence)
        if QUESTION.search(sentence):
            return
        hypothetical = HYPOTHETICAL.search(sentence)
        for entity, pattern, match in _clauses(sentence, turn, subjects):
            if hypothetical and hypothetical.start() < match.end():
                continue
            aux = (match.groupdict().get("aux") or "") + (match.groupdict().get("neg") or "")
            if MODAL.search(aux):
                continue
            if NEGATION.search(aux) or NEGATION.search(sentence[max(0, match.start() - 12) : match.start()]):
                if LONGER.search(sentence) or "no longer" in aux.casefold():
                    value = match.groupdict().get("v") or match.groupdict().get("lv") or ""
                    batch.retractions.append((entity, pattern.predicate, value, sentence, episode_id))
                continue
            for found in _facts(entity, pattern, match):
                batch.add_fact(found, episode_id)
        for regex, base in RETRACTIONS:
            for match in regex.finditer(sentence):
                who = subjects.resolve(match.group("s"), turn, match.start("s"), subjects.mentions(sentence))
                if who is not None:
                    batch.retractions.append((who, base, match.group("v"), sentence, episode_id))
        if not turn.assistant and not hypothetical:
            rule = _rule_in(sentence)
            if rule:
                batch.add_rule(rule, butler, episode_id)


def _reconcile(batch: _Batch, request: ExtractionRequest) -> Extraction:
    """Compare with what is known: the same fact confirms, a new value supersedes, a retraction contradicts."""
    confirmed: dict[tuple[str | None, str | None], list[str]] = {}
    facts = list(_new_facts(batch, request, confirmed))
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
    batch: _Batch, request: ExtractionRequest, confirmed: dict[tuple[str | None, str | None], list[str]]
) -> Iterator[NewFact]:
    """The batch's facts that are news; one already known with the same content is added to ``confirmed``."""
    known: dict[tuple[str, str], KnownFact] = {}
    for fact in request.facts:
        known.setdefault((fact.subject.casefold(), re.sub(r"\s+", "_", fact.predicate.strip().lower())), fact)
    for (subject, predicate), found in batch.facts.items():
        same = known.get((subject, predicate))
        if same is not None and _norm(same.content) == _norm(found.content):
            confirmed.setdefault((same.id, None), []).extend(found.sources)
            continue
        opposite = OPPOSITES.get(found.base)
        replaced = same or (opposite and known.get((subject, opposite + predicate[len(found.base) :])))
        spec = PREDICATES[found.base]
        permanence = spec.permanence
        if found.base == "relationship" and not FAMILY_WORDS.match(found.content.rsplit(" ", 1)[-1]):
            permanence = "stable"
        yield NewFact(
            subject=found.subject,
            predicate=found.predicate,
            content=found.content[:2000],
            permanence=permanence,
            importance=spec.importance,
            scope=request.butler,
            source_episode_ids=found.sources,
            supersedes_fact_id=replaced.id if replaced else None,
        )


def _contradictions(batch: _Batch, known: list[KnownFact]) -> Iterator[Contradiction]:
    """Known facts that a retraction ("no longer lives in Berlin") names by subject, predicate and value."""
    for entity, base, value, sentence, episode_id in batch.retractions:
        said = _norm(value)
        for fact in known:
            if fact.subject.casefold() != entity.casefold() or base_predicate(fact.predicate) != base:
                continue
            single = not PREDICATES[base].multi
            if (single and not said) or (said and f" {said} " in f" {_norm(fact.content)} "):
                yield Contradiction(fact_id=fact.id, source_episode_ids=[episode_id], note=f"Episode says: {sentence}")
