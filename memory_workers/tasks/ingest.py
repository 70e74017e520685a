"""``memory.apply_writes``: apply one shard key's accepted write intents, in sequence order, in batches.

Each batch is one transaction: claim the oldest pending intents, embed all their texts in one model call,
insert the episodes in one statement, store facts and rules in sequence order, mark the intents applied.
A poison intent (bad payload, refused row) is isolated in a savepoint, counted by ``intake.mark_failed``
and dead-lettered after ``consolidation.max_attempts``. A bad payload is dead-lettered at once and the rest of
the batch commits without it; any other failure is retried after a jittered backoff (``workers.apply_backoff_*``,
on the database clock), and the key's later intents wait behind it until it is applied or dead-lettered.

Order within a key comes from a transaction-level advisory lock (apply's own, distinct from consolidation's):
a second task for the same key does not wait for it; it returns, and the holder re-checks for pending
intents after it let go of the lock, so no wake-up is lost between the two.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import Connection, RowMapping, text

from memory_workers.app import APPLY_TASK, app
from memory_workers.enqueue import apply_wakeup_taken, recheck_busy, wake_apply, wake_consolidate
from memory_workers.tasks import KeyRunSummary, Runtime, runtime, worker_name
from shared import conversation, intake, telemetry, tracing, writes
from shared import repository as repo
from shared.consolidation import describe_error
from shared.consolidation_plan import embedding_text
from shared.conversation import StoredEpisode
from shared.embedding import word_piece_offsets
from shared.db import unit_of_work
from shared.errors import InvalidInput, Unavailable
from shared.schemas import WRITE_MODELS, EpisodeWrite, parse
from shared.sharding import ShardKey
from shared.writes import Actor, NewEpisode

log = logging.getLogger(__name__)

# XORed into the shard key's lock so applying and consolidating one key never wait for each other.
APPLY_LOCK_SALT = 0x6170706C79  # "apply"
# Batches per task run before the task re-enqueues itself: a hot key yields its shard queue to the others.
MAX_BATCHES_PER_TASK = 40


def apply_lock_key(tenant_id: str, butler: str) -> int:
    return ShardKey(tenant_id, butler).advisory_lock_key() ^ APPLY_LOCK_SALT


@app.task(name=APPLY_TASK, bind=True)
def apply_writes(self: Any, tenant_id: str, butler: str) -> dict[str, Any]:
    """Apply the key's pending write intents, then wake consolidation if episodes were stored."""
    rt = runtime()
    actor = Actor(worker_name(self.request.hostname))
    try:  # before the claim: a write committed from here on sends a wake-up of its own
        apply_wakeup_taken(tenant_id, butler, settings=rt.settings)
    except Unavailable as exc:  # the marker expires on its own (WOKEN_TTL_S); until then the sweeps wake the key
        log.warning(
            "wake-up marker not cleared", extra={"tenant_id": tenant_id, "butler": butler, "error": exc.message}
        )
    summary = apply_pending(rt, tenant_id=tenant_id, butler=butler, actor=actor)
    log.info("writes applied", extra={"tenant_id": tenant_id, "butler": butler, **summary.as_dict()})
    if summary.counts["episode"] and rt.settings.consolidation.after_apply:
        _wake(wake_consolidate, rt, tenant_id, butler)
    if summary.more:
        _wake(wake_apply, rt, tenant_id, butler)
    elif summary.busy:
        _wake(recheck_busy, rt, tenant_id, butler, task_name=APPLY_TASK)
    elif summary.retry_in is not None:  # the key waits behind a failed intent: come back when its backoff ends
        _wake(wake_apply, rt, tenant_id, butler, countdown=summary.retry_in)
    return summary.as_dict()


def _wake(wake: Any, rt: Runtime, tenant_id: str, butler: str, **options: Any) -> None:
    try:
        wake(tenant_id, butler, settings=rt.settings, **options)
    except Unavailable as exc:  # the work is durable; the sweeps send the wake-up again
        log.warning("wake-up not sent", extra={"tenant_id": tenant_id, "butler": butler, "error": exc.message})


def apply_pending(
    rt: Runtime, *, tenant_id: str, butler: str, actor: Actor, max_batches: int = MAX_BATCHES_PER_TASK
) -> KeyRunSummary:
    """Apply batches until one comes back short; ``more`` is set if pending intents remain afterwards."""
    summary = KeyRunSummary()
    limit = rt.settings.workers.ingest_batch_size
    for _ in range(max_batches):
        claimed = _apply_round(rt, tenant_id=tenant_id, butler=butler, limit=limit, actor=actor, summary=summary)
        if claimed is None:
            summary.busy = True
            return summary
        if claimed < limit:
            break
    # Re-checked after the lock is released: a wake-up refused while this run held the key is not lost. A key
    # whose first intent waits out a backoff has no work now: it is woken again when the backoff ends.
    with unit_of_work(rt.engine, one_statement=True) as conn:
        # Without the key's lock, so without locking rows: a row this check locked would be skipped by the holder's
        # claim (SKIP LOCKED) and applied after later ones (seen with two worker hosts, tests/e2e/test_hosts.py).
        summary.more, summary.retry_in = intake.next_work(conn, tenant_id=tenant_id, butler=butler)
    return summary


def _apply_round(
    rt: Runtime, *, tenant_id: str, butler: str, limit: int, actor: Actor, summary: KeyRunSummary
) -> int | None:
    """One batch in one transaction; None if another worker holds the key. A failed batch is retried singly."""
    started = tracing.now_ns()
    try:
        with tracing.span("memory.apply_batch", tenant=tenant_id, butler=butler, limit=limit):
            with unit_of_work(rt.engine) as conn:
                if not _try_lock(conn, tenant_id, butler):
                    return None
                intents = intake.claim_pending(conn, tenant_id=tenant_id, butler=butler, limit=limit)
                outcomes: dict[Any, str] = {}
                counts = apply_batch(conn, rt, intents=intents, actor=actor, outcomes=outcomes)
            # After the commit: each write's own trace (stored with its intent) shows it applied (or failed).
            tracing.record_applied(intents, started_ns=started, outcomes=outcomes)
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:  # noqa: BLE001 - isolate whatever broke the batch (e.g. the embedder) to one intent
        log.warning(
            "batch failed; applying its intents one at a time",
            extra={"tenant_id": tenant_id, "butler": butler, "batch": limit, "error": describe_error(exc)},
        )
        if limit == 1:
            return _fail_oldest(rt, tenant_id=tenant_id, butler=butler, exc=exc, summary=summary)
        done = 0
        while done < limit and _apply_round(
            rt, tenant_id=tenant_id, butler=butler, limit=1, actor=actor, summary=summary
        ):
            done += 1
        return done
    summary.counts.update(counts)  # counted once committed
    summary.batches += 1
    return len(intents)


def _fail_oldest(rt: Runtime, *, tenant_id: str, butler: str, exc: Exception, summary: KeyRunSummary) -> int | None:
    """Count ``exc`` against the key's oldest pending intent: the one whose single-intent batch just failed."""
    with unit_of_work(rt.engine) as conn:
        if not _try_lock(conn, tenant_id, butler):
            return None
        intents = intake.claim_pending(conn, tenant_id=tenant_id, butler=butler, limit=1)
        outcomes = [_mark_failed(conn, rt, intent, exc) for intent in intents]
    summary.counts.update(outcomes)
    return len(intents)


def _try_lock(conn: Connection, tenant_id: str, butler: str) -> bool:
    return conn.execute(
        text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": apply_lock_key(tenant_id, butler)}
    ).scalar_one()


def apply_batch(
    conn: Connection,
    rt: Runtime,
    *,
    intents: Sequence[RowMapping],
    actor: Actor,
    outcomes: dict[Any, str] | None = None,
) -> Counter[str]:
    """Apply claimed intents (in seq order) inside the caller's transaction; returns counts by outcome.

    A failure that will be retried holds its key: whatever came after it is rolled back and stays pending, to
    apply after it (per-key order). A failure that dead-letters (a bad payload, the last attempt) holds nothing.
    ``outcomes``, if given, gets each intent's own: applied, retry or dead_letter (by intent id); an intent held
    behind a retried one gets none (it was not tried).
    """
    counts: Counter[str] = Counter()
    outcome = outcomes if outcomes is not None else {}
    if not intents:
        return counts
    savepoint = conn.begin_nested()
    applied, failures = _apply_all(conn, rt, intents=intents, actor=actor)
    held = _first_retried(rt, failures)
    if held is not None and any(i["seq"] > held[0]["seq"] for i in applied):
        savepoint.rollback()
        counts = apply_batch(
            conn, rt, intents=[i for i in intents if i["seq"] < held[0]["seq"]], actor=actor, outcomes=outcome
        )
        outcome[held[0]["id"]] = _mark_failed(conn, rt, *held)
        counts[outcome[held[0]["id"]]] += 1
        return counts
    savepoint.commit()
    now = datetime.now(timezone.utc)
    intake.mark_applied(conn, ids=[i["id"] for i in applied], now=now)
    for intent in applied:  # observed before the caller commits: a rolled-back batch is re-applied and re-observed
        telemetry.APPLY_LAG.labels(intent["kind"]).observe(max(0.0, (now - intent["created_at"]).total_seconds()))
    counts.update(i["kind"] for i in applied)
    outcome.update((i["id"], "applied") for i in applied)
    for intent, exc in failures:
        if held is None or intent["seq"] <= held[0]["seq"]:  # the ones after a held intent were not really tried
            outcome[intent["id"]] = _mark_failed(conn, rt, intent, exc)
            counts[outcome[intent["id"]]] += 1
    return counts


def _first_retried(rt: Runtime, failures: list[tuple[RowMapping, Exception]]) -> tuple[RowMapping, Exception] | None:
    """The earliest failure that will be tried again (not dead-lettered by this failure), if any."""
    retried = [
        (i, exc)
        for i, exc in failures
        if not isinstance(exc, InvalidInput) and i["attempts"] + 1 < rt.settings.consolidation.max_attempts
    ]
    return min(retried, key=lambda f: f[0]["seq"]) if retried else None


def _apply_all(
    conn: Connection, rt: Runtime, *, intents: Sequence[RowMapping], actor: Actor
) -> tuple[list[RowMapping], list[tuple[RowMapping, Exception]]]:
    """Every intent in its own savepoint (episodes in one statement first); returns (applied, failures)."""
    parsed: list[tuple[RowMapping, Any]] = []
    failures: list[tuple[RowMapping, Exception]] = []
    for intent in intents:
        try:
            parsed.append((intent, _parse(intent)))
        except InvalidInput as exc:
            failures.append((intent, exc))
    # One model call for the whole batch: batched inference amortises the model's per-call overhead.
    vectors = rt.embedder.embed([embedding_text(i["kind"], w) for i, w in parsed]) if parsed else np.zeros((0, 384))
    version_id = repo.embedding_version_id(conn, rt.embedder.version) if parsed else None
    items = [(i, w, v) for (i, w), v in zip(parsed, vectors, strict=True)]
    applied, refused = _insert_episodes(conn, rt, [x for x in items if x[0]["kind"] == "episode"], version_id, actor)
    failures += refused
    for intent, write, vector in (x for x in items if x[0]["kind"] != "episode"):
        try:
            with conn.begin_nested():
                _store(conn, rt, intent, write, vector, version_id, actor)
            applied.append(intent)
        except Exception as exc:  # noqa: BLE001 - a poison intent must not take the batch down
            failures.append((intent, exc))
    return applied, failures


def _parse(intent: RowMapping) -> Any:
    """The intent's validated write; an episode must belong to the shard key it was accepted under."""
    write = parse(WRITE_MODELS[intent["kind"]], intent["payload"])
    if isinstance(write, EpisodeWrite) and write.butler != intent["butler"]:
        raise InvalidInput(
            f"butler: payload says {write.butler!r}, the intent's key says {intent['butler']!r}", field="butler"
        )
    return write


def _insert_episodes(
    conn: Connection, rt: Runtime, items: list[tuple[RowMapping, Any, np.ndarray]], version_id: int | None, actor: Actor
) -> tuple[list[RowMapping], list[tuple[RowMapping, Exception]]]:
    """All episodes in one statement; if that fails, one savepoint each so only the bad ones are refused."""
    if not items:
        return [], []
    try:
        with conn.begin_nested():
            _insert(conn, rt, items, version_id, actor)
        return [i for i, _, _ in items], []
    except Exception as exc:  # noqa: BLE001 - find the culprit below
        if len(items) == 1:
            return [], [(items[0][0], exc)]
    applied, refused = [], []
    for item in items:
        ok, bad = _insert_episodes(conn, rt, [item], version_id, actor)
        applied += ok
        refused += bad
    return applied, refused


def _insert(
    conn: Connection, rt: Runtime, items: list[tuple[RowMapping, Any, np.ndarray]], version_id: int | None, actor: Actor
) -> None:
    assert version_id is not None  # the items are parsed intents: their model version was looked up
    episodes = [
        NewEpisode(id=i["id"], seq=i["seq"], write=w, request_id=i["request_id"], accepted_at=i["created_at"])
        for i, w, _ in items
    ]
    tenant_id = items[0][0]["tenant_id"]
    writes.insert_episodes(
        conn,
        tenant_id=tenant_id,
        episodes=episodes,
        vectors=np.stack([v for _, _, v in items]),
        embedding_version_id=version_id,
        ttl_days=rt.settings.memory.episodes.default_ttl_days,
        actor=actor,
    )
    conversation.index_episodes(
        conn,
        tenant_id=tenant_id,
        embed=rt.embedder.embed,
        offsets=word_piece_offsets,
        stored=[StoredEpisode(e.id, e.write.butler, e.write.session_id, e.write.content) for e in episodes],
    )


def _store(
    conn: Connection,
    rt: Runtime,
    intent: RowMapping,
    write: Any,
    vector: np.ndarray,
    version_id: int | None,
    actor: Actor,
) -> None:
    common = {
        "tenant_id": intent["tenant_id"],
        "write": write,
        "vector": vector,
        "embedding_version_id": version_id,
        "source_butler": intent["butler"],
        "actor": Actor(actor.name, intent["request_id"]),
        "now": intent["created_at"],
    }
    if intent["kind"] == "fact":
        writes.store_fact(conn, fact_id=intent["id"], **common)
    else:
        writes.store_rule(conn, rule_id=intent["id"], rules=rt.settings.memory.rules, **common)


def _mark_failed(conn: Connection, rt: Runtime, intent: RowMapping, exc: Exception) -> str:
    """Count the failure; a payload that fails validation never will pass, so it is dead-lettered at once."""
    max_attempts = 1 if isinstance(exc, InvalidInput) else rt.settings.consolidation.max_attempts
    workers = rt.settings.workers
    status = intake.mark_failed(
        conn,
        intent_id=intent["id"],
        error=describe_error(exc),
        max_attempts=max_attempts,
        backoff_base_s=workers.apply_backoff_base_seconds,
        backoff_max_s=workers.apply_backoff_max_seconds,
    )
    log.warning(
        "write intent failed",
        extra={
            "intent_id": str(intent["id"]),
            "kind": intent["kind"],
            "seq": intent["seq"],
            "status": status,
            "error": describe_error(exc),
        },
    )
    return "dead_letter" if status == "dead_letter" else "retry"
