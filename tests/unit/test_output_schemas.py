"""The tools' published outputSchemas are lean (nullable as a type list) and accept exactly what pydantic's do."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest
from jsonschema.validators import validator_for

from memory_api.tools import build_tools
from memory_api.tools.results import Hits, lean_schema
from shared.schemas import Hit

NOW = datetime(2026, 11, 25, tzinfo=timezone.utc).isoformat()


def _hit(**changes: object) -> dict:
    hit = Hit(
        type="episode",
        id=uuid.uuid4(),
        content="User: hello",
        score=0.5,
        relevance=0.5,
        created_at=NOW,
        occurred_at=NOW,
        session_id=uuid.uuid4(),
        butler="assistant",
        importance=5.0,
        content_tokens=4,
    ).model_dump(mode="json")
    return hit | changes


def _valid(schema: dict, body: dict) -> bool:
    return not list(validator_for(schema)(schema).iter_errors(body))


def test_every_published_schema_writes_nullables_as_type_lists():
    schemas = {tool.name: tool.output_schema for tool in build_tools() if tool.output_schema is not None}
    assert len(schemas) == len(build_tools())
    search = json.dumps(schemas["memory_search"])
    assert '"anyOf"' not in search
    occurred = schemas["memory_search"]["$defs"]["Hit"]["properties"]["occurred_at"]
    assert occurred["type"] == ["string", "null"] and occurred["format"] == "date-time"


@pytest.mark.parametrize(
    ("changes", "ok"),
    [
        ({}, True),
        ({"occurred_at": None, "session_id": None, "butler": None, "content_tokens": None}, True),
        ({"subject": "user", "predicate": "lives_in", "effective_confidence": 0.8}, True),
        ({"butler": 7}, False),  # string-or-null given a number
        ({"effective_confidence": "high"}, False),  # number-or-null given a string
        ({"content_tokens": 1.5}, False),  # integer-or-null given a float
        ({"score": None}, False),  # not nullable
        ({"type": "memo"}, False),  # outside the enum
    ],
)
def test_lean_schema_accepts_exactly_what_pydantic_schema_accepts(changes: dict, ok: bool):
    original = Hits.model_json_schema()
    lean = lean_schema(original)
    body = {"request_id": "r", "degraded": False, "reason": None, "results": [_hit(**changes)], "count": 1}
    assert _valid(original, body) is ok
    assert _valid(lean, body) is ok
    assert original == Hits.model_json_schema()  # the input is not modified
