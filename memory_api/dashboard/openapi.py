"""The OpenAPI 3.1 document of the dashboard API, made from the route table and the handlers' pydantic models."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

from memory_api.dashboard.routes import API, Api

ERROR = {"$ref": "#/components/schemas/Error"}
ERRORS = {
    "400": "Bad input (the field is named); nothing was written",
    "401": "Missing, unknown or revoked token",
    "403": "The token may not do this (not an admin, or another butler's scope)",
    "404": "No such memory",
    "409": "Refused by a state machine (invalid_transition) or an invariant (integrity_violation), or pending",
    "503": "The database did not answer in time",
}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "message", "retryable"],
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "field": {"type": "string"},
        "retryable": {"type": "boolean"},
        "request_id": {"type": "string"},
    },
}
DESCRIPTION = (
    "Read and correct what the butlers remember. Authenticate every call with 'Authorization: Bearer <token>' "
    "(the same tokens as the MCP tools). Reads need a token of the tenant (a butler token sees global + its "
    "butlers); edits, deletes and lifecycle actions need an admin token. Nothing crosses tenants. CSRF does not "
    "apply: the API reads credentials only from the Authorization header, never from cookies."
)


def _parameters(model: type[BaseModel] | None, path: str) -> list[dict[str, Any]]:
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", path)
    ]
    if model is None:
        return params
    schema = model.model_json_schema(by_alias=True)
    for name, prop in schema.get("properties", {}).items():
        params.append(
            {
                "name": name,
                "in": "query",
                "required": name in schema.get("required", []),
                "description": prop.get("description", ""),
                "schema": {k: v for k, v in prop.items() if k not in ("description", "title")},
            }
        )
    return params


def _operation(api: Api) -> dict[str, Any]:
    handler = api.handler
    responses: dict[str, Any] = {
        str(getattr(handler, "status", 200)): {
            "description": "OK",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    }
    codes = (
        ["400", "401", "403", "503"]
        + (["404"] if "{id}" in api.path else [])
        + (["409"] if api.access == "admin" else [])
    )
    responses.update(
        {
            code: {"description": ERRORS[code], "content": {"application/json": {"schema": ERROR}}}
            for code in sorted(codes)
        }
    )
    operation: dict[str, Any] = {
        "operationId": handler.__name__,
        "summary": api.summary,
        "security": [{"bearer": []}],
        "parameters": _parameters(getattr(handler, "query_model", None), api.path),
        "responses": responses,
        "x-access": api.access,
    }
    body: type[BaseModel] | None = getattr(handler, "body_model", None)
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body.model_json_schema()}},
        }
    return operation


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    """The whole document (built once per process)."""
    paths: dict[str, dict[str, Any]] = {}
    for api in API:
        paths.setdefault(api.path, {})[api.method.lower()] = _operation(api)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Memory Butler dashboard API", "version": "0.1.0", "description": DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
