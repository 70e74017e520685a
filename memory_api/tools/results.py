"""What the tools answer: one pydantic model per result shape, so the SDK publishes each tool's outputSchema.

Every result carries ``request_id`` (the caller's ``request_context.request_id``, or one the front made up).
Read results carry ``degraded``/``reason``: true when the database did not answer in time and the result is empty.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.schemas import Hit, MemoryType


def lean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with pydantic's nullable ``anyOf: [{type: X, ...}, {type: null}]`` written as ``type: [X, "null"]``.

    The same values validate (a ``format`` applies to strings only), but a client that checks every result against
    the outputSchema (the MCP SDK does, with jsonschema) does half the work: measured in the client on a 20-hit search result,
    4.7 ms -> 2.5 ms of the butler's CPU per call (BENCHMARKS.md)."""
    schema = copy.deepcopy(schema)
    _lean(schema)
    return schema


def _lean(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _lean(item)
        return
    if not isinstance(node, dict):
        return
    options = node.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        (other,) = [o for o in options if o != {"type": "null"}]
        if isinstance(other.get("type"), str) and set(other) <= {"type", "format"}:
            del node["anyOf"]
            node.update(other, type=[other["type"], "null"])
    for value in node.values():
        _lean(value)


class _Result(BaseModel):
    request_id: str = Field(description="Echo of request_context.request_id (or the id the server assigned).")


class _Degradable(_Result):
    degraded: bool = Field(False, description="True when memory was unavailable: the result is empty, not absent.")
    reason: str | None = Field(None, description="Why the result is degraded.")


class WriteAccepted(_Result):
    """A write is durable and queued for applying; read it back with memory_get (it is 'pending' until applied)."""

    status: Literal["accepted"] = "accepted"
    type: MemoryType
    id: str
    butler: str = Field(description="The butler whose ordered shard applies this write.")
    idempotency_key: str | None = None
    replayed: bool = Field(description="True when this idempotency_key was accepted before: same id, nothing new.")


class AcceptedItem(BaseModel):
    id: str
    butler: str
    idempotency_key: str | None = None
    replayed: bool


class BatchAccepted(_Result):
    status: Literal["accepted"] = "accepted"
    count: int
    items: list[AcceptedItem] = Field(description="One entry per input episode, in input order.")


class Hits(_Degradable):
    results: list[Hit]
    count: int


class MemoryRecord(_Degradable):
    """status 'ok': memory holds the row and its links; 'pending': accepted, not applied yet (retry shortly)."""

    status: Literal["ok", "pending", "degraded"]
    type: MemoryType
    id: str
    memory: dict[str, Any] | None = None


class ContextBlock(_Degradable):
    butler: str
    context: str = Field(description="The '## Your Memory' block to put in the system prompt ('' if nothing fits).")
    tokens: int
    token_budget: int
    included: dict[str, list[str]] = Field(description="Section -> memory ids in the block, in order.")
    dropped: int = Field(description="Candidates left out to respect the token budget.")


class ContextBatch(_Degradable):
    results: list[ContextBlock] = Field(description="One block per request, in input order.")


class Confirmed(_Result):
    type: Literal["fact", "rule"]
    id: str
    validity: str
    last_confirmed_at: datetime
    replayed: bool = False  # an idempotency_key seen before: the first call's result, nothing recorded again


class RuleFeedback(_Result):
    rule_id: str
    outcome: Literal["helpful", "harmful"]
    maturity: str
    effectiveness_score: float
    success_count: int
    harmful_count: int
    replayed: bool = False  # an idempotency_key seen before: the first call's result, nothing recorded again


class Lifecycle(_Result):
    type: MemoryType
    id: str
    status: Literal["retracted", "restored"]  # "forgotten" is the legacy word for retracted (seed 001)


class Stats(_Degradable):
    scope: str | None
    stats: dict[str, Any]


class Event(BaseModel):
    id: int
    event_type: str
    entity_type: str
    entity_id: str | None
    occurred_at: datetime
    actor: str
    request_id: str | None
    payload: dict[str, Any]


class Activity(_Degradable):
    events: list[Event]
    next_cursor: int | None = Field(description="Pass as 'since' to continue after the last event returned.")


class DeadLetters(_Result):
    action: Literal["list", "show", "redrive", "drop"]
    items: list[dict[str, Any]] = Field(
        description=(
            "list: the dead letters; show: the one asked for (with its error and content); redrive: what was re-queued; "
            "drop: what was deleted."
        )
    )


class Purged(_Result):
    """A tenant erased: every row of it is gone; the tombstone (purge_id) is what remains, outside the tenant."""

    status: Literal["purged"] = "purged"
    tenant: str
    purge_id: int
    counts: dict[str, int] = Field(description="Rows deleted, by table.")
