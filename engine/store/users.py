"""Dashboard users and their login sessions. Passwords arrive here already hashed (engine.auth);
a session is stored as the SHA-256 of its token, so reading the database does not let anyone in."""

from __future__ import annotations

import hashlib
import secrets
import time

from engine.store import columns
from engine.store.columns import named, select
from engine.store.connection import Connection, _valid_text
from engine.store.records import StoreError, UserInfo

_USER_COLUMNS = select(columns.USERS)


def _user(row: tuple) -> UserInfo:
    return UserInfo(**named(columns.USERS, row))


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class UsersStore(Connection):
    def add_user(self, name: str, role: str, password_hash: str) -> UserInfo:
        """A new user; a taken name is refused (remove it first)."""
        _valid_text(name, "user name")
        now = time.time()
        with self.transaction() as con:
            if con.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone():
                raise StoreError(f"user {name!r} exists already (remove it first to change it)")
            con.execute("INSERT INTO users (name, role, password_hash, created_at) VALUES (?,?,?,?)",
                        (name, role, password_hash, now))
        return UserInfo(name, role, now)

    def users(self) -> list[UserInfo]:
        return [_user(r) for r in self.con.execute(f"SELECT {_USER_COLUMNS} FROM users ORDER BY name")]

    def has_users(self) -> bool:
        return self.con.execute("SELECT 1 FROM users LIMIT 1").fetchone() is not None

    def user(self, name: str) -> UserInfo | None:
        row = self.con.execute(f"SELECT {_USER_COLUMNS} FROM users WHERE name=?", (name,)).fetchone()
        return _user(row) if row else None

    def password_hash(self, name: str) -> str | None:
        row = self.con.execute("SELECT password_hash FROM users WHERE name=?", (name,)).fetchone()
        return row[0] if row else None

    def remove_user(self, name: str) -> None:
        """Delete the user and end their sessions (their past decisions stay, under their name)."""
        with self.transaction() as con:
            if con.execute("DELETE FROM users WHERE name=?", (name,)).rowcount == 0:
                raise StoreError(f"no user {name!r}")
            con.execute("UPDATE sessions SET ended_at=? WHERE user_name=? AND ended_at IS NULL", (time.time(), name))

    def create_session(self, name: str, ttl_s: float) -> str:
        """A new session token for `name`, valid for `ttl_s` seconds (the caller checked the password)."""
        token, now = secrets.token_urlsafe(32), time.time()
        with self.transaction() as con:
            con.execute("INSERT INTO sessions (token_hash, user_name, created_at, expires_at) VALUES (?,?,?,?)",
                        (_token_hash(token), name, now, now + ttl_s))
        return token

    def session_user(self, token: str, now: float | None = None) -> UserInfo | None:
        """The user of a live session (not ended, not expired, user still there), else None."""
        row = self.con.execute(
            f"SELECT {select(columns.USERS, 'u')} FROM sessions s JOIN users u ON u.name = s.user_name "
            "WHERE s.token_hash=? AND s.ended_at IS NULL AND s.expires_at > ?",
            (_token_hash(token), time.time() if now is None else now),
        ).fetchone()
        return _user(row) if row else None

    def end_session(self, token: str) -> None:
        with self.transaction() as con:
            con.execute("UPDATE sessions SET ended_at=? WHERE token_hash=? AND ended_at IS NULL",
                        (time.time(), _token_hash(token)))
