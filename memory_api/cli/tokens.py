"""`memory-butler tokens create | list | revoke`: bearer tokens for butlers and operators."""

from __future__ import annotations

import argparse
import re
import sys
import uuid
from datetime import datetime, timedelta, timezone

from memory_api.cli.stack import add_data_dir_option, command_transaction, guarded, settings_for
from shared import tenancy


DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def duration(value: str) -> timedelta:
    """'90s', '30m', '12h', '30d', '2w': a positive lifetime for a token."""
    match = DURATION.match(value.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a positive duration such as 30m, 12h, 30d or 2w")
    return timedelta(**{UNITS[match.group(2)]: float(match.group(1))})


def cmd_create(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    tenant_id = args.tenant or settings.tenant_id
    expires_at = datetime.now(timezone.utc) + args.expires_in if args.expires_in else None
    with command_transaction(settings) as conn:
        tenancy.ensure_tenant(conn, tenant_id=tenant_id)
        token_id, token = tenancy.create_token(
            conn, tenant_id=tenant_id, name=args.name, butlers=args.butler, role=args.role, expires_at=expires_at
        )
    print(f"token id  {token_id}\ntenant    {tenant_id}\nrole      {args.role}\nbutlers   {', '.join(args.butler)}")
    print(f"expires   {expires_at:%Y-%m-%d %H:%M:%S%z}" if expires_at else "expires   never (until revoked)")
    print(
        f"\n{token}\n\nThis is the only time the token is shown; store it now. Send it as 'Authorization: Bearer <token>'."
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    with command_transaction(settings) as conn:
        tokens = tenancy.list_tokens(conn, tenant_id=args.tenant)
    if not tokens:
        print("no tokens")
        return 0
    print(
        f"{'id':<36}  {'tenant':<16} {'name':<20} {'role':<6} {'created':<19} {'revoked':<19} {'expires':<19} butlers"
    )
    for t in tokens:
        revoked = t.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if t.revoked_at else "-"
        expires = t.expires_at.strftime("%Y-%m-%d %H:%M:%S") if t.expires_at else "-"
        print(
            f"{t.id!s:<36}  {t.tenant_id:<16} {t.name:<20} {t.role:<6} "
            f"{t.created_at:%Y-%m-%d %H:%M:%S} {revoked:<19} {expires:<19} {','.join(t.butlers)}"
        )
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    with command_transaction(settings) as conn:
        revoked = tenancy.revoke_token(conn, token_id=args.token_id)
    if not revoked:
        print(f"memory-butler tokens revoke: no live token with id {args.token_id}", file=sys.stderr)
        return 1
    print(f"revoked {args.token_id}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    tokens = subparsers.add_parser(
        "tokens",
        help="create, list or revoke bearer tokens",
        description="Bearer tokens: each belongs to one tenant and covers some butlers ('*' = all). "
        "Only a hash is stored; the token itself is printed once, at creation.",
    )
    sub = tokens.add_subparsers(dest="tokens_command", metavar="ACTION", required=True)

    create = sub.add_parser("create", help="create a token and print it (once)")
    create.add_argument("--tenant", help="tenant id, created if missing (default: the configured tenant_id)")
    create.add_argument("--name", required=True, help="what the token is for, e.g. 'health butler'")
    create.add_argument(
        "--butler",
        action="append",
        required=True,
        help="a butler the token may act as; repeat for more, or '*' for all",
    )
    create.add_argument(
        "--role",
        choices=tenancy.ROLES,
        default="butler",
        help="butler (read/write memory), admin (also operations, its tenant's /metrics) or "
        "operator (every tenant's /metrics and nothing else); default butler",
    )
    create.add_argument(
        "--expires-in",
        type=duration,
        metavar="DURATION",
        help="the token stops working after this long, e.g. 12h, 30d, 2w (default: never)",
    )
    create.set_defaults(func=guarded("tokens", cmd_create))

    listing = sub.add_parser("list", help="list tokens (never the secrets)")
    listing.add_argument("--tenant", help="only this tenant's tokens")
    listing.set_defaults(func=guarded("tokens", cmd_list))

    revoke = sub.add_parser("revoke", help="revoke a token by id; it stops working at once")
    revoke.add_argument("token_id", type=uuid.UUID, metavar="TOKEN_ID")
    revoke.set_defaults(func=guarded("tokens", cmd_revoke))

    for parser in (create, listing, revoke):
        add_data_dir_option(parser)
