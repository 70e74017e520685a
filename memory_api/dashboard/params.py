"""Query parameters and bodies of the dashboard API: each model carries its bounds, refuses unknown names (a bad
filter is a 400 naming the field, never ignored) and is the source of the OpenAPI document's parameters."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from memory_api.tools.params import MAX_QUERY, Content, Importance, Mode, Permanence, ReadScope, Tags
from shared.lifecycle import EPISODE_STATES, FACT_STATES, LEGACY_VALIDITY, RULE_MATURITIES
from shared.schemas import NAME_PATTERN

MAX_PAGE = 200  # the hard cap on any list page
DEFAULT_PAGE = 50
MAX_OFFSET = 100_000  # deeper pages cost a scan of every row before them: filter instead
MAX_BODY = 64 * 1024  # an edit is one memory (content <= 20,000 characters, up to 3 bytes each in UTF-8)
RULE_VALIDITIES = ("active", "fading", "expired", "retracted")

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="A butler name.")]
Text200 = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Search = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_QUERY)]


def _listed(value: Any, allowed: tuple[str, ...], field: str) -> list[str] | None:
    """A comma-separated list of allowed words (``active,fading``), deduplicated in order."""
    if value is None or isinstance(value, list):
        return value
    # Legacy names are accepted and answered in today's words ("forgotten" is "retracted": seed 001).
    items = list(dict.fromkeys(LEGACY_VALIDITY.get(v.strip(), v.strip()) for v in str(value).split(",") if v.strip()))
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"expected a comma-separated list of {', '.join(allowed)}; got {value!r}")
    return items


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Paging(_Query):
    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE, description=f"Items per page, 1 to {MAX_PAGE}.")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Items to skip: next_offset of the previous page.")


class ScopeQuery(_Query):
    scope: ReadScope | None = None


class ButlerFactQuery(Paging):
    subject: Text200 | None = Field(None, description="Exact subject, e.g. 'user'.")
    q: Search | None = Field(None, description="Words that must all appear (full-text, English stemming).")
    min_confidence: float | None = Field(None, ge=0, le=1, description="Effective (decayed) confidence floor.")
    permanence: Permanence | None = None
    source_butler: Name | None = None
    validity: list[str] | None = Field(None, description=f"Comma-separated, any of {', '.join(FACT_STATES)}.")

    @field_validator("validity", mode="before")
    @classmethod
    def _validity(cls, value: Any) -> list[str] | None:
        return _listed(value, FACT_STATES, "validity")


class FactQuery(ButlerFactQuery, ScopeQuery):
    pass


class ButlerRuleQuery(Paging):
    maturity: Literal[RULE_MATURITIES] | None = None  # type: ignore[valid-type]
    q: Search | None = None
    validity: list[str] | None = Field(None, description=f"Comma-separated, any of {', '.join(RULE_VALIDITIES)}.")

    @field_validator("validity", mode="before")
    @classmethod
    def _validity(cls, value: Any) -> list[str] | None:
        return _listed(value, RULE_VALIDITIES, "validity")


class RuleQuery(ButlerRuleQuery, ScopeQuery):
    pass


class ButlerEpisodeQuery(Paging):
    start: datetime | None = Field(None, alias="from", description="Created at or after (ISO-8601).")
    end: datetime | None = Field(None, alias="to", description="Created before (ISO-8601).")
    status: Literal[EPISODE_STATES] | None = Field(None, description="Consolidation status.")  # type: ignore[valid-type]
    include_forgotten: bool = False

    @model_validator(mode="after")
    def _window(self) -> ButlerEpisodeQuery:
        if (
            self.start
            and self.end
            and self.start.tzinfo is not None
            and self.end.tzinfo is not None
            and self.end <= self.start
        ):
            raise ValueError("'to' must be later than 'from'")
        return self


class EpisodeQuery(ButlerEpisodeQuery):
    butler: Name | None = None


class ActivityQuery(_Query):
    before: int | None = Field(None, ge=1, description="Events older than this id: next_cursor of the previous page.")
    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE)
    scope: ReadScope | None = None
    types: list[str] | None = Field(None, description="Comma-separated entity types: episode, fact, rule.")
    event_type: Annotated[str, StringConstraints(pattern=r"^[a-z_]+\.[a-z_]+$")] | None = None

    @field_validator("types", mode="before")
    @classmethod
    def _types(cls, value: Any) -> list[str] | None:
        return _listed(value, ("episode", "fact", "rule"), "types")


class SearchQuery(_Query):
    q: Search = Field(description="What to look for, in plain language (hybrid: meaning + keywords).")
    types: list[str] | None = Field(None, description="Comma-separated: episode, fact, rule (default all).")
    scope: ReadScope | None = None
    permanence: Permanence | None = None
    mode: Mode = "hybrid"
    limit: int = Field(20, ge=1, le=100)

    @field_validator("types", mode="before")
    @classmethod
    def _types(cls, value: Any) -> list[str] | None:
        return _listed(value, ("episode", "fact", "rule"), "types")


class _Edit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: Content | None = None
    importance: Importance | None = None
    permanence: Permanence | None = None
    tags: Tags | None = None

    @model_validator(mode="after")
    def _something(self) -> _Edit:
        if not self.model_fields_set:
            raise ValueError("send at least one of content, importance, permanence, tags")
        return self

    def changes(self) -> dict[str, Any]:
        """The fields the caller sent (the rest keep the memory's current values)."""
        return {k: v for k, v in self.model_dump().items() if k in self.model_fields_set and v is not None}


class FactEdit(_Edit):
    """A correction: stored as a new fact (same subject, predicate and scope) that supersedes this one."""


class RuleEdit(_Edit):
    """A rewrite: the rule starts over as a candidate (no evidence yet for the new text)."""
