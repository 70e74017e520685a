"""OpenTelemetry traces for the front and the workers: the only module that imports opentelemetry.

Off by default (``settings.tracing``): nothing is instrumented and every helper here returns at once, so a tool
call pays one module-global check. On, :func:`setup` installs a tracer provider with the configured exporter
and the official instrumentations: Celery (publish and run spans, the W3C trace context in the task headers),
psycopg (one span per statement), httpx (the extractor's calls to a language model) and, through
:func:`instrument_asgi`, the front's ASGI app. The MCP SDK's own server span (``tools/call <tool>``) reports
to the global provider set here; :func:`annotate_call` adds the call's request_id, tenant and outcome.

Where the trace context travels: the broker message is only a wake-up, coalesced per shard key, so it carries
the context of the first write that asked for it (the front's publisher hands that context to its thread). The
durable thing is the ``write_intents`` row, and it stores the accepting call's context (``trace_context``): the
worker records one ``memory.apply_intent`` span per applied intent under it, linked to the batch that applied
it. A write applied after a redelivery, a sweep's wake-up or inside another write's batch is therefore still in
the trace of the call that accepted it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared import logs
from shared.config import TracingSettings

log = logging.getLogger(__name__)

ATTR = "memory_butler."
# Health checks and scrapes would be most of the front's spans and say nothing about a call.
ASGI_EXCLUDED_URLS = "healthz,metrics"
_W3C = TraceContextTextMapPropagator()  # only traceparent/tracestate: a caller's baggage is not stored with a write

_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


class _Switch(SpanProcessor):
    """The global provider's one processor; setup/shutdown swap the exporter behind it (a provider is global
    for good, and tests turn tracing on and off in one process)."""

    def __init__(self) -> None:
        self.inner: SpanProcessor | None = None

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        inner = self.inner
        if inner is not None:
            inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        inner = self.inner
        if inner is not None:
            inner.on_end(span)

    def shutdown(self) -> None:
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        inner = self.inner
        return inner.force_flush(timeout_millis) if inner is not None else True


_switch = _Switch()


class _OnlyWhileOn(Sampler):
    """Records nothing once :func:`shutdown` turned tracing off (the MCP SDK keeps using the global provider)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any) -> SamplingResult:
        if _tracer is None:
            return SamplingResult(Decision.DROP)
        return self.sampler.should_sample(parent_context, trace_id, name, *args, **kwargs)

    def get_description(self) -> str:
        return f"OnlyWhileOn{{{self.sampler.get_description()}}}"


def enabled() -> bool:
    """True once :func:`setup` turned tracing on in this process."""
    return _tracer is not None


def setup(settings: TracingSettings, *, role: str, exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on for this process if ``settings`` ask for it (or ``exporter`` is given); idempotent.

    ``role`` ("front", "worker") is added to the service name. Call it once per process before engines connect
    (prefork workers: in ``worker_process_init``, never before the fork). Returns whether tracing is on.
    """
    global _tracer
    if _tracer is not None:
        return True
    span_exporter = exporter if exporter is not None else _exporter(settings)
    if span_exporter is None:
        return False
    provider = _global_provider(settings, role)
    # A test's in-memory exporter and the console are written as each span ends; OTLP is batched off the request.
    immediate = exporter is not None or settings.active_exporter == "console"
    _switch.inner = SimpleSpanProcessor(span_exporter) if immediate else BatchSpanProcessor(span_exporter)
    _instrument(provider)
    _tracer = provider.get_tracer("memory_butler")
    logs.add_context(log_ids)
    log.info(
        "tracing on", extra={"exporter": "custom" if exporter is not None else settings.active_exporter, "role": role}
    )
    return True


def shutdown() -> None:
    """Flush what is buffered, remove the instrumentations and turn tracing off (tests; a process exit flushes)."""
    global _tracer
    if _tracer is None:
        return
    _switch.force_flush()
    _switch.shutdown()
    for instrumentor in _instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
    logs.remove_context(log_ids)
    _tracer = None


def flush(timeout_s: float = 5.0) -> bool:
    """Export buffered spans now (a worker process about to exit)."""
    return _switch.force_flush(int(timeout_s * 1000)) if _tracer is not None else True


def _exporter(settings: TracingSettings) -> SpanExporter | None:
    kind = settings.active_exporter
    if kind == "console":
        # The real stdout: a Celery worker redirects sys.stdout into its logger, which would wrap each span in a
        # log line.
        return ConsoleSpanExporter(
            out=sys.__stdout__ or sys.stdout, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=otlp_traces_url(settings.otlp_endpoint))
    return None


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a collector's base endpoint (``http://host:4318`` → ``.../v1/traces``)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def _global_provider(settings: TracingSettings, role: str) -> TracerProvider:
    """The process's provider, made once and set as OpenTelemetry's global (the MCP SDK's spans report to it)."""
    global _provider
    if _provider is None:
        _provider = TracerProvider(
            resource=Resource.create({"service.name": f"{settings.service_name}-{role}"}),
            sampler=_OnlyWhileOn(ParentBased(TraceIdRatioBased(settings.sample_ratio))),
        )
        _provider.add_span_processor(_switch)
        trace.set_tracer_provider(_provider)
    return _provider


def _instrumentors() -> list[Any]:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    return [CeleryInstrumentor(), PsycopgInstrumentor(), HTTPXClientInstrumentor()]  # singletons


def _instrument(provider: TracerProvider) -> None:
    for instrumentor in _instrumentors():
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)


def instrument_asgi(app: Any) -> None:
    """Add OpenTelemetry's ASGI middleware (outermost) to a Starlette app when tracing is on: one server span
    per HTTP request, continuing a caller's ``traceparent`` header."""
    if _tracer is None:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    app.add_middleware(OpenTelemetryMiddleware, excluded_urls=ASGI_EXCLUDED_URLS, tracer_provider=_provider)


def annotate(**attributes: Any) -> None:
    """Set ``memory_butler.<name>`` attributes on the current span (the tool call's); None values are skipped."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({ATTR + k: v for k, v in attributes.items() if v is not None})


def annotate_call(*, request_id: str, tenant: str | None, outcome: str) -> None:
    """The tool call's request_id, tenant and outcome on its span (the MCP SDK's ``tools/call <tool>``).

    Once per call on the read path: fixed keywords (no dict built) and an early return when off."""
    if _tracer is None:
        return
    annotate(request_id=request_id, tenant=tenant, outcome=outcome)


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C trace context (``traceparent``, ``tracestate``) to store or hand to another
    thread; None when tracing is off or no span is active."""
    if _tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier or None


@contextlib.contextmanager
def attached(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make ``carrier``'s trace context current inside the block (the publisher thread sending a call's wake-up)."""
    if _tracer is None or not carrier:
        yield
        return
    token = otel_context.attach(_W3C.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A span around the block (a batch of work), with ``memory_butler.<name>`` attributes; nothing when off."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(name, attributes={ATTR + k: v for k, v in attributes.items() if v is not None}):
        yield


def now_ns() -> int:
    return time.time_ns()


def record_applied(intents: Sequence[Mapping[Any, Any]], *, started_ns: int, outcomes: Mapping[Any, str]) -> None:
    """One ``memory.apply_intent`` span per intent that stored its accepting call's context, as a child of that
    call and linked to the current (batch) span: the write's own trace shows when, where and how it was applied
    (``outcomes``: intent id → applied | retry | dead_letter; anything but applied is an error status)."""
    if _tracer is None:
        return
    batch = trace.get_current_span().get_span_context()
    links = [trace.Link(batch)] if batch.is_valid else None
    ended = time.time_ns()
    for intent in intents:
        carrier = intent.get("trace_context")
        if not carrier:
            continue
        attributes = {
            ATTR + "intent_id": str(intent["id"]),
            ATTR + "kind": intent["kind"],
            ATTR + "seq": int(intent["seq"]),
            ATTR + "tenant": intent["tenant_id"],
            ATTR + "butler": intent["butler"],
            ATTR + "batch_size": len(intents),
            ATTR + "outcome": outcomes.get(intent["id"], "unknown"),
        }
        if intent.get("request_id"):
            attributes[ATTR + "request_id"] = intent["request_id"]
        applied = _tracer.start_span(
            "memory.apply_intent",
            context=_W3C.extract(carrier),
            links=links,
            start_time=started_ns,
            attributes=attributes,
        )
        if attributes[ATTR + "outcome"] != "applied":
            applied.set_status(trace.Status(trace.StatusCode.ERROR, attributes[ATTR + "outcome"]))
        applied.end(end_time=ended)


def log_ids() -> dict[str, str]:
    """``trace_id``/``span_id`` of the active span, for log lines (empty when none is active)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}
