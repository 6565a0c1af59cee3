"""The SQLite connection as the store uses it: every driver error comes out as a `StoreError`.

WHY: code above the store (the job worker's heartbeat, the dashboard's views) catches `StoreError`
alone, on either backend; PostgreSQL's errors are turned into StoreErrors in engine.store.postgres,
and this wrapper does the same for SQLite's (a database locked past the busy timeout, a disk I/O
error, a read-only file). The error raised is of a class that is both a StoreError and the driver's
own error class, so SQL run on `store.con` directly (the store's tests) still sees the driver's kind.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from engine.store.records import DriverError

_CLASSES: dict[type, type] = {}


def store_error(e: sqlite3.Error, where: str) -> DriverError:
    """`e` as a DriverError (a StoreError) naming the database (`where`), still an instance of the
    driver's class."""
    cls = type(e)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"SQLite{cls.__name__}", (DriverError, cls), {"__module__": __name__})
    return _CLASSES[cls](f"{where}: {e}")


class SQLiteCursor:
    """A sqlite3 cursor whose reads raise StoreErrors (a step of a SELECT can fail too)."""

    def __init__(self, cursor: sqlite3.Cursor, where: str) -> None:
        self._cursor, self._where = cursor, where

    def fetchone(self) -> Any:
        try:
            return self._cursor.fetchone()
        except sqlite3.Error as e:
            raise store_error(e, self._where) from None

    def fetchall(self) -> list[Any]:
        try:
            return self._cursor.fetchall()
        except sqlite3.Error as e:
            raise store_error(e, self._where) from None

    def __iter__(self) -> Iterator[Any]:
        while (row := self.fetchone()) is not None:
            yield row

    def __getattr__(self, name: str) -> Any:  # rowcount, lastrowid, description
        return getattr(self._cursor, name)


class SQLiteConnection:
    """The sqlite3.Connection calls the store makes (execute, executemany, commit, rollback,
    in_transaction, close), raising StoreErrors."""

    def __init__(self, raw: sqlite3.Connection, where: str) -> None:
        self.raw, self.where = raw, where

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    def execute(self, sql: str, args: Sequence[Any] = ()) -> SQLiteCursor:
        try:
            return SQLiteCursor(self.raw.execute(sql, args), self.where)
        except sqlite3.Error as e:
            raise store_error(e, self.where) from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> SQLiteCursor:
        try:
            return SQLiteCursor(self.raw.executemany(sql, rows), self.where)
        except sqlite3.Error as e:
            raise store_error(e, self.where) from None

    def commit(self) -> None:
        try:
            self.raw.commit()
        except sqlite3.Error as e:
            raise store_error(e, self.where) from None

    def rollback(self) -> None:
        try:
            self.raw.rollback()
        except sqlite3.Error as e:
            raise store_error(e, self.where) from None

    def close(self) -> None:
        self.raw.close()
