"""`memory-butler encryption new-key | rotate`: field-level encryption keys (shared.crypto, shared.rekey)."""

from __future__ import annotations

import argparse

from memory_api.cli.stack import add_data_dir_option, command_database, settings_for
from shared import db


def cmd_new_key(args: argparse.Namespace) -> int:
    from shared.crypto import new_key

    print(new_key())
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    from shared.rekey import RotationError, rotate, stale_count

    settings = settings_for(args)
    active = settings.encryption.active_key
    if not active:
        print("encryption.active_key is not set: nothing to rotate to")
        return 2
    with command_database(settings) as url:
        engine = db.make_engine(url)
        try:
            print(f"{stale_count(engine, active=active)} sealed facts to re-seal under key {active!r}")
            done, skipped = 0, []
            for progress in rotate(engine, settings=settings.encryption, batch=args.batch):
                done += progress.rotated
                skipped += progress.skipped
        except RotationError as exc:
            print(f"rotation not started: {exc}")
            return 2
        finally:
            engine.dispose()
    print(f"{done} sealed facts re-sealed under key {active!r}")
    if skipped:
        print(
            f"{len(skipped)} sealed facts do not open with the configured keys and were left as they are "
            f"(list their old key in encryption.keys and run again), e.g. {', '.join(map(str, skipped[:5]))}"
        )
        return 1
    print("every sealed fact is under the active key: the old keys can be removed from encryption.keys")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("encryption", help="field-level encryption keys: new-key, rotate")
    sub = parser.add_subparsers(dest="encryption_command", metavar="ACTION", required=True)
    new = sub.add_parser("new-key", help="print a fresh random AES-256 key (base64) for encryption.keys")
    new.set_defaults(func=cmd_new_key)
    rotate = sub.add_parser(
        "rotate",
        help="re-seal every sealed fact under encryption.active_key",
        description="Opens each fact sealed under another key id with that key (it must still be listed in "
        "encryption.keys) and seals it again under the active key, in batches; resumable.",
    )
    rotate.add_argument("--batch", type=int, default=500, help="rows per transaction")
    rotate.set_defaults(func=cmd_rotate)
    add_data_dir_option(rotate)
