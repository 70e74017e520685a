"""`memory-butler dead-letters list | show | redrive | drop`: what the workers gave up on, sending it back, or
giving up on it for good.

A dead letter is an episode whose consolidation failed ``consolidation.max_attempts`` times, or a write
intent the worker could not apply. ``redrive`` makes it pending again (attempts reset) and wakes the worker;
``drop`` deletes it. Dead letters nobody decides on are kept for ``schedule.dead_letters_retention_days``.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterable

from memory_api.cli.stack import add_data_dir_option, command_transaction, guarded, settings_for
from shared.config import Settings
from shared.deadletters import DeadLetter, Redriven, drop, list_dead_letters, redrive, show_dead_letter
from shared.errors import Unavailable

ACTOR = "cli:dead-letters"


def cmd_list(args: argparse.Namespace) -> int:
    with command_transaction(settings_for(args)) as conn:
        letters = list_dead_letters(conn, tenant_id=args.tenant, limit=args.limit)
    if args.json:
        print(json.dumps([d.as_dict() for d in letters], indent=2, default=str))
        return 0
    if not letters:
        print("no dead letters")
        return 0
    print(f"{'kind':<12} {'id':<36}  {'tenant':<16} {'butler':<12} {'seq':>6} {'tries':>5}  error")
    for d in letters:
        print(
            f"{d.kind:<12} {d.id!s:<36}  {d.tenant_id:<16} {d.butler:<12} {d.seq:>6} {d.attempts:>5}  "
            f"{(d.error or '-')[:80]}"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with command_transaction(settings_for(args)) as conn:
        letter = show_dead_letter(conn, entity_id=args.id)
    if letter is None:
        print(f"memory-butler dead-letters show: no episode or write intent with id {args.id}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(letter.as_dict(), indent=2, default=str))
    else:
        _print_letter(letter)
    return 0


def _print_letter(d: DeadLetter) -> None:
    print(
        f"{d.kind} {d.id}\ntenant    {d.tenant_id}\nbutler    {d.butler}\nseq       {d.seq}\n"
        f"status    {d.status}\nattempts  {d.attempts}\ncreated   {d.created_at:%Y-%m-%d %H:%M:%S%z}\n"
        f"error     {d.error or '-'}"
    )
    print(json.dumps(d.detail, indent=2, default=str, ensure_ascii=False))


def cmd_redrive(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all):
        print("memory-butler dead-letters redrive: give IDs or --all (not both)", file=sys.stderr)
        return 2
    settings = settings_for(args)
    with command_transaction(settings) as conn:
        done = redrive(conn, ids=args.ids or None, tenant_id=args.tenant, actor=ACTOR)
    episodes = sum(1 for r in done if r.kind == "episode")
    print(f"redriven: {episodes} episode(s), {len(done) - episodes} write intent(s)")
    _wake(done, settings)
    missing = set(args.ids or ()) - {r.id for r in done}
    for entity_id in sorted(missing, key=str):
        print(f"not a dead letter (or unknown): {entity_id}", file=sys.stderr)
    return 1 if missing else 0


def cmd_drop(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all):
        print("memory-butler dead-letters drop: give IDs or --all (not both)", file=sys.stderr)
        return 2
    if args.all and not args.yes:
        print(
            "memory-butler dead-letters drop --all: deletes every dead letter"
            f"{' of ' + repr(args.tenant) if args.tenant else ''} for good; add --yes to do it",
            file=sys.stderr,
        )
        return 2
    with command_transaction(settings_for(args)) as conn:
        done = drop(conn, ids=args.ids or None, tenant_id=args.tenant, actor=ACTOR)
    episodes = sum(1 for r in done if r.kind == "episode")
    print(f"dropped: {episodes} episode(s), {len(done) - episodes} write intent(s)")
    missing = set(args.ids or ()) - {r.id for r in done}
    for entity_id in sorted(missing, key=str):
        print(f"not a dead letter (or unknown): {entity_id}", file=sys.stderr)
    return 1 if missing else 0


def _wake(done: Iterable[Redriven], settings: Settings) -> None:
    """Wake each key once; if Redis is down the sweeps find the pending work anyway."""
    from memory_workers.enqueue import wake_apply, wake_consolidate  # the workers' enqueue surface

    keys = sorted({(r.kind, r.tenant_id, r.butler) for r in done})
    for kind, tenant_id, butler in keys:
        wake = wake_consolidate if kind == "episode" else wake_apply
        try:
            wake(tenant_id, butler, settings=settings)
        except Unavailable as exc:
            print(f"warning: {exc.message}; the scheduled sweeps will pick the work up", file=sys.stderr)
            return
    if keys:
        print(f"woke the workers of {len(keys)} shard key(s)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dead-letters",
        help="list, show, redrive or drop what the workers gave up on",
        description="Episodes whose consolidation and write intents whose apply failed too often.",
    )
    sub = parser.add_subparsers(dest="dead_letters_command", metavar="ACTION", required=True)

    listing = sub.add_parser("list", help="list dead letters, oldest first")
    listing.add_argument("--tenant", help="only this tenant's")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=guarded("dead-letters", cmd_list))

    show = sub.add_parser("show", help="one episode or write intent: its error, attempts and content")
    show.add_argument("id", type=uuid.UUID, metavar="ID")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=guarded("dead-letters", cmd_show))

    again = sub.add_parser("redrive", help="make dead letters pending again and wake the workers")
    again.add_argument("ids", nargs="*", type=uuid.UUID, metavar="ID")
    again.add_argument("--all", action="store_true", help="every dead letter (of --tenant, if given)")
    again.add_argument("--tenant", help="with --all: only this tenant's; with IDs: only if they are this tenant's")
    again.set_defaults(func=guarded("dead-letters", cmd_redrive))

    gone = sub.add_parser("drop", help="delete dead letters for good (no redrive possible afterwards)")
    gone.add_argument("ids", nargs="*", type=uuid.UUID, metavar="ID")
    gone.add_argument("--all", action="store_true", help="every dead letter (of --tenant, if given); needs --yes")
    gone.add_argument("--tenant", help="with --all: only this tenant's; with IDs: only if they are this tenant's")
    gone.add_argument("--yes", action="store_true", help="confirm --all")
    gone.set_defaults(func=guarded("dead-letters", cmd_drop))

    for p in (listing, show, again, gone):
        add_data_dir_option(p)
