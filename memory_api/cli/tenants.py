"""`memory-butler tenants purge TENANT --yes`: erase a tenant (the right to erasure).

Every row of the tenant goes in one transaction: episodes and their vectors, facts, rules, links, rule
applications, write intents, consolidation runs, sequences, tokens and the audit trail. One tombstone row in
``tenant_purges`` (outside every tenant) records the purge. There is no undo.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from memory_api.cli.stack import add_data_dir_option, command_transaction, guarded, settings_for
from shared.purge import purge_tenant


def cmd_purge(args: argparse.Namespace) -> int:
    if not args.yes:
        print(
            f"memory-butler tenants purge: this deletes every memory, token and audit row of tenant "
            f"{args.tenant!r} for good; add --yes to do it",
            file=sys.stderr,
        )
        return 2
    with command_transaction(settings_for(args)) as conn:
        tombstone = purge_tenant(conn, tenant_id=args.tenant, actor=f"cli:{getpass.getuser()}")
    if args.json:
        print(json.dumps(tombstone, indent=2))
        return 0
    counts = tombstone["counts"]
    print(f"purged tenant {args.tenant!r}: {sum(counts.values())} rows deleted (tombstone #{tombstone['purge_id']})")
    for table, n in counts.items():
        print(f"  {table:<20} {n}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    tenants = subparsers.add_parser(
        "tenants", help="erase a tenant (purge)", description="Tenant administration: purge erases a tenant for good."
    )
    sub = tenants.add_subparsers(dest="tenants_command", metavar="ACTION", required=True)
    purge = sub.add_parser(
        "purge",
        help="delete every row of a tenant (no undo; needs --yes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    purge.add_argument("tenant", metavar="TENANT", help="the tenant id")
    purge.add_argument("--yes", action="store_true", help="really delete it (refused without)")
    purge.add_argument("--json", action="store_true", help="print the tombstone as JSON")
    purge.set_defaults(func=guarded("tenants purge", cmd_purge))
    add_data_dir_option(purge)
