"""`orchard db copy SRC DST`: move a store between a SQLite file and a PostgreSQL server."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_db_copy(args: argparse.Namespace) -> int:
    from engine.store import postgres
    from engine.store.copy import copy_store

    counts = copy_store(args.src, args.dst)
    shown = postgres.redact(args.dst) if postgres.is_url(args.dst) else args.dst
    print(f"copied {sum(counts.values())} rows in {len(counts)} tables to {shown} "
          f"({', '.join(f'{t} {n}' for t, n in counts.items() if n) or 'an empty store'})")
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `db copy`."""
    db = sub.add_parser("db", help="manage the store itself (copy it between SQLite and PostgreSQL)")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    cp = db_sub.add_parser(
        "copy", help="copy every row of store SRC into the empty store DST (a file path or a postgresql:// URL)",
        description="Copies in one transaction with row counts checked; refuses a destination that has rows.")
    cp.add_argument("src", help="source store: a SQLite file or postgresql://user[:password]@host[:port]/db")
    cp.add_argument("dst", help="destination store (created and migrated if new; must be empty)")
    cp.set_defaults(func=cmd_db_copy)
