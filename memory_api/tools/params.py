"""Tool argument types: each carries its bounds and a description, so the published inputSchema tells the agent
the rules and the SDK checks them (a broken rule comes back as ``invalid_input`` naming the field)."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from shared.schemas import MAX_CONTENT, MAX_TAGS, NAME_PATTERN, RequestContext

MAX_QUERY = 4_000  # a search query or trigger prompt; the embedding model reads ~256 tokens anyway
MAX_LIMIT = 100
MIN_TOKEN_BUDGET, MAX_TOKEN_BUDGET = 50, 32_000
MAX_ACTIVITY = 1_000

MemoryType = Literal["episode", "fact", "rule"]
Permanence = Literal["permanent", "stable", "standard", "volatile", "ephemeral"]
Mode = Literal["hybrid", "semantic", "keyword"]


Content = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_CONTENT),
    Field(description="The memory itself, in plain language."),
]
Query = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_QUERY),
    Field(description="What to look for, in plain language."),
]
Butler = Annotated[str, Field(pattern=NAME_PATTERN, description="A butler name, e.g. 'health' or 'finance'.")]
WriteScope = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        description="'global' (visible to every butler, the default) or a butler name your token covers.",
    ),
]
ReadScope = Annotated[
    str,
    Field(
        pattern=r"^(\*|[a-z0-9][a-z0-9_.-]{0,62})$",
        description="'global', or a butler your token covers (global + that butler's memories). "
        "Omit for global + all your butlers. '*' = every scope of the tenant (admin).",
    ),
]
Importance = Annotated[float, Field(ge=1, le=10, description="1 (trivia) to 10 (critical); default 5.")]
Tags = Annotated[
    list[Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]],
    Field(max_length=MAX_TAGS, description="Free-form labels."),
]
MemoryId = Annotated[uuid.UUID, Field(description="The memory's id (a UUID, as returned by a store or read).")]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"How many results, 1 to {MAX_LIMIT}.")]
MinConfidence = Annotated[
    float,
    Field(
        ge=0,
        le=1,
        description=(
            "Drop facts/rules whose decayed confidence is below this (0 to 1). Default 0.2 hides fading memories; "
            "pass 0 to include them."
        ),
    ),
]
TokenBudget = Annotated[
    int,
    Field(
        ge=MIN_TOKEN_BUDGET,
        le=MAX_TOKEN_BUDGET,
        description=(
            f"Hard cap on the block's size in tokens, {MIN_TOKEN_BUDGET} to {MAX_TOKEN_BUDGET}; default 3000."
        ),
    ),
]
OccurredAt = Annotated[
    AwareDatetime,
    Field(
        description=(
            "When it happened, ISO 8601 with a timezone (e.g. '2025-12-21T09:00:00Z'), for imports of history; default: "
            "now. Not in the future, not before 1970. Recency and ordering use it; expiry still counts from now."
        )
    ),
]
Since = Annotated[AwareDatetime, Field(description="Only episodes that happened at or after this time (ISO 8601).")]
Until = Annotated[AwareDatetime, Field(description="Only episodes that happened before this time (ISO 8601).")]
IdempotencyKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200),
    Field(
        description=(
            "Your unique key for this write (unique per butler). Retrying with the same key and the same arguments "
            "returns the same id and writes nothing new; the same key with different arguments is refused "
            "(idempotency_conflict)."
        )
    ),
]
Lineage = Annotated[
    RequestContext,
    Field(
        description=(
            "Optional trace ids {request_id, subrequest_id, segment_id}; request_id is echoed back and kept in the audit "
            "trail."
        )
    ),
]


class EpisodeItem(BaseModel):
    """One episode of a memory_ingest_batch call."""

    model_config = ConfigDict(extra="forbid")

    content: Content
    butler: Butler
    session_id: uuid.UUID | None = None
    importance: Importance | None = None
    occurred_at: OccurredAt | None = None
    idempotency_key: IdempotencyKey | None = None


class ContextRequest(BaseModel):
    """One memory block of a memory_context_batch call."""

    model_config = ConfigDict(extra="forbid")

    trigger_prompt: Query
    butler: Butler
    token_budget: TokenBudget | None = None
