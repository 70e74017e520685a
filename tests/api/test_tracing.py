"""One trace from the MCP tool call through the outbox and the broker to the worker's apply and consolidation.

The real front (uvicorn, the real MCP client over HTTP), the real database and Redis, and a real Celery worker
in this process (so the in-memory exporter sees both sides).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine, text

from shared import intake, tracing
from shared.config import Settings
from shared.db import unit_of_work
from shared.intake import WriteRequest
from tests.api.conftest import Butler, Front, new_tenant, new_token
from tests.polling import poll


@pytest.fixture(scope="module")
def spans(api_settings: Settings) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.setup(api_settings.tracing, role="front", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


@pytest.fixture(scope="module")
def traced_front(spans: InMemorySpanExporter, api_settings: Settings) -> Iterator[Front]:
    with Front(api_settings) as running:  # built with tracing on: the ASGI middleware is in
        yield running


def _trace(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]


def _one(spans: list[ReadableSpan], name: str, **attributes: Any) -> ReadableSpan:
    found = [s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, f"{name} {attributes}: {[s.name for s in spans]}"
    return found[0]


def _ancestors(span: ReadableSpan, spans: list[ReadableSpan]) -> list[str]:
    by_id = {s.context.span_id: s for s in spans}
    names, parent = [], span.parent
    while parent is not None and parent.span_id in by_id:
        names.append(by_id[parent.span_id].name)
        parent = by_id[parent.span_id].parent
    return names


def test_a_writes_trace_spans_the_front_the_broker_and_the_worker(spans, traced_front, worker, engine: Engine, caplog):
    # given a butler with a token, and tracing on in the front and the worker
    caplog.set_level(logging.INFO, logger="memory_butler.api")
    tenant = new_tenant(engine)
    butler = Butler(traced_front.url, new_token(engine, tenant, ["health"]))
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    # when it stores an episode with its request_context
    accepted = butler.ok(
        "memory_store_episode",
        content="My name is Ada and I am allergic to peanuts.",
        butler="health",
        request_context={"request_id": request_id},
    )
    # then the tool call's span carries the request_id and the tenant
    call = poll(
        lambda: [
            s
            for s in spans.get_finished_spans()
            if s.name == "tools/call memory_store_episode"
            and s.attributes.get("memory_butler.request_id") == request_id
        ],
        deadline_s=10,
        what="the tool call's span",
    )[0]
    assert call.attributes["memory_butler.tenant"] == tenant
    assert call.attributes["memory_butler.outcome"] == "ok"
    trace_id = call.context.trace_id
    # and the worker applies and consolidates inside the same trace
    trace = poll(
        lambda: (t := _trace(spans, trace_id)) and any(s.name == "run/memory.consolidate" for s in t) and t,
        deadline_s=60,
        what="the consolidation's span in the write's trace",
    )
    # the front: the call continues the caller's own trace (the MCP client put it in the request's _meta), and
    # the outbox insert (psycopg) runs under the tool call
    assert call.parent.span_id == _one(trace, "MCP send tools/call memory_store_episode").context.span_id
    assert any(s.kind.name == "SERVER" and s.name.startswith("POST /mcp") for s in spans.get_finished_spans())
    insert = next(s for s in trace if "INSERT INTO write_intents" in str(s.attributes.get("db.statement", "")))
    assert "tools/call memory_store_episode" in _ancestors(insert, trace)
    # the broker: the wake-up's publish span is a child of the call (sent by the publisher's thread)
    publish = _one(trace, "apply_async/memory.apply_writes")
    assert publish.parent.span_id == call.context.span_id
    # the worker: the task run continues the wake-up's context from the task headers
    run = _one(trace, "run/memory.apply_writes")
    assert run.parent.span_id == publish.context.span_id
    # the intent's own span sits under the call (its stored context), linked to the batch that applied it
    applied = _one(trace, "memory.apply_intent", **{"memory_butler.intent_id": accepted["id"]})
    assert applied.parent.span_id == call.context.span_id
    assert applied.attributes["memory_butler.outcome"] == "applied"
    assert applied.attributes["memory_butler.request_id"] == request_id
    batch = _one(trace, "memory.apply_batch")
    assert [link.context.span_id for link in applied.links] == [batch.context.span_id]
    # consolidation was woken from inside the apply, so its run descends from it
    consolidation = _one(trace, "run/memory.consolidate")
    assert "run/memory.apply_writes" in _ancestors(consolidation, trace)
    # and the front's log line for the call carries the call's trace and span ids
    (line,) = [
        r for r in caplog.records if r.getMessage() == "tool call" and getattr(r, "request_id", None) == request_id
    ]
    assert line.trace_id == format(trace_id, "032x")
    assert line.span_id == format(call.context.span_id, "016x")
    # and the intent row keeps the call's context for a later apply
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT trace_context FROM write_intents WHERE id = :i"), {"i": accepted["id"]}
        ).scalar_one()
    assert stored["traceparent"].startswith(f"00-{trace_id:032x}-{call.context.span_id:016x}-")


def test_a_write_applied_after_a_lost_wake_up_is_still_in_its_accepting_trace(spans, worker, engine: Engine):
    # given a write accepted under a traced call whose wake-up was lost (none is sent here)
    tenant = new_tenant(engine)
    with tracing.span("accepting call"):
        carrier = tracing.current_carrier()
    with unit_of_work(engine) as conn:
        (accepted,) = intake.accept(
            conn,
            tenant_id=tenant,
            writes=[
                WriteRequest(
                    "fact",
                    "health",
                    {"subject": "user", "predicate": "favorite_color", "content": "The user's favorite color is green"},
                    None,
                )
            ],
            actor="health",
            request_id="req-lost",
            trace_context=carrier,
        )
    call = next(
        s
        for s in spans.get_finished_spans()
        if s.name == "accepting call" and s.context.trace_id == int(carrier["traceparent"].split("-")[1], 16)
    )
    # when the redelivery sweep wakes the key (from no trace at all) and the worker applies it
    applied = poll(
        lambda: [
            s
            for s in spans.get_finished_spans()
            if s.name == "memory.apply_intent" and s.attributes.get("memory_butler.intent_id") == str(accepted.id)
        ],
        deadline_s=30,
        what="the intent's apply span",
    )[0]
    # then the apply is recorded in the accepting call's trace, linked to the batch of another trace
    assert applied.context.trace_id == call.context.trace_id
    assert applied.parent.span_id == call.context.span_id
    (link,) = applied.links
    batch = next(s for s in spans.get_finished_spans() if s.context.span_id == link.context.span_id)
    assert batch.name == "memory.apply_batch" and batch.context.trace_id != call.context.trace_id


def test_a_caller_without_trace_context_gets_the_tool_call_under_the_http_request(spans, traced_front, engine: Engine):
    # given a plain HTTP client (no OpenTelemetry, no _meta, no traceparent header)
    import json
    import urllib.request

    token = new_token(engine, new_tenant(engine), ["health"])
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "memory_search",
            "arguments": {"query": "peanuts", "request_context": {"request_id": "req-plain"}},
        },
    }
    request = urllib.request.Request(
        traced_front.url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        },
    )
    # when it calls a tool
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, response.read()
    # then the tool call's span is a child of the front's HTTP request span
    call = poll(
        lambda: [
            s
            for s in spans.get_finished_spans()
            if s.name == "tools/call memory_search" and s.attributes.get("memory_butler.request_id") == "req-plain"
        ],
        deadline_s=10,
        what="the tool call's span",
    )[0]
    http = poll(
        lambda: [
            s
            for s in _trace(spans, call.context.trace_id)
            if s.kind.name == "SERVER" and s.name.startswith("POST /mcp")
        ],
        deadline_s=10,
        what="the HTTP request's span",
    )  # it ends once the response is sent
    assert len(http) == 1 and http[0].parent is None
    assert http[0].name in _ancestors(call, _trace(spans, call.context.trace_id))
