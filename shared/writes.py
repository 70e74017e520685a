"""The write services: store, supersede, confirm, feedback, forget/restore. Each runs inside the caller's one
transaction and appends its memory_events rows in that same transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, RowMapping

from shared import forgetting
from shared import repository as repo
from shared.config import RuleSettings
from shared.context import content_tokens
from shared.embedding import get_token_counter
from shared.errors import IntegrityViolation, InvalidInput, InvalidTransition, NotFound, Pending, PermissionDenied
from shared.lifecycle import anti_pattern_content, check_transition, next_maturity, rule_evidence
from shared.protection import redaction_counts, sealed_columns
from shared.schemas import EpisodeWrite, FactWrite, RuleWrite
from shared.scoring import decay_rate_for


@dataclass(frozen=True)
class Actor:
    """Who performs a mutation, and the request lineage to keep in memory_events."""

    name: str
    request_id: str | None = None


@dataclass(frozen=True)
class Visibility:
    """What a caller may see: scopes for facts/rules and butlers for episodes (None means all, for admins)."""

    scopes: tuple[str, ...] | None
    butlers: tuple[str, ...] | None

    def allows(self, kind: str, row: RowMapping) -> bool:
        if kind == "episode":
            return self.butlers is None or row["butler"] in self.butlers
        return self.scopes is None or row["scope"] in self.scopes


ALL = Visibility(scopes=None, butlers=None)


@dataclass(frozen=True)
class NewEpisode:
    id: uuid.UUID
    seq: int
    write: EpisodeWrite
    request_id: str | None
    accepted_at: datetime


def insert_episodes(
    conn: Connection,
    *,
    tenant_id: str,
    episodes: Sequence[NewEpisode],
    vectors: np.ndarray,
    embedding_version_id: int,
    ttl_days: float,
    actor: Actor,
) -> int:
    """Insert a batch of episodes (already-present ids are skipped: replays change nothing). Returns rows written."""
    present = repo.existing_ids(conn, kind="episode", tenant_id=tenant_id, ids=[e.id for e in episodes])
    new = [(episode, vector) for episode, vector in zip(episodes, vectors, strict=True) if episode.id not in present]
    tokens = _tokens([episode.write.content for episode, _ in new])  # one tokenizer call for the batch
    rows, events = [], []
    for (episode, vector), n_tokens in zip(new, tokens, strict=True):
        w = episode.write
        rows.append(
            {
                "id": episode.id,
                "tenant_id": tenant_id,
                "butler": w.butler,
                "seq": episode.seq,
                "session_id": w.session_id,
                "content": w.content,
                "content_tokens": n_tokens,
                "embedding": vector,
                "embedding_version_id": embedding_version_id,
                "importance": w.importance,
                # Recency and order count from when it happened; expiry from when it was accepted (an import of
                # last year's history must not expire on arrival).
                "occurred_at": w.occurred_at or episode.accepted_at,
                "created_at": episode.accepted_at,
                "last_referenced_at": w.occurred_at or episode.accepted_at,
                "expires_at": episode.accepted_at + timedelta(days=ttl_days),
                "request_id": episode.request_id,
                "metadata": w.metadata,
            }
        )
        events.append(
            {
                "tenant_id": tenant_id,
                "event_type": "episode.stored",
                "entity_type": "episode",
                "entity_id": episode.id,
                "actor": actor.name,
                "request_id": episode.request_id,
                "payload": {"butler": w.butler, "seq": episode.seq, **_audit(w)},
            }
        )
    repo.insert_rows(conn, kind="episode", rows=rows)
    repo.record_events(conn, events)
    return len(rows)


def store_fact(
    conn: Connection,
    *,
    tenant_id: str,
    fact_id: uuid.UUID,
    write: FactWrite,
    vector: np.ndarray,
    embedding_version_id: int | None,
    source_butler: str | None,
    actor: Actor,
    now: datetime,
) -> dict[str, Any]:
    """Store a fact; the active (or fading) fact with the same (tenant, scope, subject, predicate) is superseded.

    Writers of one key are serialised by an advisory lock, and the partial unique index is the last word.
    Storing an id that exists already changes nothing (replays are no-ops).
    """
    if repo.exists(conn, kind="fact", entity_id=fact_id):
        return {"id": str(fact_id), "replayed": True}
    repo.lock_fact_key(conn, tenant_id=tenant_id, scope=write.scope, subject=write.subject, predicate=write.predicate)
    previous = repo.current_facts_for_key(
        conn, tenant_id=tenant_id, scope=write.scope, subject=write.subject, predicate=write.predicate
    )
    if previous and previous[0]["created_at"] > now:
        # A retried write older than the active fact (accepted earlier, applied later): the latest accepted
        # write wins, so this one enters the chain as already superseded by the newer fact.
        return _store_late_fact(
            conn,
            tenant_id=tenant_id,
            fact_id=fact_id,
            write=write,
            vector=vector,
            embedding_version_id=embedding_version_id,
            source_butler=source_butler,
            actor=actor,
            now=now,
            newer=previous[0]["id"],
        )
    for old in previous:
        check_transition("fact", old["validity"], "superseded")
        repo.update_row(
            conn,
            kind="fact",
            entity_id=old["id"],
            values={"validity": "superseded", "superseded_by_id": fact_id, "superseded_at": now},
        )
    supersedes = previous[0]["id"] if previous else None
    repo.insert_rows(
        conn,
        kind="fact",
        rows=[
            _fact_row(
                tenant_id=tenant_id,
                fact_id=fact_id,
                write=write,
                vector=vector,
                embedding_version_id=embedding_version_id,
                source_butler=source_butler,
                actor=actor,
                now=now,
                supersedes=supersedes,
            )
        ],
    )
    repo.add_links(
        conn,
        [
            {
                "tenant_id": tenant_id,
                "source_type": "fact",
                "source_id": fact_id,
                "target_type": "fact",
                "target_id": old["id"],
                "relation": "supersedes",
                "created_at": now,
            }
            for old in previous
        ],
    )
    events = [
        _event(
            tenant_id,
            "fact.stored",
            "fact",
            fact_id,
            actor,
            {
                "subject": write.subject,
                "predicate": write.predicate,
                "scope": write.scope,
                "supersedes": str(supersedes) if supersedes else None,
                **_audit(write),
            },
        )
    ]
    events += [
        _event(tenant_id, "fact.superseded", "fact", old["id"], actor, {"superseded_by": str(fact_id)})
        for old in previous
    ]
    repo.record_events(conn, events)
    return {"id": str(fact_id), "superseded": [str(o["id"]) for o in previous]}


def _fact_row(
    *,
    tenant_id: str,
    fact_id: uuid.UUID,
    write: FactWrite,
    vector: np.ndarray,
    embedding_version_id: int | None,
    source_butler: str | None,
    actor: Actor,
    now: datetime,
    supersedes: uuid.UUID | None,
    validity: str = "active",
    superseded_by: uuid.UUID | None = None,
) -> dict[str, Any]:
    return {
        "id": fact_id,
        "tenant_id": tenant_id,
        "subject": write.subject,
        "predicate": write.predicate,
        "content": write.content,
        "content_tokens": _tokens([write.content])[0],
        "embedding": vector,
        "embedding_version_id": embedding_version_id,
        "importance": write.importance,
        "confidence": write.confidence,
        "decay_rate": decay_rate_for(write.permanence),
        "permanence": write.permanence,
        "source_butler": source_butler,
        "source_episode_id": write.source_episode_id,
        "supersedes_id": supersedes,
        "superseded_by_id": superseded_by,
        "superseded_at": now if superseded_by else None,
        "validity": validity,
        "scope": write.scope,
        "created_at": now,
        "last_referenced_at": now,
        "last_confirmed_at": now,
        "request_id": actor.request_id,
        "tags": write.tags,
        "metadata": write.metadata,
        **sealed_columns(write),
    }


def _store_late_fact(
    conn: Connection,
    *,
    tenant_id: str,
    fact_id: uuid.UUID,
    write: FactWrite,
    vector: np.ndarray,
    embedding_version_id: int | None,
    source_butler: str | None,
    actor: Actor,
    now: datetime,
    newer: uuid.UUID,
) -> dict[str, Any]:
    repo.insert_rows(
        conn,
        kind="fact",
        rows=[
            _fact_row(
                tenant_id=tenant_id,
                fact_id=fact_id,
                write=write,
                vector=vector,
                embedding_version_id=embedding_version_id,
                source_butler=source_butler,
                actor=actor,
                now=now,
                supersedes=None,
                validity="superseded",
                superseded_by=newer,
            )
        ],
    )
    repo.add_links(
        conn,
        [
            {
                "tenant_id": tenant_id,
                "source_type": "fact",
                "source_id": newer,
                "target_type": "fact",
                "target_id": fact_id,
                "relation": "supersedes",
                "created_at": now,
            }
        ],
    )
    repo.record_events(
        conn,
        [
            _event(
                tenant_id,
                "fact.stored",
                "fact",
                fact_id,
                actor,
                {
                    "subject": write.subject,
                    "predicate": write.predicate,
                    "scope": write.scope,
                    "superseded_by": str(newer),
                    "late": True,
                    **_audit(write),
                },
            )
        ],
    )
    return {"id": str(fact_id), "superseded": [], "superseded_by": str(newer)}


def store_rule(
    conn: Connection,
    *,
    tenant_id: str,
    rule_id: uuid.UUID,
    write: RuleWrite,
    vector: np.ndarray,
    embedding_version_id: int | None,
    source_butler: str | None,
    actor: Actor,
    now: datetime,
    rules: RuleSettings,
) -> dict[str, Any]:
    """Store a rule as a candidate with the baseline confidence. A replayed id changes nothing."""
    if repo.exists(conn, kind="rule", entity_id=rule_id):
        return {"id": str(rule_id), "replayed": True}
    repo.insert_rows(
        conn,
        kind="rule",
        rows=[
            {
                "id": rule_id,
                "tenant_id": tenant_id,
                "content": write.content,
                "content_tokens": _tokens([write.content])[0],
                "embedding": vector,
                "embedding_version_id": embedding_version_id,
                "scope": write.scope,
                "maturity": "candidate",
                "validity": "active",
                "importance": write.importance,
                "confidence": rules.baseline_confidence,
                "decay_rate": decay_rate_for(write.permanence),
                "permanence": write.permanence,
                "effectiveness_score": 0.0,
                "source_butler": source_butler,
                "source_episode_id": write.source_episode_id,
                "created_at": now,
                "last_confirmed_at": now,
                "last_referenced_at": now,
                "request_id": actor.request_id,
                "tags": write.tags,
                "metadata": write.metadata,
            }
        ],
    )
    repo.record_events(
        conn, [_event(tenant_id, "rule.stored", "rule", rule_id, actor, {"scope": write.scope, **_audit(write)})]
    )
    return {"id": str(rule_id)}


def load_visible(
    conn: Connection, *, kind: str, tenant_id: str, entity_id: uuid.UUID, visibility: Visibility, lock: bool = False
) -> RowMapping:
    """The row, or NotFound / Pending (accepted, not applied yet) / PermissionDenied (outside the caller's scope)."""
    row = repo.get_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, lock=lock)
    if row is None:
        intent = repo.intent_status(conn, tenant_id=tenant_id, entity_id=entity_id)
        if intent == "applied":  # applied after our first look (READ COMMITTED): the row is there now
            row = repo.get_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, lock=lock)
        elif intent == "pending":
            raise Pending(f"{kind} {entity_id} was accepted and is not applied yet", field="id")
        elif intent == "dead_letter":
            raise NotFound(f"{kind} {entity_id} was accepted but could not be applied (dead letter)", field="id")
    if row is None:
        raise NotFound(f"no {kind} with id {entity_id}", field="id")
    if not visibility.allows(kind, row):
        raise PermissionDenied(f"{kind} {entity_id} is outside the caller's scope", field="id")
    return row


def confirm(
    conn: Connection,
    *,
    tenant_id: str,
    kind: str,
    entity_id: uuid.UUID,
    visibility: Visibility,
    actor: Actor,
    now: datetime,
) -> dict[str, Any]:
    """Reset the decay anchor of a fact or rule; a fading (or expired) one becomes active again."""
    if kind not in ("fact", "rule"):
        raise InvalidInput("type: only a fact or a rule can be confirmed", field="type")
    row = load_visible(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, visibility=visibility, lock=True)
    if row["validity"] == "retracted":  # forgotten on purpose: only restore undoes a forget
        raise InvalidTransition(
            f"{kind} {entity_id} was forgotten; restore it (memory_restore) before confirming it", field="id"
        )
    values: dict[str, Any] = {"last_confirmed_at": now}
    if row["validity"] != "active":
        # Rule validity uses the fact validity machine (it has every rule state but "superseded").
        check_transition("fact", row["validity"], "active")
        values["validity"] = "active"
        if kind == "fact":
            _refuse_second_active(conn, tenant_id=tenant_id, row=row)
    repo.update_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, values=values)
    repo.record_event(
        conn,
        tenant_id=tenant_id,
        event_type=f"{kind}.confirmed",
        entity_type=kind,
        entity_id=entity_id,
        actor=actor.name,
        request_id=actor.request_id,
        payload={"from_validity": row["validity"]},
    )
    return {"id": str(entity_id), "validity": values.get("validity", row["validity"]), "last_confirmed_at": now}


def mark_rule(
    conn: Connection,
    *,
    tenant_id: str,
    rule_id: uuid.UUID,
    outcome: str,
    reason: str | None,
    visibility: Visibility,
    actor: Actor,
    now: datetime,
    rules: RuleSettings,
) -> dict[str, Any]:
    """Record one application outcome; update counters, effectiveness and maturity (inverting when due)."""
    row = load_visible(conn, kind="rule", tenant_id=tenant_id, entity_id=rule_id, visibility=visibility, lock=True)
    if row["validity"] == "retracted":
        raise InvalidTransition(
            f"rule {rule_id} was forgotten: feedback on it is refused (memory_restore first)", field="rule_id"
        )
    success = row["success_count"] + (outcome == "helpful")
    harmful = row["harmful_count"] + (outcome == "harmful")
    repo.add_rule_application(
        conn,
        tenant_id=tenant_id,
        rule_id=rule_id,
        outcome=outcome,
        reason=reason,
        actor=actor.name,
        request_id=actor.request_id,
        now=now,
    )
    evidence = rule_evidence(
        [(a["outcome"], a["occurred_at"]) for a in repo.rule_applications_of(conn, rule_id=rule_id)],
        now=now,
        half_life_days=rules.evidence_half_life_days,
    )
    maturity = next_maturity(
        maturity=row["maturity"],
        success_count=success,
        harmful_count=harmful,
        created_at=row["created_at"],
        now=now,
        rules=rules,
        recent_effectiveness=evidence.effectiveness,
    )
    values: dict[str, Any] = {
        "success_count": success,
        "harmful_count": harmful,
        "applied_count": row["applied_count"] + 1,
        "effectiveness_score": evidence.effectiveness,
        "last_applied_at": now,
        "last_evaluated_at": now,
        "maturity": maturity,
    }
    events = [_event(tenant_id, f"rule.marked_{outcome}", "rule", rule_id, actor, {"reason": reason})]
    if outcome == "helpful":  # a rule that just worked is confirmed (seed 003: confirmation resets decay)
        values["last_confirmed_at"] = now
        if row["validity"] != "active":
            check_transition("fact", row["validity"], "active")  # rule validity follows the fact machine
            values["validity"] = "active"
        events.append(
            _event(
                tenant_id,
                "rule.confirmed",
                "rule",
                rule_id,
                actor,
                {"from_validity": row["validity"], "by": "marked_helpful"},
            )
        )
    if maturity != row["maturity"]:
        check_transition("rule", row["maturity"], maturity)
        events.append(
            _event(
                tenant_id, "rule.maturity_changed", "rule", rule_id, actor, {"from": row["maturity"], "to": maturity}
            )
        )
    if maturity == "anti_pattern" and row["maturity"] != "anti_pattern":
        values["content"] = anti_pattern_content(row["content"], repo.harmful_reasons(conn, rule_id=rule_id))
        values["content_tokens"] = _tokens([values["content"]])[0]
        values["metadata"] = {**row["metadata"], "original_content": row["content"]}
        events.append(_event(tenant_id, "rule.inverted", "rule", rule_id, actor, {"content": values["content"]}))
    repo.update_row(conn, kind="rule", entity_id=rule_id, values=values)
    repo.record_events(conn, events)
    return {
        "id": str(rule_id),
        "maturity": maturity,
        "effectiveness_score": values["effectiveness_score"],
        "success_count": success,
        "harmful_count": harmful,
    }


MATURITY_ORDER = ("candidate", "established", "proven")


def merge_rules(
    conn: Connection,
    *,
    tenant_id: str,
    keep: uuid.UUID,
    duplicates: Sequence[uuid.UUID],
    actor: Actor,
    now: datetime,
    rules: RuleSettings,
) -> list[uuid.UUID]:
    """Rules found to say the same thing become one: ``keep`` (the oldest) takes the duplicates' applications and
    counters, is re-scored from that evidence and keeps the most mature standing among them; each duplicate is
    retracted (reversibly: memory_restore) with a ``rule.merged`` event. Anti-patterns and retracted rules are left
    alone. Returns the ids merged."""
    locked = {
        r["id"]: r
        for r in (
            repo.get_row(conn, kind="rule", tenant_id=tenant_id, entity_id=i, lock=True)
            for i in sorted({keep, *duplicates})
        )
        if r is not None
    }  # one lock order
    kept = locked.get(keep)
    merged = [
        locked[i]
        for i in duplicates
        if i in locked
        and i != keep
        and locked[i]["validity"] != "retracted"
        and locked[i]["maturity"] != "anti_pattern"
    ]
    if kept is None or kept["validity"] == "retracted" or kept["maturity"] == "anti_pattern" or not merged:
        return []
    repo.move_rule_applications(conn, tenant_id=tenant_id, from_ids=[r["id"] for r in merged], to_id=keep)
    evidence = rule_evidence(
        [(a["outcome"], a["occurred_at"]) for a in repo.rule_applications_of(conn, rule_id=keep)],
        now=now,
        half_life_days=rules.evidence_half_life_days,
    )
    group = [kept, *merged]
    repo.update_row(
        conn,
        kind="rule",
        entity_id=keep,
        values={
            "applied_count": sum(r["applied_count"] for r in group),
            "success_count": sum(r["success_count"] for r in group),
            "harmful_count": sum(r["harmful_count"] for r in group),
            "effectiveness_score": evidence.effectiveness,
            "maturity": max((r["maturity"] for r in group), key=MATURITY_ORDER.index),
        },
    )
    events = []
    for r in merged:
        check_transition("fact", r["validity"], "retracted")  # rule validity follows the fact machine
        repo.update_row(conn, kind="rule", entity_id=r["id"], values={"validity": "retracted"})
        events.append(_event(tenant_id, "rule.merged", "rule", r["id"], actor, {"merged_into": str(keep)}))
    repo.record_events(conn, events)
    return [r["id"] for r in merged]


def forget(
    conn: Connection,
    *,
    tenant_id: str,
    kind: str,
    entity_id: uuid.UUID,
    visibility: Visibility,
    actor: Actor,
    now: datetime,
) -> dict[str, Any]:
    """Facts become retracted; rules become retracted tombstones; episodes get forgotten_at. All reversible, and
    idempotent: forgetting what is already forgotten changes nothing (no second event)."""
    row = load_visible(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, visibility=visibility, lock=True)
    if (row["forgotten_at"] is not None) if kind == "episode" else row["validity"] == "retracted":
        return {"id": str(entity_id), "forgotten": True, "already": True}
    if kind == "episode":
        values: dict[str, Any] = {"forgotten_at": now}
    else:
        check_transition("fact", row["validity"], "retracted")
        values = {"validity": "retracted"}
    repo.update_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, values=values)
    # The text leaves the outbox and the audit trail at once; the memory itself stays restorable.
    scrubbed = forgetting.scrub_traces(conn, tenant_id=tenant_id, kind=kind, entity_id=entity_id)
    repo.record_event(
        conn,
        tenant_id=tenant_id,
        event_type=f"{kind}.forgotten",
        entity_type=kind,
        entity_id=entity_id,
        actor=actor.name,
        request_id=actor.request_id,
        payload={"from_validity": row.get("validity")},
    )
    retracted = (
        forgetting.retract_derived(
            conn, tenant_id=tenant_id, episode_id=entity_id, actor=actor.name, request_id=actor.request_id
        )
        if kind == "episode"
        else []
    )
    return {"id": str(entity_id), "forgotten": True, "retracted": retracted, **scrubbed}


def restore(
    conn: Connection, *, tenant_id: str, kind: str, entity_id: uuid.UUID, visibility: Visibility, actor: Actor
) -> dict[str, Any]:
    """Undo a forget. A fact comes back only if no other fact is active for its key (fail closed)."""
    row = load_visible(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, visibility=visibility, lock=True)
    if kind == "episode":
        values: dict[str, Any] = {"forgotten_at": None}
    elif kind == "fact" and row["superseded_by_id"] is not None:  # forgotten as history: back to history
        check_transition("fact", row["validity"], "superseded")
        values = {"validity": "superseded"}
    else:
        check_transition("fact", row["validity"], "active")
        if kind == "fact":
            _refuse_second_active(conn, tenant_id=tenant_id, row=row)
        values = {"validity": "active"}
    repo.update_row(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, values=values)
    repo.record_event(
        conn,
        tenant_id=tenant_id,
        event_type=f"{kind}.restored",
        entity_type=kind,
        entity_id=entity_id,
        actor=actor.name,
        request_id=actor.request_id,
    )
    derived = (
        forgetting.restore_derived(
            conn, tenant_id=tenant_id, episode_id=entity_id, actor=actor.name, request_id=actor.request_id
        )
        if kind == "episode"
        else {}
    )
    return {"id": str(entity_id), "restored": True, **derived}


def _audit(write: Any) -> dict[str, Any]:
    """What a *.stored event says about the write's protection: redactions per detector, the sealing key."""
    out: dict[str, Any] = {}
    if counts := redaction_counts(write):
        out["redactions"] = counts
    if getattr(write, "sealed", None) is not None:
        out["sealed_with"] = write.sealed.key_id
    return out


def _tokens(contents: Sequence[str]) -> list[int]:
    return content_tokens(contents, get_token_counter().count_many)


def _refuse_second_active(conn: Connection, *, tenant_id: str, row: RowMapping) -> None:
    """Reviving a fact must not make two facts active for one key: fail closed, classified."""
    repo.lock_fact_key(
        conn, tenant_id=tenant_id, scope=row["scope"], subject=row["subject"], predicate=row["predicate"]
    )
    others = [
        r
        for r in repo.current_facts_for_key(
            conn, tenant_id=tenant_id, scope=row["scope"], subject=row["subject"], predicate=row["predicate"]
        )
        if r["id"] != row["id"] and r["validity"] == "active"
    ]
    if others:
        raise IntegrityViolation(
            f"fact {row['id']} cannot become active: fact {others[0]['id']} is active for the same subject and predicate",
            field="id",
        )


def _event(
    tenant_id: str,
    event_type: str,
    entity_type: str,
    entity_id: uuid.UUID,
    actor: Actor,
    payload: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "event_type": event_type,
        "entity_type": entity_type,
        "entity_id": entity_id,
        "actor": actor.name,
        "request_id": actor.request_id,
        "payload": payload or {},
    }
