"""What every tool call shares: the caller (Principal), the process's services, bounded database work off the
event loop, one log line per call, and classified errors turned into tool results (never stack traces)."""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent
import psycopg
from pydantic import BaseModel, ValidationError

from memory_api.tools.services import Services, classify_db_error, opened
from shared import telemetry, tracing
from shared.errors import ButlerError, InvalidInput, PermissionDenied, Unavailable
from shared.reads import Reader
from shared.schemas import RequestContext
from shared.tenancy import Principal
from shared.writes import Actor

log = logging.getLogger("memory_butler.api")

PRINCIPAL_SCOPE_KEY = "memory_butler.principal"  # set on the ASGI scope by the bearer-token middleware
# A read may take read_timeout_ms in the database; this much more covers connect and embedding. Then it degrades.
READ_GRACE_S = 1.0
# A write that gets no answer in this long is reported unavailable (retry with the same idempotency_key).
WRITE_DEADLINE_S = 10.0

T = TypeVar("T")
_call: ContextVar[Call] = ContextVar("memory_butler_call")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Call:
    """One tool call: who is calling, with which lineage, on which services."""

    tool: str
    principal: Principal
    services: Services
    request_id: str
    lineage: RequestContext | None = None
    outcome: str = "ok"

    @property
    def tenant(self) -> str:
        return self.principal.tenant_id

    def actor(self, butler: str | None = None) -> Actor:
        return Actor(name=butler or self.principal.default_butler, request_id=self.request_id)

    def reader(self, *ids: uuid.UUID) -> Reader:
        """The Reader for this call: a replica, unless a recent write of this front that the call names (one of
        ``ids``, its request_id) or its token changed synchronously needs a server that has replayed it."""
        keys = [*(f"id:{i}" for i in ids), self._request_key, _token_key(self.principal)]
        return opened(self.services.reader).after(opened(self.services.plane).floor(keys))

    def wrote(self, ids: Iterable[uuid.UUID], *, synchronous: bool = False) -> None:
        """After a commit, in the write's thread: reads naming ``ids`` or this request_id (and, for a change made
        at once rather than accepted for the workers, any read by this token) see it (see :meth:`reader`)."""
        keys = [*(f"id:{i}" for i in ids), self._request_key]
        opened(self.services.plane).note_write([*keys, _token_key(self.principal) if synchronous else None])

    @property
    def _request_key(self) -> str | None:
        """The caller's own request_id (one the front made up cannot be named by a later read)."""
        return f"request:{self.lineage.request_id}" if self.lineage and self.lineage.request_id else None

    async def read(self, fn: Callable[[], T]) -> T:
        """Run a read in a worker thread; Unavailable if the database does not answer within the read bound."""
        deadline = self.services.settings.memory.retrieval.read_timeout_ms / 1000 + READ_GRACE_S
        return await self.services.read(fn, deadline=deadline)

    async def read_or_degrade(self, fn: Callable[[], T], empty: T) -> tuple[T, str | None]:
        """Reads fail open: on Unavailable the caller gets ``empty`` and the reason, within the read bound."""
        try:
            return await self.read(fn), None
        except Unavailable as exc:
            self.outcome = "degraded"
            log.warning(
                "read degraded",
                extra={"tool": self.tool, "tenant": self.tenant, "request_id": self.request_id, "reason": exc.message},
            )
            return empty, exc.message

    async def write(self, fn: Callable[[], T]) -> T:
        """Run a write transaction on the writes' threads; database trouble becomes Unavailable (nothing accepted)."""
        return await self.services.write(fn, deadline=WRITE_DEADLINE_S, late=_LATE_WRITE)

    async def accept(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run an accept's statement on the event loop (Services.accept), under the same deadline as a write."""
        return await self.services.accept(fn, deadline=WRITE_DEADLINE_S, late=_LATE_WRITE)


_LATE_WRITE = "; the write may still complete: retry with the same idempotency_key"


def _token_key(principal: Principal) -> str | None:
    return f"token:{principal.token_id}" if principal.token_id else None


def current_call() -> Call:
    """The call being served (set by :func:`tool_call` around the tool body)."""
    return _call.get()


def principal_of(ctx: Context[Services, Any], services: Services) -> Principal:
    """The authenticated caller: from the HTTP request's scope (set by the auth middleware), else stdio's."""
    request = getattr(ctx.request_context, "request", None)
    if request is not None:
        principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
        if principal is None:
            raise PermissionDenied("the request carries no authenticated principal")
        return principal
    if services.stdio_principal is None:
        raise PermissionDenied("no principal: serve over HTTP with a bearer token, or over stdio")
    return services.stdio_principal


def error_result(exc: ButlerError, request_id: str | None) -> CallToolResult:
    """An is_error tool result whose text and structured content are the classified error."""
    body = {**exc.to_dict(), "request_id": request_id}
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(body))], structured_content=body, is_error=True
    )


def answer(result: Any) -> Any:
    """A tool's result model as its MCP result: the structured content whole (every field, null where it does not
    apply, as the outputSchema says) and, for a client that reads only the text (a model reading the tool result),
    the same JSON compact and without the nulls. The SDK would indent it and keep every null: a 20-turn search
    was 34 KB of text."""
    if not isinstance(result, BaseModel):
        return result
    return CallToolResult(
        content=[TextContent(type="text", text=result.model_dump_json(exclude_none=True))],
        structured_content=result.model_dump(mode="json", by_alias=True),
    )


def tool_call(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap a tool body: bind the Call, log one line, and answer classified errors as is_error results."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(**kwargs: Any) -> Any:
        started = time.perf_counter()
        ctx: Context[Services, Any] = kwargs["ctx"]
        lineage: RequestContext | None = kwargs.get("request_context")
        request_id = (lineage.request_id if lineage else None) or _new_request_id()
        services: Services = ctx.request_context.lifespan_context
        call: Call | None = None
        try:
            call = Call(
                tool=name,
                principal=principal_of(ctx, services),
                services=services,
                request_id=request_id,
                lineage=lineage,
            )
            limits = services.token_limits
            assert limits is not None
            limits.enter(call.principal.token_id)  # over the token's rate or concurrency: RateLimited, nothing done
            token = _call.set(call)
            try:
                return answer(await fn(**kwargs))
            finally:
                _call.reset(token)
                limits.leave(call.principal.token_id)
        except Exception as exc:  # noqa: BLE001 - the boundary: classify, never leak a trace to the caller
            error = exc if isinstance(exc, ButlerError) else classify_db_error(exc)
            if error is None:
                log.exception("tool crashed", extra={"tool": name, "request_id": request_id})
                error = ButlerError("internal error; the server log has the details")
            if call is not None:
                call.outcome = error.code
            _log(name, call, request_id, started, error=error)
            return error_result(error, request_id)
        finally:
            if call is not None and call.outcome in ("ok", "degraded"):
                _log(name, call, request_id, started)

    return wrapper


def _log(tool: str, call: Call | None, request_id: str, started: float, error: ButlerError | None = None) -> None:
    duration_ms = round((time.perf_counter() - started) * 1000, 2)
    outcome = error.code if error else (call.outcome if call else "ok")
    if call is not None:
        telemetry.observe_tool(tool, outcome, duration_ms / 1000)
    tracing.annotate_call(request_id=request_id, tenant=call.tenant if call else None, outcome=outcome)
    extra = {
        "tool": tool,
        "tenant": call.tenant if call else None,
        "request_id": request_id,
        "duration_ms": duration_ms,
        "outcome": outcome,
    }
    lineage = call.lineage if call else None
    if lineage is not None:
        extra.update(subrequest_id=lineage.subrequest_id, segment_id=lineage.segment_id)
    if error is not None:
        extra.update(error_class=error.code, error_field=error.field, retryable=error.retryable)
        log.info("tool call failed: %s", error.message, extra=extra)
    else:
        log.info("tool call", extra=extra)


class ClassifiedTool(Tool):
    """A Tool whose argument errors (unknown names, wrong types, broken bounds) come back classified.

    The arguments are validated once, by the SDK's ``run``: its ToolError caused by a ValidationError is the
    caller's mistake, classified here. A tool body's result is already its MCP result (``answer``: the output
    model's own dump), so the SDK's conversion, which would validate the dump against the same model again, is
    skipped for it."""

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        allowed = _argument_names(self.fn_metadata.arg_model)
        unknown = sorted(set(arguments) - allowed)
        if unknown:
            return self._refuse(unknown_argument(unknown[0], self.name, allowed), _request_id(arguments), context)
        unstorable = unstorable_text(arguments)
        if unstorable is not None:
            return self._refuse(unstorable, _request_id(arguments), context)
        try:
            result = await super().run(arguments, context, convert_result=False)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            return self._refuse(invalid_from(exc.__cause__), _request_id(arguments), context)
        if convert_result and not isinstance(result, CallToolResult):
            return self.fn_metadata.convert_result(result)
        return result

    def _refuse(self, error: InvalidInput, request_id: str, context: Any) -> CallToolResult:
        log.info(
            "tool call refused: %s",
            error.message,
            extra={
                "tool": self.name,
                "request_id": request_id,
                "outcome": error.code,
                "error_class": error.code,
                "error_field": error.field,
            },
        )
        try:
            services = context.request_context.lifespan_context
        except (ValueError, AttributeError):  # called outside a request (tests of the tool itself)
            services = None
        if isinstance(services, Services):  # counted; its latency (it never ran) stays out of the histogram
            telemetry.observe_tool(self.name, error.code, None)
        return error_result(error, request_id)


def unknown_argument(name: str, tool: str, allowed: Iterable[str]) -> InvalidInput:
    """An argument the tool does not take, named; one with an empty name is named ``arguments`` (an empty field
    would be dropped from the error and name nothing)."""
    takes = f"{tool} takes {', '.join(sorted(allowed))}"
    if not name:
        return InvalidInput(f"arguments: an argument with an empty name; {takes}", field="arguments")
    return InvalidInput(f"{name}: unknown argument; {takes}", field=name)


def unstorable_text(value: Any, path: str = "") -> InvalidInput | None:
    """The first string (or object key) PostgreSQL cannot store - a NUL character or a lone surrogate - as an
    InvalidInput naming where it is (``episodes.1.metadata.note``), else None."""
    if isinstance(value, str):
        if "\x00" in value:
            return InvalidInput(f"{path or 'arguments'}: contains a NUL character", field=path or "arguments")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return InvalidInput(
                f"{path or 'arguments'}: contains a lone surrogate (not valid Unicode text)", field=path or "arguments"
            )
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and unstorable_text(key) is not None:
            return unstorable_text(key, path or "arguments")
        found = unstorable_text(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def invalid_from(exc: ValidationError) -> InvalidInput:
    """The first broken rule, naming the field (``episodes.2.content``) and the rule."""
    err = exc.errors()[0]
    # pydantic adds the union member it tried ("str", "int", "constrained-str", "list[...]") to the location; the
    # caller named no such thing, so it is left out.
    parts = [
        str(p)
        for p in err["loc"]
        if isinstance(p, int) or (p not in _UNION_TAGS and "[" not in p and not p.startswith("constrained-"))
    ]
    field = ".".join(parts) or "arguments"
    return InvalidInput(f"{field}: {err['msg']}", field=field)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "uuid"})
MAX_REQUEST_ID = 200  # RequestContext.request_id's bound


@functools.cache
def _argument_names(model: type[BaseModel]) -> frozenset[str]:
    """The names a tool's arguments model takes (aliases where set); one entry per registered tool."""
    return frozenset(field.alias or key for key, field in model.model_fields.items())


def _request_id(arguments: dict[str, Any]) -> str:
    """The caller's request_context.request_id, read before validation (the arguments may be invalid), else a new
    one; one that breaks RequestContext's bound is not echoed (a 1 MB request_id came back twice in its own
    refusal)."""
    lineage = arguments.get("request_context")
    value = lineage.get("request_id") if isinstance(lineage, dict) else None
    if isinstance(value, str) and 1 <= len(value) <= MAX_REQUEST_ID:
        return value
    return _new_request_id()


def _new_request_id() -> str:
    """The id the front gives a call that brought none (echoed in its result and its log line)."""
    return f"srv-{uuid.uuid4().hex[:16]}"
