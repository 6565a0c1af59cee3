"""Dashboard logins: roles, what each may do, and passwords hashed with Argon2 (argon2-cffi, a
maintained binding of the reference implementation; docs/decisions.md). The store keeps users and
sessions; this module is the policy and the hashing, no SQL."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from engine.store import StoreError

if TYPE_CHECKING:
    from engine.store import Store, UserInfo

ROLES = ("viewer", "curator", "maintainer")
# What each role may do; a maintainer may do everything a curator may.
PERMISSIONS = {
    "viewer": frozenset(),
    "curator": frozenset({"curate"}),
    "maintainer": frozenset({"curate", "settle", "launch_jobs", "manage_users"}),
}
SESSION_TTL_S = 8 * 3600.0
MIN_PASSWORD = 8
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_hasher = PasswordHasher()


class AuthError(StoreError):
    """A login or user-management request that is refused (one line, says what)."""


def may(role: str | None, action: str) -> bool:
    return role is not None and action in PERMISSIONS.get(role, frozenset())


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise AuthError(f"user name {name!r}: 1-64 letters, digits or _ . @ - (starting with a letter or digit)")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise AuthError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    return role


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise AuthError(f"password: at least {MIN_PASSWORD} characters")
    return _hasher.hash(password)


def add_user(store: Store, name: str, role: str, password: str) -> UserInfo:
    return store.add_user(check_name(name), check_role(role), hash_password(password))


def login(store: Store, name: str, password: str, ttl_s: float = SESSION_TTL_S) -> str:
    """A session token for a right name and password; the same one line for a wrong name or password."""
    stored = store.password_hash(name)
    try:
        ok = stored is not None and _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok:
        raise AuthError("wrong user name or password")
    return store.create_session(name, ttl_s)
