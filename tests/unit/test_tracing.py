"""shared.tracing without a database: off by default, the W3C context handed across threads, trace ids in logs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import tracing
from shared.config import TracingSettings, load_settings
from shared.logs import JsonFormatter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.setup(TracingSettings(), role="test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def _record(msg: str) -> logging.LogRecord:
    return logging.getLogger("memory_butler.test").makeRecord(
        "memory_butler.test", logging.INFO, __file__, 1, msg, (), None, extra={"tool": "memory_search"}
    )


def test_tracing_is_off_by_default_and_its_helpers_do_nothing():
    # given the default settings
    settings = load_settings()
    assert settings.tracing.active_exporter == "none"
    # when the process sets tracing up
    assert tracing.setup(settings.tracing, role="front") is False
    # then nothing is traced, no context is handed on, logs carry no trace ids
    assert not tracing.enabled()
    with tracing.span("memory.apply_batch", tenant="t"):
        assert tracing.current_carrier() is None
        assert "trace_id" not in json.loads(JsonFormatter().format(_record("off")))


def test_an_otlp_endpoint_alone_turns_otlp_on_and_otlp_needs_one():
    assert load_settings(tracing={"otlp_endpoint": "http://collector:4318"}).tracing.active_exporter == "otlp"
    assert load_settings(tracing={"exporter": "console"}).tracing.active_exporter == "console"
    with pytest.raises(ValueError, match="tracing.*otlp_endpoint"):
        load_settings(tracing={"exporter": "otlp"})
    assert tracing.otlp_traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert tracing.otlp_traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def test_a_carried_context_makes_another_threads_span_a_child_of_the_call(spans):
    # given a call's span and its W3C carrier
    with tracing.span("call", request_id="r-1"):
        carrier = tracing.current_carrier()
    assert carrier and carrier["traceparent"].startswith("00-")
    # when another thread (the publisher's) attaches it and works
    done = threading.Event()

    def publish() -> None:
        with tracing.attached(carrier), tracing.span("publish"):
            done.set()

    thread = threading.Thread(target=publish)
    thread.start()
    thread.join(5)
    assert done.is_set()
    # then its span is the call's child, in the call's trace
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["publish"].context.trace_id == by_name["call"].context.trace_id
    assert by_name["publish"].parent.span_id == by_name["call"].context.span_id
    assert by_name["call"].attributes["memory_butler.request_id"] == "r-1"


def test_an_applied_intent_is_recorded_in_the_trace_that_stored_its_context(spans):
    # given an intent accepted under one trace, applied in a batch of another (a sweep's wake-up)
    with tracing.span("tools/call memory_store_fact"):
        stored = tracing.current_carrier()
    intents = [
        {
            "id": "i-1",
            "kind": "fact",
            "seq": 7,
            "tenant_id": "t",
            "butler": "b",
            "request_id": "r-9",
            "trace_context": stored,
        },
        {
            "id": "i-2",
            "kind": "fact",
            "seq": 8,
            "tenant_id": "t",
            "butler": "b",
            "request_id": None,
            "trace_context": None,
        },
    ]
    with tracing.span("memory.apply_batch"):
        tracing.record_applied(intents, started_ns=tracing.now_ns(), outcomes={"i-1": "applied"})
    # then the intent's span sits under the accepting call, linked to the batch; the untraced one has none
    finished = {s.name: s for s in spans.get_finished_spans()}
    call, batch, applied = (
        finished[n] for n in ("tools/call memory_store_fact", "memory.apply_batch", "memory.apply_intent")
    )
    assert applied.context.trace_id == call.context.trace_id != batch.context.trace_id
    assert applied.parent.span_id == call.context.span_id
    assert [link.context.span_id for link in applied.links] == [batch.context.span_id]
    assert applied.attributes["memory_butler.request_id"] == "r-9"
    assert applied.attributes["memory_butler.outcome"] == "applied"
    assert len([s for s in spans.get_finished_spans() if s.name == "memory.apply_intent"]) == 1


def test_a_log_record_made_inside_a_span_carries_its_trace_and_span_ids_as_json(spans):
    # when a line is logged inside a span, and another outside any
    with tracing.span("call"):
        inside = _record("inside")
    outside = _record("outside")
    # then the JSON line has the span's ids; the other has none
    (call,) = spans.get_finished_spans()
    line = json.loads(JsonFormatter().format(inside))
    assert line["trace_id"] == format(call.context.trace_id, "032x")
    assert line["span_id"] == format(call.context.span_id, "016x")
    assert line["tool"] == "memory_search" and line["msg"] == "inside"
    assert "trace_id" not in json.loads(JsonFormatter().format(outside))


def test_turning_tracing_off_stops_adding_trace_ids_and_recording(spans):
    tracing.shutdown()
    with tracing.span("call"):
        assert "trace_id" not in json.loads(JsonFormatter().format(_record("after")))
    # the global provider stays (the MCP SDK holds it) but records nothing any more
    assert not trace.get_tracer("mcp-python-sdk").start_span("tools/call x").is_recording()
    assert spans.get_finished_spans() == ()


SCRIPT = """
import logging, sys
from shared import tracing
from shared.config import load_settings
from shared.logs import configure_logging
configure_logging()
tracing.setup(load_settings().tracing, role="front")
log = logging.getLogger("memory_butler.api")
with tracing.span("call"):
    log.info("tool call", extra={"tool": "memory_search"})
log.info("no span")
"""


def test_the_process_log_lines_on_stderr_carry_trace_ids_and_spans_go_to_the_console(tmp_path):
    # given a process logging as the front does, with the console exporter (development)
    env = {**os.environ, "MEMORY_BUTLER_TRACING__EXPORTER": "console", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    # then stdout has the span as one JSON line, and stderr the log lines as JSON, the first with its ids
    (span,) = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    lines = {line["msg"]: line for line in map(json.loads, run.stderr.splitlines())}
    assert span["name"] == "call"
    assert "0x" + lines["tool call"]["trace_id"] == span["context"]["trace_id"]
    assert "0x" + lines["tool call"]["span_id"] == span["context"]["span_id"]
    assert "trace_id" not in lines["no span"]


def test_with_an_otlp_endpoint_spans_are_posted_to_the_collector_as_otlp_protobuf():
    # given a local OTLP/HTTP receiver and settings naming only its endpoint
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings = load_settings(tracing={"otlp_endpoint": f"http://127.0.0.1:{server.server_port}"})
        assert tracing.setup(settings.tracing, role="front")
        # when a span ends and the process flushes
        with tracing.span("memory.apply_batch", tenant="t-otlp"):
            pass
        assert tracing.flush()
    finally:
        tracing.shutdown()
        server.shutdown()
        server.server_close()
    # then the collector got it at /v1/traces, as OTLP protobuf
    (path, body), *_ = received
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert "memory.apply_batch" in names


def test_the_sdk_opens_a_span_per_message_only_while_tracing_is_on(spans):
    from mcp.server._otel import OpenTelemetryMiddleware

    from memory_api.server import build_server
    from memory_api.tools.services import Services

    def sdk_spans(server) -> bool:  # noqa: ANN001
        return any(isinstance(m, OpenTelemetryMiddleware) for m in server._lowlevel_server.middleware)

    services = Services(settings=load_settings(), database_url="postgresql://unused")
    # with tracing on, the SDK's "tools/call <tool>" span stays (the parent of ours)
    assert sdk_spans(build_server(services))
    # with it off, the non-recording span per message is left out
    tracing.shutdown()
    assert not sdk_spans(build_server(services))
