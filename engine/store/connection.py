"""The connection to one database file and its transactions (SQLite in WAL mode).

`Connection` opens (and for writers migrates) the file; each concern of the store (runs, curation,
training) is a subclass adding its queries, and `engine.store.Store` combines them."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from engine import paths
from engine.store import schema
from engine.store.records import StoreError
from engine.store.schema import APP_ID, _check_file, _readonly_uri, _schema_tables


def default_db_path() -> Path:
    """$ORCHARD_DB, else `$ORCHARD_HOME/orchard.db`, else `data/orchard.db` (engine.paths)."""
    return paths.db_path()


class Connection:
    """A connection to one Orchard database (see `engine.store.Store`)."""

    def __init__(self, path: str | Path | None = None, readonly: bool = False, must_exist: bool = False) -> None:
        # Absolute, so job workers (started in the repository root) and stored log paths find it.
        self.path = Path(os.path.abspath(path if path is not None else default_db_path()))
        version = _check_file(self.path)
        # must_exist: a command about rows that must be there already creates no file.
        if (readonly or must_exist) and not self.path.exists():
            raise StoreError(f"{self.path}: no such database (a search or `orchard demo` creates it)")
        if readonly:
            if version != schema.SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} (this Orchard reads {schema.SCHEMA_VERSION}); "
                    "run any `orchard` command once to migrate it"
                )
            try:
                self.con = sqlite3.connect(_readonly_uri(self.path), uri=True, timeout=30.0,
                                           isolation_level=None)
                self._check_tables()
            except sqlite3.DatabaseError as e:
                raise StoreError(f"{self.path}: corrupt or unreadable database ({e})") from None
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.con.execute("PRAGMA journal_mode=WAL")
            self.con.execute("PRAGMA synchronous=NORMAL")
            self.con.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            self._check_tables()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: corrupt or unreadable database ({e})") from None

    def _check_tables(self) -> None:
        """A database at the current version that lacks one of its tables was damaged by hand:
        say so once, here, instead of failing in whichever query meets the gap first."""
        have = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = sorted(_schema_tables() - have)
        if missing:
            self.con.close()
            raise StoreError(f"{self.path}: damaged database: table(s) {', '.join(missing)} missing")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. Nested inside another (a command that saves pairs and samples
        together), it is a savepoint of the outer one, so everything commits or nothing does."""
        if self.con.in_transaction:
            self.con.execute("SAVEPOINT nested")
            try:
                yield self.con
            except BaseException:
                self.con.execute("ROLLBACK TO nested")
                self.con.execute("RELEASE nested")
                raise
            self.con.execute("RELEASE nested")
            return
        self.con.execute("BEGIN IMMEDIATE")
        try:
            yield self.con
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    def _migrate(self) -> None:
        with self.transaction() as con:
            con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            con.execute("INSERT OR IGNORE INTO meta VALUES ('app', ?)", (APP_ID,))
            row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            current = int(row[0]) if row else 0
            for version, sql in schema.MIGRATIONS:
                if version > current:
                    for statement in sql.split(";"):
                        if statement.strip():
                            con.execute(statement)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),))

    @property
    def schema_version(self) -> int:
        return int(self.con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])


def _in(column: str, value: Any, where: list[str], args: list[Any]) -> None:
    values = [value] if isinstance(value, str) else list(value)
    where.append(f"{column} IN ({','.join('?' * len(values))})")
    args.extend(values)


def _valid_text(value: str, what: str) -> str:
    """`value` if SQLite can store it: a lone surrogate (a non-UTF-8 byte in a command-line
    argument, a `\\ud800` JSON escape) is refused as one line instead of a UnicodeEncodeError."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise StoreError(f"{what} {value!r}: not valid Unicode text (a lone surrogate at character {e.start})") from None
    return value
