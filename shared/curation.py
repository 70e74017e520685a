"""An operator's corrections from the dashboard: edit a fact (a new fact supersedes it, through
:func:`shared.writes.store_fact`), edit a rule (its maturity goes back to candidate), promote or demote a rule by
hand. Each runs inside the caller's one transaction, checks the state machines and appends memory_events rows.
Forget, restore and confirm are :mod:`shared.writes` itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy import Connection

from shared import repository as repo
from shared.consolidation_plan import embedding_text
from shared.context import content_tokens
from shared.embedding import ModelVersion, get_token_counter
from shared.errors import InvalidInput, InvalidTransition
from shared.lifecycle import RULE_MATURITIES, check_transition
from shared.schemas import FactWrite, RuleWrite, parse
from shared.scoring import decay_rate_for
from shared.writes import Actor, Visibility, load_visible, store_fact

Embed = Callable[[str], np.ndarray]
Protect = Callable[[Any], Any]  # a write -> the write as it may be stored
LIVE = ("active", "fading")
# Advice levels, lowest first: promote and demote move one step, as the rule maturity table allows.
LADDER = ("candidate", "established", "proven")


def edit_fact(
    conn: Connection,
    *,
    tenant_id: str,
    fact_id: uuid.UUID,
    changes: dict[str, Any],
    visibility: Visibility,
    actor: Actor,
    embed: Embed,
    version: ModelVersion,
    protect: Protect,
) -> dict[str, Any]:
    """Store the corrected fact under the same (scope, subject, predicate): store_fact supersedes the old one.

    Only a live fact can be corrected (active or fading): a superseded, expired or retracted one is history.
    The correction is dated by the database's clock, as accepted writes are: a front whose clock is behind must
    not make it look older than the fact it corrects. ``protect`` redacts (and seals) the new write as every write
    is (shared.protection.protect).
    """
    old = load_visible(conn, kind="fact", tenant_id=tenant_id, entity_id=fact_id, visibility=visibility, lock=True)
    if old["validity"] not in LIVE:
        check_transition("fact", old["validity"], "superseded")  # raises: the table has no way out of these
    if old["content_key_id"] is not None and "content" not in changes:  # its content column is only a surrogate
        raise InvalidInput("content: a sealed fact is corrected by giving its new content", field="content")
    write = protect(
        parse(
            FactWrite,
            {
                "subject": old["subject"],
                "predicate": old["predicate"],
                "scope": old["scope"],
                "content": changes.get("content", old["content"]),
                "importance": changes.get("importance", old["importance"]),
                "permanence": changes.get("permanence", old["permanence"]),
                "tags": changes.get("tags", old["tags"]),
                "source_episode_id": old["source_episode_id"],
                "metadata": {"edited_from": str(fact_id)},
            },
        )
    )
    new_id = uuid.uuid4()
    vector = embed(embedding_text("fact", write))
    out = store_fact(
        conn,
        tenant_id=tenant_id,
        fact_id=new_id,
        write=write,
        vector=vector,
        embedding_version_id=repo.embedding_version_id(conn, version),
        source_butler=actor.name,
        actor=actor,
        now=repo.database_now(conn),
    )
    if str(fact_id) not in out.get("superseded", []):
        raise InvalidTransition(f"fact {fact_id} was not the live fact of its key; nothing was edited", field="id")
    return {"id": str(new_id), "supersedes": str(fact_id)}


def edit_rule(
    conn: Connection,
    *,
    tenant_id: str,
    rule_id: uuid.UUID,
    changes: dict[str, Any],
    visibility: Visibility,
    actor: Actor,
    now: datetime,
    embed: Embed,
    version: ModelVersion,
    protect: Protect,
) -> dict[str, Any]:
    """Rewrite a rule in place; new advice has no evidence yet, so maturity returns to candidate and counts to 0.

    Its application history stays in rule_applications; the old text and counts are kept in the audit event.
    An anti-pattern cannot be edited back into advice (the maturity table has no way out of it).
    """
    old = load_visible(conn, kind="rule", tenant_id=tenant_id, entity_id=rule_id, visibility=visibility, lock=True)
    write = protect(
        parse(
            RuleWrite,
            {
                "content": changes.get("content", old["content"]),
                "scope": old["scope"],
                "tags": changes.get("tags", old["tags"]),
                "importance": changes.get("importance", old["importance"]),
                "permanence": changes.get("permanence", old["permanence"]),
            },
        )
    )
    if old["maturity"] != "candidate":
        check_transition("rule", old["maturity"], "candidate")
    values = {
        "content": write.content,
        "content_tokens": content_tokens([write.content], get_token_counter().count_many)[0],
        "embedding": embed(write.content),
        "embedding_version_id": repo.embedding_version_id(conn, version),
        "tags": write.tags,
        "importance": write.importance,
        "permanence": write.permanence,
        "decay_rate": decay_rate_for(write.permanence),
        "maturity": "candidate",
        "effectiveness_score": 0.0,
        "applied_count": 0,
        "success_count": 0,
        "harmful_count": 0,
        "last_confirmed_at": now,
    }
    repo.update_row(conn, kind="rule", entity_id=rule_id, values=values)
    repo.record_event(
        conn,
        tenant_id=tenant_id,
        event_type="rule.edited",
        entity_type="rule",
        entity_id=rule_id,
        actor=actor.name,
        request_id=actor.request_id,
        payload={
            "from_content": old["content"],
            "from_maturity": old["maturity"],
            "from_counts": {k: old[k] for k in ("applied_count", "success_count", "harmful_count")},
        },
    )
    if old["maturity"] != "candidate":
        _maturity_event(conn, tenant_id, rule_id, actor, old["maturity"], "candidate", "edited")
    return {"id": str(rule_id), "maturity": "candidate"}


def move_rule(
    conn: Connection,
    *,
    tenant_id: str,
    rule_id: uuid.UUID,
    direction: Literal["promote", "demote"],
    visibility: Visibility,
    actor: Actor,
) -> dict[str, Any]:
    """One step up or down the maturity ladder by an operator's decision, checked against the maturity table."""
    row = load_visible(conn, kind="rule", tenant_id=tenant_id, entity_id=rule_id, visibility=visibility, lock=True)
    current = row["maturity"]
    if row["validity"] not in LIVE:
        raise InvalidTransition(
            f"rule {rule_id} is {row['validity']}: restore it before changing its maturity", field="id"
        )
    step = 1 if direction == "promote" else -1
    index = LADDER.index(current) + step if current in LADDER else -1
    if not 0 <= index < len(LADDER):
        edge = "highest" if direction == "promote" else "lowest"
        reason = "an anti-pattern stays one" if current not in LADDER else f"{current!r} is the {edge} level"
        raise InvalidTransition(
            f"rule transition: cannot {direction} a rule that is {current!r} ({reason})", field="id"
        )
    target = LADDER[index]
    check_transition("rule", current, target)
    repo.update_row(conn, kind="rule", entity_id=rule_id, values={"maturity": target})
    _maturity_event(conn, tenant_id, rule_id, actor, current, target, direction)
    return {"id": str(rule_id), "maturity": target, "from": current}


def _maturity_event(
    conn: Connection, tenant_id: str, rule_id: uuid.UUID, actor: Actor, from_: str, to: str, cause: str
) -> None:
    assert to in RULE_MATURITIES
    repo.record_event(
        conn,
        tenant_id=tenant_id,
        event_type="rule.maturity_changed",
        entity_type="rule",
        entity_id=rule_id,
        actor=actor.name,
        request_id=actor.request_id,
        payload={"from": from_, "to": to, "manual": True, "cause": cause},
    )
