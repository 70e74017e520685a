"""What the fuzzer sends: hypothesis strategies built from a tool's own input JSON schema, and hostile values.

``arguments(schema, hints)`` draws arguments the published schema allows (the keywords the tools' schemas use:
type, anyOf, $ref, enum, pattern, format uuid/date-time, min/max length, items, bounds, required), mixed with
values that mean something here (``hints``: the tenant's butlers and memory ids, the other tenant's ids) so a
good share of calls reach the database instead of stopping at validation. ``mutate`` then breaks one thing:
a hostile value at any path, an unknown field, a missing required field. ``RAW_ONLY`` values cannot be sent by
the MCP client (a lone surrogate, NaN, nesting deeper than its encoder goes): they go as raw JSON-RPC bodies.
"""

from __future__ import annotations

import math
import string
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hypothesis import strategies as st

MAX_TEXT = 120  # generated strings stay short; the long ones come from the hostile values
MAX_ITEMS = 4  # generated arrays (a batch's episodes, a context batch's requests)
MEGABYTE = "m" * (1 << 20)
NAMES = ("health", "finance", "general", "global")


class Raw:
    """A value only a raw JSON-RPC body can carry; ``text`` is its JSON."""

    def __init__(self, label: str, text: str) -> None:
        self.label, self.text = label, text

    def __repr__(self) -> str:
        return f"Raw({self.label})"


def nested(depth: int) -> dict[str, Any]:
    """{"a": {"a": ... 1}} ``depth`` levels deep (deeply nested metadata)."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


RAW_ONLY = (
    Raw("lone-surrogate", '"a\\ud800b"'),
    Raw("lone-low-surrogate", '"\\udfff"'),
    Raw("nan", "NaN"),
    Raw("infinity", "Infinity"),
    Raw("-infinity", "-Infinity"),
    Raw("huge-exponent", "1e400"),
    Raw("digits-5000", "9" * 5000),
    Raw("nesting-5000", '{"a":' * 5000 + "1" + "}" * 5000),
    Raw("nesting-150", '{"a":' * 150 + "1" + "}" * 150),
)

HOSTILE_TEXT = (
    "a\x00b",
    "\x00",
    MEGABYTE,
    "",
    " ",
    "\t\n\r",
    "\u202etxt.exe",
    "\ufeffBOM",
    "\uffff",
    "🙂" * 5_000,
    "' OR '1'='1'; DROP TABLE facts; --",
    "%s%n%x",
    "{{7*7}}${jndi:ldap://x}",
    "../../etc/passwd",
    "*",
    "global",
    "ALL",
    "²",
    "-1",
    "9" * 400,
    "9" * 5_000,
    "NaN",
    "null",
    "true",
    "Ω" * 20_001,
    "x" * 20_001,
    "\u0301" * 1000,
    "2999-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "2025-01-01T10:00:00",
    "0000-00-00T00:00:00Z",
    str(uuid.UUID(int=0)),
    "mb_" + "A" * 43,
)
HOSTILE_NUMBERS = (-1, 0, 1, -(2**63) - 1, 2**63, 10**40, -(10**40), 1e308, -1e308, 5e-324, 1.5, -0.0, 49, 32_001)
HOSTILE_SHAPES = (
    None,
    True,
    False,
    [],
    {},
    [None],
    [[[]]],
    ["a"] * 600,
    {"k": "v"},
    nested(64),
    {"$ref": "#"},
    {"__proto__": {"admin": True}},
    [{"content": "x", "butler": "health"}] * 501,
)
UNKNOWN_FIELDS = ("colour", "tenant_id", "tenant", "__proto__", "role", "id", "", "x" * 300, "\x00", "Content")


@dataclass
class Hints:
    """Values that mean something to the server: names and ids of this tenant and of the other one."""

    names: Sequence[str] = NAMES
    own_ids: list[str] = field(default_factory=list)
    other_ids: list[str] = field(default_factory=list)
    other_tenant: str = "t-other"
    words: Sequence[str] = ("penicillin", "dentist", "budget", "coffee", "always confirm")
    keys: Sequence[str] = ("k-1", "k-2", "k-3")

    def hostile(self) -> st.SearchStrategy[Any]:
        ids = [*self.own_ids[:20], *self.other_ids[:20]] or [str(uuid.uuid4())]
        return st.one_of(
            st.sampled_from(HOSTILE_TEXT),
            st.sampled_from(HOSTILE_NUMBERS),
            st.sampled_from(HOSTILE_SHAPES),
            st.sampled_from(ids),
            st.just(self.other_tenant),
            st.sampled_from(self.other_ids or ids).map(lambda i: [i]),
        )


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return {**defs[ref.rsplit("/", 1)[-1]], **{k: v for k, v in schema.items() if k != "$ref"}}


def value(schema: Mapping[str, Any], *, defs: Mapping[str, Any], hints: Hints, name: str = "") -> st.SearchStrategy:
    """A strategy for values ``schema`` allows (``name``: the property, to mix in meaningful values)."""
    schema = _resolve(schema, defs)
    if "anyOf" in schema:
        return st.one_of(*(value(s, defs=defs, hints=hints, name=name) for s in schema["anyOf"]))
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return _string(schema, hints, name)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low, high = schema.get("minimum"), schema.get("maximum")
        return st.one_of(
            st.integers(math.ceil(low) if low is not None else None, math.floor(high) if high is not None else None),
            st.floats(low, high, allow_nan=False, allow_infinity=False),
        )
    if kind == "array":
        items = value(schema.get("items", {}), defs=defs, hints=hints, name=name)
        low = schema.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=max(low, min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)))
    if kind == "object":
        return obj(schema, defs=defs, hints=hints)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.sampled_from(HOSTILE_SHAPES)  # no type: anything goes


def _string(schema: Mapping[str, Any], hints: Hints, name: str) -> st.SearchStrategy[str]:
    fmt, pattern = schema.get("format"), schema.get("pattern")
    if fmt == "uuid":
        known = [*hints.own_ids, *hints.other_ids]
        return st.one_of(st.uuids().map(str), *([st.sampled_from(known)] * 3 if known else []))
    if fmt == "date-time":
        return st.datetimes(
            min_value=datetime(1960, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)
        ).map(lambda d: d.isoformat())
    low, high = schema.get("minLength", 0), min(schema.get("maxLength", MAX_TEXT), MAX_TEXT)
    if pattern:
        return st.one_of(
            st.from_regex(pattern, fullmatch=True).filter(lambda s: len(s) <= 63), st.sampled_from(hints.names)
        )
    # Any Unicode text (NUL and control characters included) half the time, plain words the other half.
    text = st.one_of(
        st.text(st.characters(codec="utf-8"), min_size=low, max_size=max(low, high)),
        st.text(string.ascii_letters + string.digits + " ", min_size=max(low, 1), max_size=max(low, 1, min(high, 40))),
    )
    if name == "confirm_tenant":
        return st.one_of(text, st.just(hints.other_tenant))
    if name == "idempotency_key":
        return st.one_of(text, st.sampled_from(hints.keys))
    if name in ("content", "query", "topic", "trigger_prompt", "reason"):
        return st.one_of(text, st.sampled_from(hints.words))
    return text


def obj(schema: Mapping[str, Any], *, defs: Mapping[str, Any], hints: Hints) -> st.SearchStrategy[dict[str, Any]]:
    """The required properties, and each optional one half of the time."""
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    strategies = {k: value(s, defs=defs, hints=hints, name=k) for k, s in props.items()}
    return st.fixed_dictionaries(
        {k: strategies[k] for k in props if k in required},
        optional={k: strategies[k] for k in props if k not in required},
    )


def arguments(schema: Mapping[str, Any], hints: Hints) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments a tool's inputSchema allows."""
    return obj(schema, defs=schema.get("$defs", {}), hints=hints)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place a value sits in ``node`` (dict values and list items), depth first."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        if len(out) < 200:
            out.extend(_paths(child, (*prefix, key)))
    return out


def _set(node: Any, path: tuple[Any, ...], new: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new


@st.composite
def mutate(draw: st.DrawFn, args: dict[str, Any], schema: Mapping[str, Any], hints: Hints) -> dict[str, Any]:
    """``args`` with one thing broken: a hostile value somewhere, an unknown field, or a required field gone."""
    import copy

    out = copy.deepcopy(args)
    required = list(schema.get("required", ()))
    how = draw(st.sampled_from(("replace", "replace", "replace", "raw", "unknown", "drop")))
    if how == "drop" and required:
        out.pop(draw(st.sampled_from(required)), None)
        return out
    if how == "unknown":
        containers = [()] + [p for p in _paths(out) if isinstance(_get(out, p), dict)]
        where = _get(out, draw(st.sampled_from(containers)))
        where[draw(st.sampled_from(UNKNOWN_FIELDS))] = draw(hints.hostile())
        return out
    targets = _paths(out) + [(k,) for k in schema.get("properties", {}) if k not in out]
    path = draw(st.sampled_from(targets))
    new = draw(st.sampled_from(RAW_ONLY)) if how == "raw" else draw(hints.hostile())
    if len(path) == 1 and path[0] not in out:
        out[path[0]] = new
    else:
        _set(out, path, new)
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def has_raw(node: Any) -> bool:
    if isinstance(node, Raw):
        return True
    if isinstance(node, dict):
        return any(has_raw(v) for v in node.values())
    if isinstance(node, list):
        return any(has_raw(v) for v in node)
    return False


def raw_json(node: Any) -> str:
    """``node`` as JSON text with each Raw value's text spliced in as is."""
    import json

    spliced: list[str] = []

    def placeholder(n: Any) -> Any:
        if isinstance(n, Raw):
            spliced.append(n.text)
            return f"\x01raw{len(spliced) - 1}\x01"
        if isinstance(n, dict):
            return {k: placeholder(v) for k, v in n.items()}
        if isinstance(n, list):
            return [placeholder(v) for v in n]
        return n

    text = json.dumps(placeholder(node), ensure_ascii=True)
    for i, piece in enumerate(spliced):
        text = text.replace(f'"\\u0001raw{i}\\u0001"', piece)
    return text
