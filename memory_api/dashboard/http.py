"""What every dashboard API route shares: the caller (the Principal the bearer middleware resolved), parsed and
bounded input, database work off the event loop with a deadline, and classified errors as JSON with an HTTP status.

A route is ``async def route(call: ApiCall) -> body``; :func:`endpoint` turns it into a Starlette endpoint.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python
from sqlalchemy import Connection
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memory_api.dashboard.params import MAX_BODY
from memory_api.tools.runtime import PRINCIPAL_SCOPE_KEY, invalid_from
from memory_api.tools.services import Services, classify_db_error, opened
from shared.dashboard_queries import read_transaction
from shared.db import unit_of_work
from shared.errors import ButlerError, InvalidInput, PermissionDenied
from shared.schemas import parse_uuid
from shared.tenancy import Principal
from shared.writes import Actor

log = logging.getLogger("memory_butler.dashboard")

T = TypeVar("T")
# Dashboard reads are for people: they may take longer than an agent's fail-open read, but never hang.
READ_TIMEOUT_MS = 5_000
READ_DEADLINE_S = 6.0
WRITE_DEADLINE_S = 10.0
ACTOR = "dashboard"
STATUS = {
    "invalid_input": 400,
    "permission_denied": 403,
    "not_found": 404,
    "invalid_transition": 409,
    "integrity_violation": 409,
    "pending": 409,
    "payload_too_large": 413,
    "unavailable": 503,
    "idempotency_conflict": 409,
    "rate_limited": 429,
}


class PayloadTooLarge(InvalidInput):
    code = "payload_too_large"


@dataclass
class ApiCall:
    """One API request: who asks, the validated query and body, and the process's services."""

    request: Request
    principal: Principal
    services: Services
    request_id: str
    query: Any = None
    body: Any = None

    @property
    def tenant(self) -> str:
        return self.principal.tenant_id

    def actor(self) -> Actor:
        return Actor(name=ACTOR, request_id=self.request_id)

    def path_id(self, name: str = "id") -> uuid.UUID:
        return parse_uuid(self.request.path_params[name], field=name)

    @property
    def read_floor(self) -> int | None:
        """The WAL position this person's reads must see: their own recent edits (None: any fresh replica)."""
        return opened(self.services.plane).floor([_token_key(self.principal)])

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` in a bounded read-only transaction, in a worker thread, on a replica when one is fresh enough."""
        plane, floor = opened(self.services.plane), self.read_floor

        def work() -> T:
            with read_transaction(plane.connect(floor=floor), timeout_ms=READ_TIMEOUT_MS) as conn:
                return fn(conn)

        return await self.services.in_thread(work, deadline=READ_DEADLINE_S)

    async def write(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` in one transaction (all or nothing), in a worker thread, on the primary; this person's next
        reads see it."""
        engine, plane, key = opened(self.services.engine), opened(self.services.plane), _token_key(self.principal)

        def work() -> T:
            with unit_of_work(engine) as conn:
                out = fn(conn)
            plane.note_write([key])
            return out

        return await self.services.in_thread(work, deadline=WRITE_DEADLINE_S)


def _token_key(principal: Principal) -> str | None:
    return f"token:{principal.token_id}" if principal.token_id else None


def error_response(error: ButlerError, request_id: str | None, status: int | None = None) -> JSONResponse:
    """The classified error as JSON: {error, message, field?, retryable, request_id}."""
    return JSONResponse(
        {**error.to_dict(), "request_id": request_id}, status_code=status or STATUS.get(error.code, 500)
    )


def json_response(body: Any, *, status: int = 200, request_id: str | None = None) -> JSONResponse:
    headers = {"X-Request-Id": request_id} if request_id else None
    return JSONResponse(to_jsonable_python(body), status_code=status, headers=headers)


def _parse_query(request: Request, model: type[BaseModel]) -> Any:
    items = request.query_params.multi_items()
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise InvalidInput(f"{key}: given more than once (use a comma-separated list)", field=key)
        seen.add(key)
    try:
        return model.model_validate(dict(items))
    except ValidationError as exc:
        raise invalid_from(exc) from None


async def _parse_body(request: Request, model: type[BaseModel]) -> Any:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY:
        raise PayloadTooLarge(f"body: at most {MAX_BODY} bytes (got {declared})", field="body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise PayloadTooLarge(f"body: at most {MAX_BODY} bytes", field="body")
        chunks.append(chunk)
    try:
        return model.model_validate_json(b"".join(chunks) or b"{}")
    except ValidationError as exc:
        raise invalid_from(exc) from None


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if 0 < len(given) <= 200 else f"dash-{uuid.uuid4().hex[:16]}"


def endpoint(
    *, query: type[BaseModel] | None = None, body: type[BaseModel] | None = None, status: int = 200
) -> Callable[[Callable[[ApiCall], Awaitable[Any]]], Callable[[Request], Awaitable[Response]]]:
    """Wrap a route: principal, parsed input, one log line, classified errors as JSON (never a stack trace)."""

    def wrap(fn: Callable[[ApiCall], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def route(request: Request) -> Response:
            started, request_id = time.perf_counter(), _request_id(request)
            outcome = "ok"
            try:
                principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
                if principal is None:
                    raise PermissionDenied("the request carries no authenticated principal")
                call = ApiCall(
                    request=request, principal=principal, services=request.app.state.services, request_id=request_id
                )
                call.query = _parse_query(request, query) if query else _parse_query(request, _NoQuery)
                call.body = await _parse_body(request, body) if body else None
                return json_response(await fn(call), status=status, request_id=request_id)
            except Exception as exc:  # noqa: BLE001 - the boundary: classify, never leak a trace
                error = exc if isinstance(exc, ButlerError) else classify_db_error(exc)
                if error is None:
                    log.exception("dashboard route crashed", extra={"route": fn.__name__, "request_id": request_id})
                    error = ButlerError("internal error; the server log has the details")
                outcome = error.code
                return error_response(error, request_id)
            finally:
                log.info(
                    "dashboard call",
                    extra={
                        "route": fn.__name__,
                        "request_id": request_id,
                        "outcome": outcome,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    },
                )

        route.query_model, route.body_model, route.status = query, body, status  # type: ignore[attr-defined]
        return route

    return wrap


class _NoQuery(BaseModel):
    """Routes without parameters refuse any (a typo is a 400, not silently ignored)."""

    model_config = {"extra": "forbid"}
