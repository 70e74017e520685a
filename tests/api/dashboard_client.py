"""A tiny client for the dashboard API tests: one bearer token, JSON in and out, over real HTTP to the front."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import Engine, text


class Dash:
    """Calls /api on a running front with one token (or none)."""

    def __init__(self, base: str, token: str | None) -> None:
        self.base, self.token = base, token

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        **params: Any,
    ) -> httpx.Response:
        sent = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.request(
            method,
            self.base + path,
            params=params or None,
            json=json,
            content=content,
            headers={**sent, **(headers or {})},
            timeout=30,
        )

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        response = self.call(method, path, **kw)
        assert response.status_code == 200, (response.status_code, response.text)
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.ok("GET", path, **params)


def events_about(engine: Engine, tenant: str, entity_id: object) -> list[dict[str, Any]]:
    """The memory_events rows about one memory, oldest first."""
    with engine.connect() as conn:
        return [
            dict(r)
            for r in conn.execute(
                text(
                    "SELECT event_type, actor, request_id, payload FROM memory_events WHERE tenant_id = :t "
                    "AND entity_id = :e ORDER BY id"
                ),
                {"t": tenant, "e": entity_id},
            ).mappings()
        ]


def count_events(engine: Engine, tenant: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM memory_events WHERE tenant_id = :t"), {"t": tenant}).scalar_one()
