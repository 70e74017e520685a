"""`memory-butler serve`: the MCP front (HTTP at /mcp, or --stdio). Migrates the schema first (idempotent)."""

from __future__ import annotations

import argparse
import logging
import os

from memory_api.cli.stack import add_data_dir_option, available_cores, resolve_database_url, settings_for
from shared import db

log = logging.getLogger("memory_butler.serve")

HELP = """\
Serve the memory tools to butlers over MCP.

HTTP (default): stateless streamable HTTP at http://HOST:PORT/mcp, so several fronts can run behind a load
balancer; /healthz (open) answers 200 when the database does, /metrics (admin token) is Prometheus text.
Every request needs 'Authorization: Bearer <token>' (create one with `memory-butler tokens create`).

--stdio: the same tools over stdin/stdout for one local agent, acting as the configured tenant's admin.

The database is DATABASE_URL, else the running stack's, else the embedded one (started if needed)."""


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    url = resolve_database_url(settings)
    db.migrate(url)
    settings = settings.model_copy(update={"database_url": url})
    if args.stdio:
        from memory_api.server import run_stdio

        run_stdio(settings)
        return 0
    import uvicorn

    from memory_api.server import build_app

    host, port = args.host or settings.api.host, args.port or settings.api.port
    workers = args.workers or settings.api.workers or front_workers(available_cores())
    log.info("front processes", extra={"workers": workers, "cores": available_cores()})
    if workers > 1:
        # Several processes need an import string; each re-reads the settings, so hand them over in the env.
        os.environ.update(
            {"DATABASE_URL": url, "MEMORY_BUTLER_API__HOST": host, "MEMORY_BUTLER_DATA_DIR": str(settings.data_dir)}
        )
        uvicorn.run(
            "memory_api.cli.serve:app_factory",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_config=None,
            lifespan="on",
            access_log=False,
        )
        return 0
    settings = settings.model_copy(update={"api": settings.api.model_copy(update={"host": host, "port": port})})
    log.info("serving MCP", extra={"url": f"http://{host}:{port}/mcp"})
    # No access log: every tool call logs one structured line (and refused tokens log too).
    uvicorn.run(build_app(settings), host=host, port=port, log_config=None, lifespan="on", access_log=False)
    return 0


def front_workers(cores: int) -> int:
    """Front processes for ``cores``: one per two cores (the front shares the box with its query embeddings'
    thread, PostgreSQL and a worker; measured on 2 cores, docs/capacity.md), at least one, at most eight."""
    return max(1, min(8, cores // 2))


def app_factory():  # noqa: ANN201 - a Starlette app, for uvicorn --workers
    from memory_api.server import build_app
    from shared.config import get_settings

    return build_app(get_settings())


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the MCP tools (HTTP at /mcp, or --stdio)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_dir_option(parser)
    parser.add_argument("--host", help="interface to listen on (default: api.host = 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: api.port = 8150)")
    parser.add_argument("--stdio", action="store_true", help="serve over stdin/stdout instead of HTTP")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help=("front processes (default: api.workers, or 0 = one per two available cores, docs/capacity.md)"),
    )
    parser.set_defaults(func=cmd_serve)
