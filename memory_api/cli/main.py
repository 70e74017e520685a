"""`memory-butler`: one command for the whole lifecycle. Each sub-command lives in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

from pathlib import Path

from shared.config import ConfigError, load_settings
from shared.logs import configure_cli_logging, configure_logging

# module name -> registers its sub-commands on the parser; modules that do not exist yet are skipped
COMMAND_MODULES = (
    "memory_api.cli.stack",  # up, down, status
    "memory_api.cli.admin",  # migrate, reembed
    "memory_api.cli.tokens",  # tokens create|list|revoke
    "memory_api.cli.tenants",  # tenants purge
    "memory_api.cli.serve",  # serve (the MCP front)
    "memory_api.cli.deadletters",  # dead-letters list|show|redrive
    "memory_api.cli.encryption",  # encryption new-key|rotate
    "memory_api.cli.loadtest",  # loadtest burst
    "memory_api.cli.bench",  # bench ...
)


# Long-running commands log as services do (JSON lines on stderr); every other command prints only its answer
# and warnings, its libraries' chatter (alembic's migration lines, ...) going to <data dir>/logs/cli.log.
SERVICE_COMMANDS = frozenset({"serve", "up"})


def _cli_log(args: argparse.Namespace) -> Path | None:
    try:
        data_dir = getattr(args, "data_dir", None) or load_settings().data_dir
    except ConfigError:
        return None  # the command itself reports the bad configuration
    return data_dir.expanduser() / "logs" / "cli.log"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-butler",
        description=(
            "Memory Butler: shared long-term memory for AI agents.\n\n"
            "Start here:  memory-butler up      (embedded PostgreSQL+pgvector, Redis, MCP front, worker, beat, Flower)\n"
            "Then:        memory-butler status  /  memory-butler down"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command in SERVICE_COMMANDS:
        configure_logging()
    else:
        configure_cli_logging(_cli_log(args))
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"memory-butler: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
