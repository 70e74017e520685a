"""Pydantic shapes that cross a boundary: write payloads (tool arguments and write_intents.payload), read results."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from shared.errors import InvalidInput

M = TypeVar("M", bound=BaseModel)

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
MAX_CONTENT = 20_000
MAX_TAGS = 32

MemoryType = Literal["episode", "fact", "rule"]
Permanence = Literal["permanent", "stable", "standard", "volatile", "ephemeral"]
SearchMode = Literal["hybrid", "semantic", "keyword"]
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Content = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_CONTENT)]
Tag = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
Importance = Annotated[float, Field(ge=1, le=10)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestContext(_Strict):
    """Lineage a caller passes along; request_id is echoed in responses and memory_events."""

    request_id: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    subrequest_id: Annotated[str, StringConstraints(max_length=200)] | None = None
    segment_id: Annotated[str, StringConstraints(max_length=200)] | None = None


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
CLOCK_SKEW = timedelta(minutes=1)


def check_occurred_at(value: datetime | None, *, now: datetime, field: str = "occurred_at") -> datetime | None:
    """When an episode happened: timezone-aware, not before 1970, not later than ``now`` plus a minute of clock skew."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidInput(f"{field}: needs a timezone (ISO 8601 with Z or an offset)", field=field)
    if value < EPOCH:
        raise InvalidInput(f"{field}: must not be before 1970-01-01", field=field)
    if value > now + CLOCK_SKEW:
        raise InvalidInput(f"{field}: must not be in the future (got {value.isoformat()})", field=field)
    return value


class EpisodeWrite(_Strict):
    content: Content
    butler: Name
    session_id: uuid.UUID | None = None
    importance: Importance = 5.0
    # When it happened (imports of history); None = the accept time. Checked against the clock at accept time.
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = {}


class SealedContent(_Strict):
    """A fact's content sealed at the front (shared.protection): AES-GCM blob (base64) and the key id."""

    key_id: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    blob: Annotated[str, StringConstraints(min_length=1, max_length=4 * MAX_CONTENT)]


class FactWrite(_Strict):
    subject: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    predicate: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    content: Content
    importance: Importance = 5.0
    permanence: Permanence = "standard"
    scope: Name = "global"
    tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] = []
    confidence: Annotated[float, Field(ge=0, le=1)] = 1.0
    source_episode_id: uuid.UUID | None = None
    metadata: dict[str, Any] = {}
    # Set by shared.protection.protect for a predicate listed in encryption.predicates: content is then a surrogate.
    sealed: SealedContent | None = None

    @field_validator("predicate")
    @classmethod
    def _normalise_predicate(cls, value: str) -> str:
        return re.sub(r"\s+", "_", value.strip().lower())


class RuleWrite(_Strict):
    content: Content
    scope: Name = "global"
    tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] = []
    importance: Importance = 5.0
    permanence: Permanence = "standard"
    source_episode_id: uuid.UUID | None = None
    metadata: dict[str, Any] = {}


WRITE_MODELS: dict[str, type[BaseModel]] = {"episode": EpisodeWrite, "fact": FactWrite, "rule": RuleWrite}


def parse(model: type[M], data: dict[str, Any]) -> M:
    """Validate ``data`` or raise InvalidInput naming the first bad field and the rule it broke."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or model.__name__
        raise InvalidInput(f"{field}: {err['msg']}", field=field) from None


def parse_uuid(value: str, *, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidInput(f"{field}: not a valid UUID: {value!r}", field=field) from None


class Hit(BaseModel):
    """One retrieved memory with its scores. Type-specific fields are None where they do not apply."""

    type: MemoryType
    id: uuid.UUID
    content: str
    score: float
    relevance: float
    created_at: datetime
    # Episodes: when it happened (the accept time unless imported with occurred_at) and its session.
    occurred_at: datetime | None = None
    session_id: uuid.UUID | None = None
    scope: str | None = None
    butler: str | None = None
    subject: str | None = None
    predicate: str | None = None
    permanence: str | None = None
    validity: str | None = None
    maturity: str | None = None
    importance: float
    effective_confidence: float | None = None
    effectiveness_score: float | None = None
    last_confirmed_at: datetime | None = None
    last_referenced_at: datetime | None = None
    # The stored token count of the content, for the context builder; not part of any answer.
    content_tokens: int | None = Field(None, exclude=True)
