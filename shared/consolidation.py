"""Consolidation against the database: the key's lock, which episodes are due, and applying one run.

A *batch* is the oldest due episodes of one (tenant, butler), in seq order: pending ones, and failed ones whose
retry time has come (see :mod:`shared.consolidation_plan` for its identity and the pure planning). A run is
applied in one transaction that first re-reads the batch under row locks: if anybody consolidated or changed
it since it was read, or its idempotency key is already recorded, nothing is written (:class:`StaleBatch`).
Every episode of an applied batch ends in exactly one of consolidated, failed (with a retry time) or
dead_letter. Functions taking a Connection never commit; the worker's task owns the transactions.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, RowMapping, bindparam, exists, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from shared import repository as repo
from shared import writes
from shared.config import Settings
from shared.consolidation_plan import Batch, DueEpisode, Plan, fact_text, same_meaning
from shared.embedding import ModelVersion
from shared.errors import ButlerError
from shared.extraction import KnownFact, KnownRule
from shared.lifecycle import check_transition, consolidation_outcome
from shared.models import consolidation_runs, episodes, facts, rules
from shared.scoring import backoff_seconds
from shared.sharding import ShardKey
from shared.vocabulary import base_predicate
from shared.writes import ALL, Actor

log = logging.getLogger(__name__)

# The known memory shown to an extractor is bounded so a prompt stays a prompt: the most recently confirmed
# facts and rules. A fact outside the window is still superseded by store_fact (same key); it is only not
# *confirmed* when said again.
KNOWN_FACTS_LIMIT = 500
KNOWN_RULES_LIMIT = 200


def describe_error(exc: BaseException) -> str:
    """One line for last_error columns: a database error without its SQL and parameters (embeddings!)."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        detail = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
        return f"{type(exc.orig).__name__}: {detail}"[:2000]
    message = exc.message if isinstance(exc, ButlerError) else str(exc)
    return f"{type(exc).__name__}: {message}"[:2000]


# --- the lock -----------------------------------------------------------------------------------


@contextlib.contextmanager
def key_lock(engine: Engine, *, tenant_id: str, butler: str) -> Iterator[bool]:
    """Hold the key's consolidation lock for the block (a session advisory lock); False at once if it is taken.

    A session lock, not a transaction lock: it must also cover the extractor call, which runs outside any
    transaction (an LLM may take minutes; an idle-in-transaction connection would hold back vacuum).
    Postgres releases it by itself if this process dies.
    """
    key = ShardKey(tenant_id, butler).advisory_lock_key()
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar_one())
        try:
            yield got
        finally:
            if got:
                try:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                except Exception:  # noqa: BLE001 - never return a connection that may still hold the lock
                    log.warning("advisory unlock failed; closing the connection", exc_info=True)
                    conn.invalidate()


def _due(tenant_id: str, butler: str, now: datetime) -> Any:
    return (
        (episodes.c.tenant_id == tenant_id)
        & (episodes.c.butler == butler)
        & or_(
            episodes.c.consolidation_status == "pending",
            (episodes.c.consolidation_status == "failed") & (episodes.c.next_consolidation_retry_at <= now),
        )
    )


def fetch_batch(
    conn: Connection, *, tenant_id: str, butler: str, limit: int, now: datetime, max_tokens: int | None = None
) -> Batch | None:
    """The key's oldest due episodes, at most ``limit`` of them and ``max_tokens`` of their text (always at least
    one), with its known facts and rules; None when nothing is due."""
    started_at: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    rows = conn.execute(
        select(
            episodes.c.id,
            episodes.c.seq,
            episodes.c.content,
            episodes.c.created_at,
            episodes.c.occurred_at,
            episodes.c.importance,
            episodes.c.consolidation_status,
            episodes.c.consolidation_attempts,
            episodes.c.forgotten_at.is_not(None).label("forgotten"),
            episodes.c.content_tokens,
        )
        .where(_due(tenant_id, butler, now))
        .order_by(episodes.c.seq)
        .limit(limit)
    ).all()
    if not rows:
        return None
    chosen: list[DueEpisode] = []
    total = 0
    for row in rows:
        total += row.content_tokens if row.content_tokens is not None else len(row.content) // 4
        if chosen and max_tokens is not None and total > max_tokens:
            break
        chosen.append(DueEpisode(*row[:-1]))
    return Batch(
        tenant_id,
        butler,
        tuple(chosen),
        tuple(_known_facts(conn, tenant_id, butler)),
        tuple(_known_rules(conn, tenant_id, butler)),
        started_at,
    )


def has_due(conn: Connection, *, tenant_id: str, butler: str, now: datetime) -> bool:
    return bool(conn.execute(select(exists().where(_due(tenant_id, butler, now)))).scalar_one())


def _known_facts(conn: Connection, tenant_id: str, butler: str) -> list[KnownFact]:
    rows = conn.execute(
        select(facts.c.id, facts.c.subject, facts.c.predicate, facts.c.content, facts.c.permanence, facts.c.scope)
        .where(
            facts.c.tenant_id == tenant_id,
            facts.c.scope.in_(("global", butler)),
            facts.c.validity.in_(("active", "fading")),
        )
        .order_by(facts.c.last_confirmed_at.desc(), facts.c.id)
        .limit(KNOWN_FACTS_LIMIT)
    ).mappings()
    return [KnownFact(**{**r, "id": str(r["id"])}) for r in rows]


def _known_rules(conn: Connection, tenant_id: str, butler: str) -> list[KnownRule]:
    rows = conn.execute(
        select(rules.c.id, rules.c.content, rules.c.scope, rules.c.maturity)
        .where(
            rules.c.tenant_id == tenant_id,
            rules.c.scope.in_(("global", butler)),
            rules.c.validity.in_(("active", "fading")),
        )
        .order_by(rules.c.last_confirmed_at.desc(), rules.c.id)
        .limit(KNOWN_RULES_LIMIT)
    ).mappings()
    return [KnownRule(**{**r, "id": str(r["id"])}) for r in rows]


def still_due(conn: Connection, batch: Batch) -> bool:
    """Lock the batch's episodes and confirm nobody consolidated, forgot or restored them since the batch was read
    (an episode forgotten while its batch was being extracted must not be learned from: the batch is re-read)."""
    ids = [e.id for e in batch.episodes]
    current = {
        r.id: (r.consolidation_status, r.consolidation_attempts, r.forgotten)
        for r in conn.execute(
            select(
                episodes.c.id,
                episodes.c.consolidation_status,
                episodes.c.consolidation_attempts,
                episodes.c.forgotten_at.is_not(None).label("forgotten"),
            )
            .where(episodes.c.tenant_id == batch.tenant_id, episodes.c.id.in_(ids))
            .order_by(episodes.c.id)
            .with_for_update()
        )
    }
    if current != {e.id: (e.status, e.attempts, e.forgotten) for e in batch.episodes}:
        return False
    return not conn.execute(
        select(
            exists().where(
                consolidation_runs.c.tenant_id == batch.tenant_id,
                consolidation_runs.c.idempotency_key == batch.idempotency_key,
            )
        )
    ).scalar_one()


# --- applying a run -----------------------------------------------------------------------------


class StaleBatch(Exception):
    """The batch was consolidated or changed since it was read: nothing was applied."""


@dataclass(frozen=True)
class Failure:
    episode_id: uuid.UUID
    error: str


@dataclass(frozen=True)
class RunContext:
    """Who applies a run, with which extractor and embedding model, and when; ``jitter`` spreads retries."""

    settings: Settings
    worker: str  # the actor name, "worker:<celery hostname>"
    extractor: str
    embedding: ModelVersion
    now: datetime
    jitter: Callable[[], float]

    @property
    def actor(self) -> Actor:
        return Actor(self.worker)


def apply_run(
    conn: Connection,
    *,
    batch: Batch,
    plans: Sequence[Plan],
    vectors: np.ndarray,
    failures: Sequence[Failure],
    ctx: RunContext,
    isolate: bool,
) -> dict[str, Any]:
    """Apply a batch's plans and failures; ``vectors`` holds every plan's texts() embeddings, in order.

    With ``isolate``, a plan the database refuses rolls back to a savepoint and its episodes fail; without it
    the error propagates, so the caller can retry the batch one episode at a time. Raises StaleBatch.
    """
    if not still_due(conn, batch):
        raise StaleBatch(batch.idempotency_key)
    version_id = repo.embedding_version_id(conn, ctx.embedding)
    counts: Counter[str] = Counter()
    failures = list(failures)
    offset = 0
    for plan in plans:
        size = len(plan.texts())
        plan_vectors, offset = vectors[offset : offset + size], offset + size
        if not isolate:
            counts.update(
                apply_plan(conn, batch=batch, plan=plan, vectors=plan_vectors, version_id=version_id, ctx=ctx)
            )
            continue
        try:
            with conn.begin_nested():
                counts.update(
                    apply_plan(conn, batch=batch, plan=plan, vectors=plan_vectors, version_id=version_id, ctx=ctx)
                )
        except Exception as exc:  # noqa: BLE001 - a refused plan fails its own episodes, not the batch
            failures += [Failure(e, describe_error(exc)) for e in plan.episode_ids]
    counts.update(settle_episodes(conn, batch=batch, failures=failures, ctx=ctx))
    run_id = record_run(conn, batch=batch, counts=counts, failures=failures, ctx=ctx)
    return {**counts, "run_id": str(run_id), "idempotency_key": batch.idempotency_key}


def apply_plan(
    conn: Connection, *, batch: Batch, plan: Plan, vectors: np.ndarray, version_id: int | None, ctx: RunContext
) -> Counter[str]:
    """Store one plan's facts and rules, confirm and contradict, and link everything to its episodes."""
    counts: Counter[str] = Counter()
    links: list[dict[str, Any]] = []
    # Take every fact-key lock this plan needs up front, in one global order: two consolidations of one tenant
    # writing overlapping global keys in different orders would otherwise deadlock (seen in load tests).
    for scope, subject, predicate in sorted({(f.write.scope, f.write.subject, f.write.predicate) for f in plan.facts}):
        repo.lock_fact_key(conn, tenant_id=batch.tenant_id, scope=scope, subject=subject, predicate=predicate)
    match = ctx.settings.consolidation
    for planned, vector in zip(plan.facts, vectors[: len(plan.facts)], strict=True):
        known = next(
            iter(
                _known_like(
                    conn,
                    batch=batch,
                    kind="fact",
                    write=planned.write,
                    vector=vector,
                    threshold=match.fact_match_similarity,
                )
            ),
            None,
        )
        if known is not None:  # the same fact said another way: it confirms the one memory holds
            counts.update(
                _confirm_known(
                    conn, batch=batch, kind="fact", known=known, sources=planned.sources, ctx=ctx, links=links
                )
            )
            continue
        # Dated by what it was learned from: a fact of an older episode consolidated late enters the chain as
        # already superseded by a newer fact of its key (store_fact's late-write rule) instead of replacing it.
        result = writes.store_fact(
            conn,
            tenant_id=batch.tenant_id,
            fact_id=planned.id,
            write=planned.write,
            vector=vector,
            embedding_version_id=version_id,
            source_butler=batch.butler,
            actor=ctx.actor,
            now=min(planned.observed_at, ctx.now),
        )
        replaced = result.get("superseded", [])
        counts["facts"] += 1
        counts["superseded"] += len(replaced)
        if planned.supersedes and str(planned.supersedes) not in replaced and "superseded_by" not in result:
            counts["superseded"] += _supersede(
                conn,
                batch=batch,
                old=planned.supersedes,
                new=planned.id,
                point=not replaced,
                observed_at=planned.observed_at,
                ctx=ctx,
            )
        links += [_link(batch, ctx, "fact", planned.id, "episode", e, "derived_from") for e in planned.sources]
    for planned_rule, vector in zip(plan.rules, vectors[len(plan.facts) :], strict=True):
        same = _known_like(
            conn,
            batch=batch,
            kind="rule",
            write=planned_rule.write,
            vector=vector,
            threshold=match.rule_match_similarity,
        )
        known = next(iter(same), None)
        if known is not None and known["maturity"] == "anti_pattern":  # learned to be harmful: not learned again
            counts["blocked_by_anti_pattern"] += 1
            continue
        if known is not None:
            counts.update(
                _confirm_known(
                    conn, batch=batch, kind="rule", known=known, sources=planned_rule.sources, ctx=ctx, links=links
                )
            )
            counts["rules_merged"] += _merge_known(conn, batch=batch, same=same, ctx=ctx, links=links)
            continue
        writes.store_rule(
            conn,
            tenant_id=batch.tenant_id,
            rule_id=planned_rule.id,
            write=planned_rule.write,
            vector=vector,
            embedding_version_id=version_id,
            source_butler=batch.butler,
            actor=ctx.actor,
            now=ctx.now,
            rules=ctx.settings.memory.rules,
        )
        counts["rules"] += 1
        links += [
            _link(batch, ctx, "rule", planned_rule.id, "episode", e, "derived_from") for e in planned_rule.sources
        ]
        links += [_link(batch, ctx, "fact", f, "rule", planned_rule.id, "supports") for f in planned_rule.supported_by]
    links += _feedback(conn, batch=batch, plan=plan, ctx=ctx, counts=counts)
    repo.add_links(conn, links)
    counts["links"] += len(links)
    return counts


def _known_like(
    conn: Connection, *, batch: Batch, kind: str, write: Any, vector: np.ndarray, threshold: float
) -> list[RowMapping]:
    """The active or fading facts or rules of the write's scope (or global) that say the same thing, nearest first.

    Meaning is the stored embedding's cosine, checked by :func:`same_meaning` (numbers, names and polarity must
    agree). A fact must also have the write's subject and base predicate; an anti-pattern is compared by the
    rule it was inverted from.
    """
    if getattr(write, "sealed", None) is not None:
        # Its content is a surrogate, equal for every value of the predicate: meaning cannot be compared, so the
        # new fact supersedes the one of its key (store_fact) instead of confirming it.
        return []
    table = facts if kind == "fact" else rules
    distance = table.c.embedding.cosine_distance(vector).label("distance")
    query = (
        select(
            table.c.id,
            table.c.content,
            table.c.metadata,
            table.c.created_at,
            distance,
            *([table.c.maturity] if kind == "rule" else []),
        )
        .where(
            table.c.tenant_id == batch.tenant_id,
            table.c.scope.in_(("global", write.scope)),
            table.c.validity.in_(("active", "fading")),
            table.c.embedding.is_not(None),
        )
        .order_by(distance)
        .limit(5)
    )
    if kind == "fact":
        base = base_predicate(write.predicate)
        query = query.where(
            func.lower(table.c.subject) == write.subject.lower(),
            or_(table.c.predicate == base, table.c.predicate.like(base + "\\_%")),
        )
    new = write.content if kind == "rule" else fact_text(write.subject, write.predicate, write.content)
    out = []
    for row in conn.execute(query).mappings():
        said = (row["metadata"] or {}).get("original_content", row["content"]) if kind == "rule" else row["content"]
        if same_meaning(
            new,
            said if kind == "rule" else fact_text(write.subject, write.predicate, said),
            1.0 - float(row["distance"]),
            threshold,
        ):
            out.append(row)
    return out


def _merge_known(
    conn: Connection, *, batch: Batch, same: Sequence[RowMapping], ctx: RunContext, links: list[dict[str, Any]]
) -> int:
    """Known rules that a new rule and each other restate are merged into the oldest (shared.writes.merge_rules):
    duplicates learned before matching by meaning, or stored twice by callers. A ``supersedes`` link records it."""
    group = sorted((r for r in same if r["maturity"] != "anti_pattern"), key=lambda r: (r["created_at"], str(r["id"])))
    if len(group) < 2:
        return 0
    keep = group[0]["id"]
    merged = writes.merge_rules(
        conn,
        tenant_id=batch.tenant_id,
        keep=keep,
        duplicates=[r["id"] for r in group[1:]],
        actor=ctx.actor,
        now=ctx.now,
        rules=ctx.settings.memory.rules,
    )
    links += [_link(batch, ctx, "rule", keep, "rule", m, "supersedes") for m in merged]
    return len(merged)


def _confirm_known(
    conn: Connection,
    *,
    batch: Batch,
    kind: str,
    known: RowMapping,
    sources: Sequence[uuid.UUID],
    ctx: RunContext,
    links: list[dict[str, Any]],
) -> Counter[str]:
    """Confirm the known memory a new one restates (skipped, as in :func:`_feedback`, if it cannot be)."""
    try:
        with conn.begin_nested():
            writes.confirm(
                conn,
                tenant_id=batch.tenant_id,
                kind=kind,
                entity_id=known["id"],
                visibility=ALL,
                actor=ctx.actor,
                now=ctx.now,
            )
    except ButlerError as exc:
        log.info("confirmation skipped", extra={"kind": kind, "id": str(known["id"]), "error": exc.message})
        return Counter({"confirmations_skipped": 1})
    links += [_link(batch, ctx, "episode", e, kind, known["id"], "supports") for e in sources]
    return Counter({"confirmed": 1, f"{kind}s_matched": 1})


def _feedback(
    conn: Connection, *, batch: Batch, plan: Plan, ctx: RunContext, counts: Counter[str]
) -> list[dict[str, Any]]:
    """Confirmations (episode supports the memory) and contradictions (episode contradicts a fact)."""
    links = []
    for kind, target, sources in plan.confirmations:
        try:
            with conn.begin_nested():
                writes.confirm(
                    conn,
                    tenant_id=batch.tenant_id,
                    kind=kind,
                    entity_id=target,
                    visibility=ALL,
                    actor=ctx.actor,
                    now=ctx.now,
                )
        except ButlerError as exc:  # gone, superseded or forgotten meanwhile, or a second active fact: skip
            counts["confirmations_skipped"] += 1
            log.info("confirmation skipped", extra={"kind": kind, "id": str(target), "error": exc.message})
            continue
        counts["confirmed"] += 1
        links += [_link(batch, ctx, "episode", e, kind, target, "supports") for e in sources]
    events = []
    for fact_id, sources, note in plan.contradictions:
        counts["contradicted"] += 1
        links += [_link(batch, ctx, "episode", e, "fact", fact_id, "contradicts") for e in sources]
        events.append(
            {
                "tenant_id": batch.tenant_id,
                "event_type": "fact.contradicted",
                "entity_type": "fact",
                "entity_id": fact_id,
                "actor": ctx.worker,
                "request_id": None,
                "payload": {"episodes": [str(e) for e in sources], "note": note},
            }
        )
    repo.record_events(conn, events)
    return links


def _supersede(
    conn: Connection,
    *,
    batch: Batch,
    old: uuid.UUID,
    new: uuid.UUID,
    point: bool,
    observed_at: datetime,
    ctx: RunContext,
) -> int:
    """Supersede a fact of another key that the extractor says ``new`` replaces; 0 if it is no longer current
    or newer than what ``new`` was learned from."""
    row = repo.get_row(conn, kind="fact", tenant_id=batch.tenant_id, entity_id=old, lock=True)
    if row is None or row["validity"] not in ("active", "fading") or row["created_at"] > observed_at:
        return 0
    check_transition("fact", row["validity"], "superseded")
    repo.update_row(
        conn,
        kind="fact",
        entity_id=old,
        values={"validity": "superseded", "superseded_by_id": new, "superseded_at": ctx.now},
    )
    if point:  # the new fact's supersedes_id is free (store_fact replaced nothing of its own key)
        repo.update_row(conn, kind="fact", entity_id=new, values={"supersedes_id": old})
    repo.add_links(conn, [_link(batch, ctx, "fact", new, "fact", old, "supersedes")])
    repo.record_event(
        conn,
        tenant_id=batch.tenant_id,
        event_type="fact.superseded",
        entity_type="fact",
        entity_id=old,
        actor=ctx.worker,
        request_id=None,
        payload={"superseded_by": str(new)},
    )
    return 1


def _link(
    batch: Batch,
    ctx: RunContext,
    source_type: str,
    source_id: uuid.UUID,
    target_type: str,
    target_id: uuid.UUID,
    relation: str,
) -> dict[str, Any]:
    return {
        "tenant_id": batch.tenant_id,
        "source_type": source_type,
        "source_id": source_id,
        "target_type": target_type,
        "target_id": target_id,
        "relation": relation,
        "created_at": ctx.now,
    }


def settle_episodes(conn: Connection, *, batch: Batch, failures: Sequence[Failure], ctx: RunContext) -> Counter[str]:
    """Move every episode of the batch to consolidated, failed (retry time set) or dead_letter."""
    failed = {f.episode_id: f.error for f in failures}
    done = [e for e in batch.episodes if e.id not in failed]
    for status in {e.status for e in done}:
        check_transition("episode", status, "consolidated")
    if done:
        conn.execute(
            update(episodes)
            .where(episodes.c.tenant_id == batch.tenant_id, episodes.c.id.in_([e.id for e in done]))
            .values(
                consolidation_status="consolidated", next_consolidation_retry_at=None, last_consolidation_error=None
            )
        )
    events = [_episode_event(batch, ctx, e.id, "episode.consolidated", {"run": batch.idempotency_key}) for e in done]
    rows = [_failure_row(e, failed[e.id], ctx) for e in batch.episodes if e.id in failed]
    if rows:
        conn.execute(
            update(episodes)
            .where(episodes.c.tenant_id == batch.tenant_id, episodes.c.id == bindparam("b_id"))
            .values(
                consolidation_status=bindparam("b_status"),
                consolidation_attempts=bindparam("b_attempts"),
                last_consolidation_error=bindparam("b_error"),
                next_consolidation_retry_at=bindparam("b_retry_at"),
            ),
            rows,
        )
    events += [
        _episode_event(
            batch,
            ctx,
            r["b_id"],
            f"episode.{'dead_lettered' if r['b_status'] == 'dead_letter' else 'consolidation_failed'}",
            {
                "attempts": r["b_attempts"],
                "error": r["b_error"],
                "retry_at": r["b_retry_at"].isoformat() if r["b_retry_at"] else None,
            },
        )
        for r in rows
    ]
    repo.record_events(conn, events)
    return Counter({"consolidated": len(done), **Counter(r["b_status"] for r in rows)})


def _failure_row(episode: DueEpisode, error: str, ctx: RunContext) -> dict[str, Any]:
    attempts = episode.attempts + 1
    status = consolidation_outcome(attempts=attempts, max_attempts=ctx.settings.consolidation.max_attempts)
    check_transition("episode", episode.status, status)
    cfg = ctx.settings.consolidation
    retry_at = (
        ctx.now
        + timedelta(
            seconds=backoff_seconds(
                attempt=attempts, base=cfg.backoff_base_seconds, cap=cfg.backoff_max_seconds, jitter=ctx.jitter()
            )
        )
        if status == "failed"
        else None
    )
    return {"b_id": episode.id, "b_status": status, "b_attempts": attempts, "b_error": error, "b_retry_at": retry_at}


def _episode_event(
    batch: Batch, ctx: RunContext, episode_id: uuid.UUID, event_type: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {
        "tenant_id": batch.tenant_id,
        "event_type": event_type,
        "entity_type": "episode",
        "entity_id": episode_id,
        "actor": ctx.worker,
        "request_id": None,
        "payload": payload,
    }


def record_run(
    conn: Connection, *, batch: Batch, counts: Counter[str], failures: Sequence[Failure], ctx: RunContext
) -> uuid.UUID:
    """The consolidation_runs row (finished_at = clock_timestamp() at insert); its unique key is the last guard."""
    outcome = "consolidated" if not failures else "failed" if len(failures) == len(batch.episodes) else "partial"
    summary = {**counts, "errors": [f.error for f in failures[:5]]}
    run_id = conn.execute(
        pg_insert(consolidation_runs)
        .values(
            id=uuid.uuid4(),
            tenant_id=batch.tenant_id,
            butler=batch.butler,
            idempotency_key=batch.idempotency_key,
            extractor=ctx.extractor,
            first_seq=batch.episodes[0].seq,
            last_seq=batch.episodes[-1].seq,
            episode_count=len(batch.episodes),
            outcome=outcome,
            started_at=batch.started_at,
            worker=ctx.worker,
            summary=summary,
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
        .returning(consolidation_runs.c.id)
    ).scalar_one_or_none()
    if run_id is None:
        raise StaleBatch(batch.idempotency_key)
    repo.record_event(
        conn,
        tenant_id=batch.tenant_id,
        event_type="consolidation.run",
        entity_type="consolidation_run",
        entity_id=run_id,
        actor=ctx.worker,
        request_id=None,
        payload={"butler": batch.butler, "outcome": outcome, **summary},
    )
    return run_id
