"""The dashboard, served by the front: the JSON API under /api (bearer tokens, like /mcp) and the web UI.

The UI's pages and static files are public (they hold no data: the browser's script fetches /api with the token
the person signed in with); so is /api/openapi.json. Everything else under /api goes through the bearer middleware.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from memory_api.dashboard.openapi import document
from memory_api.dashboard.routes import API

STATIC = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/memory": "fleet.html", "/butlers/{name}/memory": "butler.html"}
PUBLIC_PREFIXES = ("/static/",)
PUBLIC_PATHS = frozenset({"/", "/memory", "/api/openapi.json"})
# Security headers for the pages: scripts and styles only from this origin, no framing, no referrer leaks.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    """Paths the bearer middleware lets through: the pages, their static files and the OpenAPI document."""
    if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return True
    parts = path.split("/")
    return len(parts) == 4 and parts[1] == "butlers" and parts[3] == "memory" and bool(parts[2])


def _page(filename: str) -> Route:
    async def page(_: Request) -> Response:
        return FileResponse(STATIC / filename, media_type="text/html", headers=PAGE_HEADERS)

    return page  # type: ignore[return-value]


async def openapi_json(_: Request) -> Response:
    return JSONResponse(document())


def routes() -> list[BaseRoute]:
    """Every dashboard route: the API table, the OpenAPI document, the pages and /static."""
    api = [Route(a.path, a.handler, methods=[a.method], name=a.handler.__name__) for a in API]
    pages = [Route(path, _page(filename), methods=["GET"]) for path, filename in PAGES.items()]
    return [
        Route("/api/openapi.json", openapi_json, methods=["GET"]),
        *api,
        *pages,
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
