"""`orchard users add NAME --role R | list | remove NAME`: the dashboard's logins.

The password comes from a prompt (typed twice, not echoed) or, when stdin is not a terminal, from
its first line (scripts: `printf '%s\\n' "$PW" | orchard users add ann --role curator`); it is never
a command-line argument, which other users of the machine could read in the process list."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from engine.errors import UsageError


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    from engine.auth import ROLES

    u = sub.add_parser("users", help="dashboard users: add, list, remove (roles: viewer, curator, maintainer)")
    usub = u.add_subparsers(dest="users_command", required=True)
    a = usub.add_parser("add", parents=[common], help="add a user; the password from a prompt or stdin")
    a.add_argument("name")
    a.add_argument("--role", required=True, choices=ROLES,
                   help="viewer: reads; curator: also curates; maintainer: also settles, launches jobs, manages users")
    a.set_defaults(func=cmd_add)
    ls = usub.add_parser("list", parents=[common], help="users and their roles")
    ls.set_defaults(func=cmd_list)
    rm = usub.add_parser("remove", parents=[common], help="remove a user and end their sessions")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_remove)


def _password() -> str:
    if not sys.stdin.isatty():
        line = sys.stdin.readline()
        if not line:
            raise UsageError("password: stdin is empty (pipe the password as its first line, or run in a terminal)")
        return line.rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Password again: ") != first:
        raise UsageError("password: the two entries differ")
    return first


def cmd_add(args: argparse.Namespace) -> int:
    from engine import auth
    from engine.store import Store

    auth.check_name(args.name)
    password = _password()
    auth.hash_password(password)  # refuse a short password before the database is opened
    with Store(args.db) as store:
        user = auth.add_user(store, args.name, args.role, password)
    print(f"added {user.name} ({user.role})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import time

    from engine.store import Store

    with Store(args.db, must_exist=True) as store:
        users = store.users()
    if not users:
        print("no users (on loopback the dashboard runs as the single local user)")
    for user in users:
        print(f"{user.name}\t{user.role}\t{time.strftime('%Y-%m-%d %H:%M', time.localtime(user.created_at))}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from engine.store import Store

    with Store(args.db, must_exist=True) as store:
        store.remove_user(args.name)
    print(f"removed {args.name}")
    return 0
