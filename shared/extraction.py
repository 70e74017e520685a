"""Consolidation extraction: the extractor's input and output shapes, the prompt, and the output gate.

Pure (pydantic and the standard library only). Every extractor — heuristic, OpenAI-compatible, command —
answers an :class:`ExtractionRequest`; :func:`validate_extraction` is the one gate its answer passes before
the store layer sees it, so every id in an :class:`Extraction` is known to belong to the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.errors import ExtractionError
from shared.extraction_refs import merge_duplicates, resolve_references
from shared.vocabulary import PREDICATES, Permanence


class _In(BaseModel):
    model_config = ConfigDict(frozen=True)


class EpisodeIn(_In):
    id: str
    seq: int
    butler: str
    content: str
    created_at: datetime
    importance: float


class KnownFact(_In):
    id: str
    subject: str
    predicate: str
    content: str
    permanence: str
    scope: str


class KnownRule(_In):
    id: str
    content: str
    scope: str
    maturity: str


class ExtractionRequest(_In):
    """One consolidation batch: unconsolidated episodes of one butler plus the active facts and rules in scope."""

    tenant_id: str
    butler: str
    episodes: list[EpisodeIn]
    facts: list[KnownFact] = []
    rules: list[KnownRule] = []


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def _blank_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


_SOURCES = "Ids of the episodes (from 'Episodes to process') this is drawn from."


class NewFact(_Out):
    subject: str = Field(min_length=1, max_length=200, description="Who or what it is about; 'user' for the user.")
    predicate: str = Field(min_length=1, max_length=200, description="snake_case attribute, e.g. name, lives_in.")
    content: str = Field(min_length=1, max_length=2000, description="The fact as one short sentence.")
    permanence: Permanence
    importance: float = Field(5.0, ge=1, le=10, description="1 (trivia) to 10 (critical, e.g. allergies).")
    scope: str = Field("global", min_length=1, max_length=200, description="'global' or a butler name.")
    source_episode_ids: list[str] = Field(min_length=1, description=_SOURCES)
    supersedes_fact_id: str | None = Field(None, description="Id of the existing fact this replaces, else null.")

    @field_validator("predicate", mode="before")
    @classmethod
    def _snake_case(cls, value: Any) -> Any:
        return re.sub(r"\s+", "_", value.strip().lower()) if isinstance(value, str) else value

    _no_blank_supersedes = field_validator("supersedes_fact_id", mode="before")(_blank_is_none)


class NewRule(_Out):
    content: str = Field(min_length=1, max_length=2000, description="The rule as one imperative sentence.")
    scope: str = Field("global", min_length=1, max_length=200, description="'global' or a butler name.")
    source_episode_ids: list[str] = Field(min_length=1, description=_SOURCES)
    supporting_fact_refs: list[str] = Field(
        [], description="Existing fact ids, or 'facts[N]' for the N-th (0-based) new fact of this answer."
    )


class Confirmation(_Out):
    fact_id: str | None = Field(None, description="Existing fact id, or null when rule_id is set.")
    rule_id: str | None = Field(None, description="Existing rule id, or null when fact_id is set.")
    source_episode_ids: list[str] = Field([], description=_SOURCES)

    _no_blank_ids = field_validator("fact_id", "rule_id", mode="before")(_blank_is_none)

    @model_validator(mode="after")
    def _exactly_one(self) -> "Confirmation":
        if (self.fact_id is None) == (self.rule_id is None):
            raise ValueError("exactly one of fact_id and rule_id must be set")
        return self


class Contradiction(_Out):
    fact_id: str = Field(description="Existing fact id that an episode contradicts without clearly replacing.")
    source_episode_ids: list[str] = Field(min_length=1, description=_SOURCES)
    note: str = Field("", max_length=2000)


class Extraction(_Out):
    facts: list[NewFact] = []
    rules: list[NewRule] = []
    confirmations: list[Confirmation] = []
    contradictions: list[Contradiction] = []


# OpenAI's strict json_schema mode wants every property required, no extra properties and no validation
# keywords it does not support; the bounds live in the descriptions and pydantic enforces them afterwards.
_NOT_STRICT = frozenset({"title", "default", "minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum"})


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: ({name: _strict(sub) for name, sub in value.items()} if key in ("properties", "$defs") else _strict(value))
        for key, value in node.items()
        if key not in _NOT_STRICT
    }
    if "properties" in out:
        out["additionalProperties"] = False
        out["required"] = list(out["properties"])
    return out


EXTRACTION_JSON_SCHEMA: dict[str, Any] = _strict(Extraction.model_json_schema())


class Extractor(Protocol):
    name: str

    def extract(self, request: ExtractionRequest) -> Extraction: ...


_PROMPT = """Review these recent episodes from the {butler} butler and turn what is worth remembering into
facts and rules. Most episodes hold nothing durable: an empty answer is a good answer.

Who is who:
- An episode line "Name: ..." is spoken by Name: "I", "my" mean Name. "User: ..." and text without a
  speaker are the user's own words. An assistant's turn ("Assistant: ...") is not a source of facts
  unless it repeats what the user said ("Got it, you're allergic to peanuts").
- In summaries, "the user" is the user; "he", "she", "they" are the person named before.
- subject: "user" for the user, else the person's name as written ("Maria"). For a relationship the
  subject is the other person: "my wife Anna" -> subject "Anna", predicate "relationship".

a) NEW FACTS as subject / predicate / content. Use these predicates (for the ones marked "set", add the
   value's head: "allergic_to_peanuts", "likes_hiking", "favorite_color"):
{vocabulary}
   content is one short sentence that names its subject: "Maria lives in Porto", "User is allergic to
   peanuts" - never "lives in Porto". Permanence:
   - permanent: identity, medical, biographical (never changes)
   - stable: long-term preferences, professional info (changes rarely)
   - standard: current interests, opinions, projects (shifts over months)
   - volatile: temporary states, short-term plans (changes over weeks)
   - ephemeral: what happened today, one-off events (irrelevant in days)

b) UPDATED FACTS - if an episode updates an existing fact (same subject and predicate, new value),
   give the new fact with supersedes_fact_id set to the existing fact's id.

c) NEW RULES - lasting guidance on how to act for the user, as one imperative sentence: "Always answer
   in metric units", "When the user asks for a recipe, list the ingredients first".

d) CONFIRMATIONS - existing facts or rules that these episodes say again (by id).

e) CONTRADICTIONS - existing facts an episode takes back ("I no longer live in Berlin") when it is not
   clear what replaces them.

Do NOT extract:
- small talk, thanks, greetings, and what the assistant suggested or explained
- questions, hypotheticals and wishes ("if I moved to Paris", "should I learn Spanish?")
- reminders, deadlines and one-off instructions ("remind me tomorrow", "the meeting moved to 3pm"):
  these are not rules
- a fact without a concrete value ("User likes it"), or about the conversation itself
- facts that are already stored and unchanged (confirm them instead)
- rules that duplicate existing rules (confirm them instead)
scope: always "{butler}".

Existing facts for reference:
{facts}

Existing rules for reference:
{rules}

Episodes to process:
{episodes}

Every source_episode_ids entry must be an episode id listed above; every fact_id, rule_id and
supersedes_fact_id must be an existing id listed above. Answer with ONLY a JSON object (no prose,
no code fence) matching this JSON Schema:
{schema}
"""


def _vocabulary() -> str:
    return "\n".join(
        f"   - {p.name}{' (set)' if p.multi else ''}: {p.meaning}; {p.permanence}" for p in PREDICATES.values()
    )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()) or "    (empty)"


def _line(text: str) -> str:
    return " ".join(text.split())


def build_prompt(request: ExtractionRequest) -> str:
    """The consolidation prompt for one batch; the same request always yields the same text."""
    facts = [
        f"- fact {f.id}: {_line(f.subject)} | {_line(f.predicate)} | {_line(f.content)} "
        f"(permanence: {f.permanence}, scope: {f.scope})"
        for f in request.facts
    ]
    rules = [f"- rule {r.id}: {_line(r.content)} (scope: {r.scope}, maturity: {r.maturity})" for r in request.rules]
    episodes = [
        f"- episode {e.id} (at {e.created_at.isoformat()}, importance {e.importance:g}):\n{_indent(e.content)}"
        for e in request.episodes
    ]
    return _PROMPT.format(
        butler=request.butler,
        vocabulary=_vocabulary(),
        facts="\n".join(facts) or "(none)",
        rules="\n".join(rules) or "(none)",
        episodes="\n".join(episodes) or "(none)",
        schema=json.dumps(EXTRACTION_JSON_SCHEMA, sort_keys=True, separators=(",", ":")),
    )


_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _parse(raw: str) -> Any:
    """JSON from an extractor's text: bare, inside a ```json fence, or the outermost {...} amid prose."""
    text = raw.strip()
    candidates = [text]
    fence = _FENCE.search(text)
    if fence:
        candidates.append(fence.group(1).strip())
    if "{" in text:
        candidates.append(text[text.index("{") : text.rindex("}") + 1] if "}" in text else text)
    error: json.JSONDecodeError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as exc:
            error = error or exc
    snippet = text[:80] + ("…" if len(text) > 80 else "")
    raise ExtractionError(f"output is not JSON ({error}); it starts with {snippet!r}")


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".") or "(root)"


def validate_extraction(raw: str | Mapping[str, Any], request: ExtractionRequest) -> Extraction:
    """Parse and check an extractor's answer; every referenced id belongs to the request, or ExtractionError."""
    data = _parse(raw) if isinstance(raw, str) else raw
    if not isinstance(data, Mapping):
        raise ExtractionError(f"output must be a JSON object, got {type(data).__name__}")
    try:
        extraction = Extraction.model_validate(dict(data))
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(f"{_path(e['loc'])}: {e['msg']}" for e in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise ExtractionError(
            f"output does not match the schema: {problems}{more}", field=_path(errors[0]["loc"])
        ) from None
    resolved = resolve_references(
        extraction.model_dump(),
        episode_ids=[e.id for e in request.episodes],
        fact_ids=[f.id for f in request.facts],
        rule_ids=[r.id for r in request.rules],
    )
    return Extraction.model_validate(merge_duplicates(resolved))
