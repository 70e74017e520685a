"""Operator commands on the database: `memory-butler migrate`, `db-url`, `reembed`.

Each sub-command is one ``_add_<name>(subparsers)`` function listed in SUBCOMMANDS; adding one
(e.g. ``reembed``) is writing that function and listing it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from memory_api.cli.stack import add_data_dir_option, command_database, settings_for
from shared import db


def cmd_migrate(args: argparse.Namespace) -> int:
    with command_database(settings_for(args)) as url:
        db.migrate(url, args.revision)
        print(f"schema at revision {db.current_revision(url)}")
    return 0


def cmd_db_url(args: argparse.Namespace) -> int:
    with command_database(settings_for(args)) as url:
        print(url)
    return 0


def cmd_reembed(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from shared.embedding import get_embedder
    from shared.reembed import reembed, stale_count

    with command_database(settings_for(args)) as url:
        engine = db.make_engine(url)
        embedder = get_embedder()
        with engine.begin() as conn:
            from shared.repository import embedding_version_id

            version_id = embedding_version_id(conn, embedder.version)
        total = stale_count(engine, version_id)
        print(f"{total} rows to re-embed with {embedder.version.model} ({embedder.version.revision})")
        with Progress() as progress:
            task = progress.add_task("re-embedding", total=total)
            for _, done in reembed(engine, embed=embedder.embed, version=embedder.version, batch=args.batch):
                progress.advance(task, done)
        engine.dispose()
    return 0


def _add_reembed(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "reembed",
        help="re-embed every row made with another model version (after a model change)",
        description="Backfills embeddings for episodes, facts and rules whose embedding_version_id is not the "
        "current model's, in batches with a progress bar. Interrupt it any time; it resumes.",
    )
    parser.add_argument("--batch", type=int, default=256, help="rows per model call and transaction")
    parser.set_defaults(func=cmd_reembed)
    return parser


def _add_migrate(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "migrate",
        help="upgrade the database schema (idempotent; safe from several processes)",
        description="Upgrade the database in force (DATABASE_URL, else the embedded one) to a schema revision.",
    )
    parser.add_argument("--revision", default="head", help="target revision (default: head)")
    parser.set_defaults(func=cmd_migrate)
    return parser


def _add_db_url(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "db-url",
        help="print the database URL in force (password included: it is for your shell)",
        description="Prints DATABASE_URL if set, else the running stack's database, else the embedded one's "
        "(the embedded server is only started for this and stopped again if it was not running).",
    )
    parser.set_defaults(func=cmd_db_url)
    return parser


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], argparse.ArgumentParser], ...] = (
    _add_migrate,
    _add_db_url,
    _add_reembed,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    for add in SUBCOMMANDS:
        add_data_dir_option(add(subparsers))
