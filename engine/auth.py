"""Dashboard logins: roles, what each may do, and passwords hashed with Argon2 (argon2-cffi, a
maintained binding of the reference implementation; docs/decisions.md). The store keeps users and
sessions; this module is the policy and the hashing, no SQL.

A login answers in the same time whether the name exists or not (an unknown name is verified
against a dummy hash made with the same parameters), and is throttled per user name and per client:
after MAX_FAILURES wrong attempts within WINDOW_S, every attempt for that name or from that client is
refused, even with the right password, for LOCK_S, doubling with each further lock (at most
MAX_LOCK_S). The throttle lives in process memory (the dashboard is one process serving every
browser): a restart forgets it."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
MAX_FAILURES = 5
WINDOW_S = 15 * 60.0
LOCK_S = 15 * 60.0
MAX_LOCK_S = 24 * 3600.0


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


@dataclass
class _Record:
    failures: list[float] = field(default_factory=list)
    locks: int = 0
    locked_until: float = 0.0


class LoginThrottle:
    """Failed logins per key (a store's user name, a store's client), in this process's memory."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._records: dict[tuple[str, ...], _Record] = {}
        self._lock = threading.Lock()

    def check(self, keys: Sequence[tuple[str, ...]]) -> None:
        """AuthError (one line) while any of `keys` is locked."""
        now = self.clock()
        with self._lock:
            until = max((r.locked_until for k in keys if (r := self._records.get(k))), default=0.0)
        if until > now:
            minutes = max(1, round((until - now) / 60))
            raise AuthError(f"too many failed logins for this user name or from this client: try again in "
                            f"{minutes} min")

    def failed(self, keys: Sequence[tuple[str, ...]]) -> None:
        now = self.clock()
        with self._lock:
            for key in keys:
                r = self._records.setdefault(key, _Record())
                r.failures = [t for t in r.failures if now - t < WINDOW_S] + [now]
                if len(r.failures) >= MAX_FAILURES:
                    r.locks += 1
                    r.locked_until = now + min(LOCK_S * 2 ** (r.locks - 1), MAX_LOCK_S)
                    r.failures = []

    def succeeded(self, keys: Sequence[tuple[str, ...]]) -> None:
        with self._lock:
            for key in keys:
                self._records.pop(key, None)


THROTTLE = LoginThrottle()
_dummy: list[str] = []


def _dummy_hash() -> str:
    """A hash of a random password with the real parameters, made once: what an unknown name is
    verified against, so it costs what a known one does."""
    if not _dummy:
        _dummy.append(_hasher.hash(secrets.token_hex(16)))
    return _dummy[0]


def login(store: Store, name: str, password: str, ttl_s: float = SESSION_TTL_S, client: str = "",
          throttle: LoginThrottle | None = None) -> str:
    """A session token for a right name and password; the same one line, after the same work, for
    a wrong name or password; refused while the name or `client` is locked (module docstring)."""
    throttle = THROTTLE if throttle is None else throttle
    keys = [(store.location, "user", name), *([(store.location, "client", client)] if client else [])]
    throttle.check(keys)
    stored = store.password_hash(name)
    try:
        ok = _hasher.verify(stored if stored is not None else _dummy_hash(), password) and stored is not None
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok:
        throttle.failed(keys)
        raise AuthError("wrong user name or password")
    throttle.succeeded(keys)
    return store.create_session(name, ttl_s)
