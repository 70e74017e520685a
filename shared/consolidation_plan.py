"""The pure half of consolidation: a batch of due episodes, its identity, and an extraction turned into writes.

No database, no clock: :func:`plan_extraction` validates every write an extractor proposed before anything is
stored, so a bad answer fails as an ExtractionError (and is retried, isolated, dead-lettered) instead of
breaking the transaction that applies it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.errors import ButlerError, ExtractionError
from shared.extraction import EpisodeIn, Extraction, ExtractionRequest, KnownFact, KnownRule
from shared.extraction_refs import NEW_FACT_REF
from shared.schemas import FactWrite, RuleWrite, parse
from shared.vocabulary import base_predicate

# Ids of what a batch creates are uuid5(batch identity): a replay of the same batch names the same rows.
ID_NAMESPACE = uuid.UUID("5d0c6d1e-61b1-4a0e-9a55-6d656d6f7279")


def fact_text(subject: str, predicate: str, content: str) -> str:
    """What a fact is embedded as: ``"user home city: Lives in Berlin"`` (a query is embedded as typed)."""
    return f"{subject} {predicate.replace('_', ' ')}: {content}"


def embedding_text(kind: str, write: Any) -> str:
    """The text embedded for a write of ``kind``: the content, or :func:`fact_text` for a fact."""
    return fact_text(write.subject, write.predicate, write.content) if kind == "fact" else write.content


# --- matching known memory by meaning ------------------------------------------------------------------

# MiniLM cosine of paraphrased rules is 0.75-0.82 ("Always answer me in metric units" / "Use metric units in every
# answer"), of different rules 0.27-0.55, but "Never call after 9pm" / "Never call before 9am" is 0.95: meaning
# alone cannot tell a changed number or name from a paraphrase, so the pieces that carry it must agree too.
_NUMBERS = re.compile(r"\b\d[\w:.]*")
_SPACED_TIME = re.compile(r"(\d)\s+(am|pm)\b", re.IGNORECASE)
_NAMES = re.compile(r"(?<=\s)[A-Z][a-z]+\b")
_NEGATIVE = re.compile(r"\b(?:never|not|no|don't|do\s+not|avoid)\b|n't\b", re.IGNORECASE)


def markers(text: str) -> frozenset[str]:
    """The words a paraphrase keeps: numbers and times, names (capitalised past the first word), polarity."""
    text = _SPACED_TIME.sub(r"\1\2", text.strip())
    found = {m.group(0).casefold() for m in (*_NUMBERS.finditer(text), *_NAMES.finditer(text))}
    return frozenset(found | ({"<negative>"} if _NEGATIVE.search(text) else set()))


def same_meaning(new: str, known: str, cosine: float, threshold: float) -> bool:
    """Whether a new rule (or fact) says what a known one says: close in meaning and the same markers."""
    return cosine >= threshold and markers(new) == markers(known)


# --- the batch ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DueEpisode:
    id: uuid.UUID
    seq: int
    content: str
    created_at: datetime
    occurred_at: datetime  # when it happened (an imported history's own time); what derived memories are dated by
    importance: float
    status: str
    attempts: int
    forgotten: bool


@dataclass(frozen=True)
class Batch:
    """Due episodes of one key (seq order) with the known memory an extractor may confirm or supersede."""

    tenant_id: str
    butler: str
    episodes: tuple[DueEpisode, ...]
    facts: tuple[KnownFact, ...]
    rules: tuple[KnownRule, ...]
    started_at: datetime

    @property
    def active(self) -> list[DueEpisode]:
        """The episodes an extractor sees; forgotten ones are consolidated without being read."""
        return [e for e in self.episodes if not e.forgotten]

    @property
    def idempotency_key(self) -> str:
        digest = hashlib.sha256("|".join(f"{e.id}:{e.attempts}" for e in self.episodes).encode()).hexdigest()
        return f"{self.butler}:{self.episodes[0].seq}-{self.episodes[-1].seq}:{digest[:32]}"

    def request(self, chosen: Sequence[DueEpisode]) -> ExtractionRequest:
        return ExtractionRequest(
            tenant_id=self.tenant_id,
            butler=self.butler,
            facts=list(self.facts),
            rules=list(self.rules),
            episodes=[
                EpisodeIn(
                    id=str(e.id),
                    seq=e.seq,
                    butler=self.butler,
                    content=e.content,
                    created_at=e.occurred_at,
                    importance=e.importance,
                )
                for e in chosen
            ],
        )


# --- the plan: an extraction as validated writes (pure) ----------------------------------------------


@dataclass(frozen=True)
class PlannedFact:
    id: uuid.UUID
    write: FactWrite
    sources: tuple[uuid.UUID, ...]
    supersedes: uuid.UUID | None
    observed_at: datetime  # its latest source episode's time: a fact observed earlier never replaces a later one


@dataclass(frozen=True)
class PlannedRule:
    id: uuid.UUID
    write: RuleWrite
    sources: tuple[uuid.UUID, ...]
    supported_by: tuple[uuid.UUID, ...]


@dataclass(frozen=True)
class Plan:
    """What one extraction changes, for the episodes it was made from."""

    episode_ids: tuple[uuid.UUID, ...]
    facts: tuple[PlannedFact, ...] = ()
    rules: tuple[PlannedRule, ...] = ()
    confirmations: tuple[tuple[str, uuid.UUID, tuple[uuid.UUID, ...]], ...] = ()  # (kind, id, sources)
    contradictions: tuple[tuple[uuid.UUID, tuple[uuid.UUID, ...], str], ...] = ()  # (fact id, sources, note)

    def texts(self) -> list[str]:
        """The texts to embed, facts first then rules (the order apply_plan reads the vectors in)."""
        return [embedding_text("fact", f.write) for f in self.facts] + [r.write.content for r in self.rules]


def plan_extraction(
    extraction: Extraction,
    *,
    batch: Batch,
    episode_ids: Sequence[uuid.UUID],
    group: str,
    extractor: str,
    global_predicates: Collection[str] = (),
) -> Plan:
    """Turn a validated extraction into writes; a write the schema refuses is an ExtractionError.

    Scope is policy, not the extractor's say: what a batch learns belongs to its butler, except facts whose
    predicate is one of ``global_predicates`` (consolidation.global_predicates), which every butler may read.
    """

    def new_id(kind: str, n: int) -> uuid.UUID:
        return uuid.uuid5(ID_NAMESPACE, f"{batch.tenant_id}|{batch.idempotency_key}|{group}|{kind}|{n}")

    def meta(sources: list[str]) -> dict[str, Any]:
        return {"source_episode_ids": sources, "consolidation_run": batch.idempotency_key, "extractor": extractor}

    def scope(predicate: str | None = None) -> str:
        return "global" if predicate is not None and base_predicate(predicate) in global_predicates else batch.butler

    when = {str(e.id): e.occurred_at for e in batch.episodes}
    planned_facts = tuple(
        PlannedFact(
            new_id("fact", n),
            _checked(
                FactWrite,
                f"facts[{n}]",
                {
                    "subject": f.subject,
                    "predicate": f.predicate,
                    "content": f.content,
                    "importance": f.importance,
                    "permanence": f.permanence,
                    "scope": scope(f.predicate),
                    "source_episode_id": f.source_episode_ids[0],
                    "metadata": meta(f.source_episode_ids),
                },
            ),
            _uuids(f.source_episode_ids),
            uuid.UUID(f.supersedes_fact_id) if f.supersedes_fact_id else None,
            max(when[e] for e in f.source_episode_ids),
        )
        for n, f in enumerate(extraction.facts)
    )

    def supporter(ref: str) -> uuid.UUID:
        match = NEW_FACT_REF.fullmatch(ref)
        return planned_facts[int(match.group(1))].id if match else uuid.UUID(ref)

    planned_rules = tuple(
        PlannedRule(
            new_id("rule", n),
            _checked(
                RuleWrite,
                f"rules[{n}]",
                {
                    "content": r.content,
                    "scope": scope(),
                    "source_episode_id": r.source_episode_ids[0],
                    "metadata": meta(r.source_episode_ids),
                },
            ),
            _uuids(r.source_episode_ids),
            tuple(supporter(ref) for ref in r.supporting_fact_refs),
        )
        for n, r in enumerate(extraction.rules)
    )
    return Plan(
        episode_ids=tuple(episode_ids),
        facts=planned_facts,
        rules=planned_rules,
        confirmations=tuple(
            ("fact" if c.fact_id else "rule", uuid.UUID(c.fact_id or c.rule_id or ""), _uuids(c.source_episode_ids))
            for c in extraction.confirmations
        ),
        contradictions=tuple(
            (uuid.UUID(c.fact_id), _uuids(c.source_episode_ids), c.note) for c in extraction.contradictions
        ),
    )


def _checked(model: type, where: str, data: dict[str, Any]) -> Any:
    try:
        return parse(model, data)
    except ButlerError as exc:
        raise ExtractionError(f"{where}: {exc.message}", field=where) from None


def _uuids(values: Sequence[str]) -> tuple[uuid.UUID, ...]:
    return tuple(uuid.UUID(v) for v in values)
