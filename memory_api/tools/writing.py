"""Write tools: validate, check the butler is the token's, record the write durably (one transaction), wake the
shard's worker after commit, and answer "accepted" with the id. The worker applies it moments later."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field, StringConstraints
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from memory_api.tools import access
from memory_api.tools.params import (
    Butler,
    Content,
    EpisodeItem,
    IdempotencyKey,
    Importance,
    Lineage,
    OccurredAt,
    Permanence,
    Tags,
    WriteScope,
)
from memory_api.tools.results import AcceptedItem, BatchAccepted, WriteAccepted
from memory_api.tools.runtime import Call, current_call, tool_call, utcnow
from memory_api.tools.services import opened
from shared import intake, protection, tracing
from shared.db import unit_of_work
from shared.errors import IdempotencyConflict, InvalidInput, Unavailable
from shared.intake import Accepted, WriteRequest
from shared.schemas import EpisodeWrite, FactWrite, RuleWrite, check_occurred_at, parse

log = logging.getLogger("memory_butler.api")
SUBJECT = StringConstraints(strip_whitespace=True, min_length=1, max_length=200)  # as FactWrite


def _given(**values: Any) -> dict[str, Any]:
    """The arguments the caller passed (None = not passed, so the write model's default applies)."""
    return {k: v for k, v in values.items() if v is not None}


def _check_size(call: Call, field: str, value: str) -> None:
    cap = call.services.settings.api.max_content_chars
    if len(value) > cap:
        raise InvalidInput(f"{field}: at most {cap} characters (got {len(value)})", field=field)


async def _accept(call: Call, writes: Sequence[WriteRequest], *, actor: str) -> list[Accepted]:
    """Durably accept ``writes``, then wake each shard's worker (never waiting on the broker).

    Most calls are one statement on the event loop that assumes no key was used before (one round trip, no thread);
    a replay, or a batch over several butlers, is a transaction on a write thread that looks the keys up first and
    finds the earlier write (or, on its second try, a concurrent writer's)."""
    common: dict[str, Any] = {
        "tenant_id": call.tenant,
        "writes": writes,
        "actor": actor,
        "request_id": call.request_id,
        "trace_context": tracing.current_carrier(),  # None when tracing is off
    }
    accepted: list[Accepted] | None = None
    if intake.fresh_in_one_statement(writes):
        try:
            accepted = await call.accept(lambda conn: intake.accept_fresh(conn, **common))
        except intake.ConcurrentReplay:
            pass  # a key accepted before: the look-up below finds it
    if accepted is None:
        engine = opened(call.services.write_engine)

        def work() -> list[Accepted]:
            retrying = Retrying(
                retry=retry_if_exception_type(intake.ConcurrentReplay), stop=stop_after_attempt(2), reraise=True
            )
            try:
                for attempt in retrying:
                    with attempt, unit_of_work(engine) as conn:
                        return intake.accept(conn, **common)
            except intake.ConcurrentReplay:
                raise Unavailable("a concurrent write with the same idempotency_key is in flight; retry") from None
            raise AssertionError("unreachable")

        accepted = await call.write(work)
    call.wrote(a.id for a in accepted)  # memory_get of these ids reads where the intents are
    for butler in sorted({a.butler for a in accepted}):
        _wake(call, butler)
    return accepted


def _wake(call: Call, butler: str) -> None:
    """A lost wake-up only delays applying (the redelivery sweep re-sends it); it never fails the write."""
    try:
        call.services.publisher.wake_apply(call.tenant, butler)
    except Exception:  # noqa: BLE001
        log.warning(
            "wake-up not published",
            exc_info=True,
            extra={"tenant": call.tenant, "butler": butler, "request_id": call.request_id},
        )


def _request(
    call: Call, kind: str, write: protection.W, butler: str, key: str | None, key_field: str = "idempotency_key"
) -> WriteRequest:
    """The write as it may be stored: redacted and, for a listed predicate, sealed (before the outbox row). A replay
    is matched on what the caller sent: sealing draws a fresh nonce, and a policy may change between two tries."""
    settings = call.services.settings
    stored = protection.protect(
        write, tenant_id=call.tenant, redaction=settings.redaction, encryption=settings.encryption
    )
    return WriteRequest(
        kind=kind,
        butler=butler,
        payload=stored.model_dump(mode="json"),
        idempotency_key=key,
        key_field=key_field,
        payload_hash=intake.payload_hash(kind, write.model_dump(mode="json")),
    )


async def _store_one(call: Call, kind: str, write: protection.W, butler: str, key: str | None) -> WriteAccepted:
    request = _request(call, kind, write, butler, key)
    (accepted,) = await _accept(call, [request], actor=butler)
    if accepted.kind != kind:
        raise IdempotencyConflict(
            f"idempotency_key: already used for a {accepted.kind} ({accepted.id})", field="idempotency_key"
        )
    return WriteAccepted(
        type=kind,
        id=str(accepted.id),
        butler=accepted.butler,
        idempotency_key=key,
        replayed=accepted.replayed,
        request_id=call.request_id,
    )


@tool_call
async def memory_store_episode(
    ctx: Context,
    content: Content,
    butler: Butler,
    session_id: uuid.UUID | None = None,
    importance: Importance | None = None,
    occurred_at: OccurredAt | None = None,
    idempotency_key: IdempotencyKey | None = None,
    request_context: Lineage | None = None,
) -> WriteAccepted:
    """Store a raw episode: what happened in a session, in plain language ("User asked to move the dentist to a
    morning slot"). Call it at the end of a session (the butler daemon usually does) or when something notable
    happens. Episodes are raw observations; consolidation later turns the notable ones into facts and rules.
    Returns status "accepted" with the episode id within milliseconds; the memory is searchable moments later.
    `butler` must be one your token covers. Pass an idempotency_key to make retries safe."""
    call = current_call()
    access.require_butler(call.principal, butler)
    _check_size(call, "content", content)
    check_occurred_at(occurred_at, now=utcnow())
    write = parse(
        EpisodeWrite,
        _given(content=content, butler=butler, session_id=session_id, importance=importance, occurred_at=occurred_at),
    )
    return await _store_one(call, "episode", write, butler, idempotency_key)


@tool_call
async def memory_store_fact(
    ctx: Context,
    subject: Annotated[str, SUBJECT, Field(description="Who or what the fact is about, e.g. 'user'.")],
    predicate: Annotated[str, SUBJECT, Field(description="The property, e.g. 'favorite_color' or 'allergy'.")],
    content: Content,
    importance: Importance | None = None,
    permanence: Annotated[
        Permanence,
        Field(
            description=(
                "How fast confidence decays: permanent (identity, medical), stable (~1 y), standard (~3 months, default), "
                "volatile (~3 weeks), ephemeral (~1 week)."
            )
        ),
    ]
    | None = None,
    scope: WriteScope | None = None,
    tags: Tags | None = None,
    idempotency_key: IdempotencyKey | None = None,
    request_context: Lineage | None = None,
) -> WriteAccepted:
    """Store a fact you learned mid-session ("user / favorite_color / The user's favorite color is green").
    A newer fact with the same subject and predicate in the same scope supersedes the older one automatically,
    so store corrections the same way. Returns status "accepted" with the fact id; it is applied moments later
    (memory_get says "pending" until then)."""
    call = current_call()
    _check_size(call, "content", content)
    write = parse(
        FactWrite,
        _given(
            subject=subject,
            predicate=predicate,
            content=content,
            importance=importance,
            permanence=permanence,
            scope=scope,
            tags=tags,
        ),
    )
    butler = access.shard_butler(call.principal, write.scope)
    return await _store_one(call, "fact", write, butler, idempotency_key)


@tool_call
async def memory_store_rule(
    ctx: Context,
    content: Content,
    scope: WriteScope | None = None,
    tags: Tags | None = None,
    idempotency_key: IdempotencyKey | None = None,
    request_context: Lineage | None = None,
) -> WriteAccepted:
    """Store a behavioural rule you discovered ("Always confirm before sending outbound messages"). New rules
    start as candidates and earn trust through memory_mark_helpful / memory_mark_harmful. Returns status
    "accepted" with the rule id."""
    call = current_call()
    _check_size(call, "content", content)
    write = parse(RuleWrite, _given(content=content, scope=scope, tags=tags))
    butler = access.shard_butler(call.principal, write.scope)
    return await _store_one(call, "rule", write, butler, idempotency_key)


@tool_call
async def memory_ingest_batch(
    ctx: Context,
    episodes: Annotated[
        list[EpisodeItem],
        Field(
            min_length=1,
            description=(
                "Episodes to store, each {content, butler, session_id?, importance?, occurred_at?, idempotency_key?}."
            ),
        ),
    ],
    request_context: Lineage | None = None,
) -> BatchAccepted:
    """Store many episodes in one call (bulk import, or a daemon flushing a queue): all are accepted together
    or none is. Same rules as memory_store_episode for each item; at most api.max_batch (default 500) items.
    Returns one {id, butler, idempotency_key, replayed} per item, in order."""
    call = current_call()
    cap = call.services.settings.api.max_batch
    if len(episodes) > cap:
        raise InvalidInput(f"episodes: at most {cap} per call (got {len(episodes)})", field="episodes")
    requests = [_episode_request(call, i, item) for i, item in enumerate(episodes)]
    accepted = await _accept(call, requests, actor=call.principal.default_butler)
    for i, a in enumerate(accepted):
        if a.kind != "episode":
            raise IdempotencyConflict(
                f"episodes.{i}.idempotency_key: already used for a {a.kind}", field=f"episodes.{i}.idempotency_key"
            )
    items = [
        AcceptedItem(id=str(a.id), butler=a.butler, idempotency_key=a.idempotency_key, replayed=a.replayed)
        for a in accepted
    ]
    return BatchAccepted(count=len(items), items=items, request_id=call.request_id)


def _episode_request(call: Call, index: int, item: EpisodeItem) -> WriteRequest:
    access.require_butler(call.principal, item.butler, field=f"episodes.{index}.butler")
    _check_size(call, f"episodes.{index}.content", item.content)
    check_occurred_at(item.occurred_at, now=utcnow(), field=f"episodes.{index}.occurred_at")
    try:
        write = parse(
            EpisodeWrite,
            _given(
                content=item.content,
                butler=item.butler,
                session_id=item.session_id,
                importance=item.importance,
                occurred_at=item.occurred_at,
            ),
        )
    except InvalidInput as exc:
        raise InvalidInput(f"episodes.{index}.{exc.message}", field=f"episodes.{index}.{exc.field}") from None
    return _request(
        call, "episode", write, item.butler, item.idempotency_key, key_field=f"episodes.{index}.idempotency_key"
    )
