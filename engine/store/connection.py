"""The connection to one database and its transactions: a SQLite file (WAL mode) or a PostgreSQL
server (a `postgresql://` URL, through engine.store.postgres).

`Connection` opens (and for writers migrates) the database; each concern of the store (runs,
curation, training) is a subclass adding its queries, and `engine.store.Store` combines them."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from engine import paths
from engine.store import postgres, schema
from engine.store.records import MissingStoreError, StoreError
from engine.store.schema import APP_ID, _check_file, _readonly_uri, _schema_tables
from engine.store.sqlite import SQLiteConnection

WAL_CHECKPOINT_PAGES = 10_000  # WAL pages (4 KiB) after which a commit checkpoints; SQLite's default is 1,000


def default_db_path() -> Path | str:
    """$ORCHARD_DB, else `$ORCHARD_HOME/orchard.db`, else `data/orchard.db` (engine.paths)."""
    return paths.db_path()


def data_version(location: str | Path) -> tuple[str, ...]:
    """A token that changes when anything is committed on the PostgreSQL server at `location`
    (its write-ahead-log position; other databases' writes change it too: a cache reloads early,
    never late). An unreachable server gives a token that changes each second: the read that
    follows says why."""
    try:
        con = postgres.PgConnection(str(location), readonly=True)
    except StoreError:
        return ("unreachable", str(int(time.time())))
    try:
        return (str(con.execute("SELECT pg_current_wal_lsn()").fetchone()[0]),)
    except StoreError:
        return ("unreachable", str(int(time.time())))
    finally:
        con.close()


class Connection:
    """A connection to one Orchard database (see `engine.store.Store`)."""

    # engine.store.sqlite.SQLiteConnection, or engine.store.postgres.PgConnection, which answers the
    # same calls (execute, executemany, commit, rollback, in_transaction) plus PostgreSQL's own; both
    # raise StoreErrors, never a driver's error.
    con: Any

    def __init__(self, path: str | Path | None = None, readonly: bool = False, must_exist: bool = False) -> None:
        location = path if path is not None and str(path) != "" else default_db_path()
        self.dialect = "postgresql" if postgres.is_url(location) else "sqlite"
        if self.dialect == "postgresql":
            self._open_postgres(str(location), readonly, must_exist)
            return
        # Absolute, so job workers (started in the repository root) and stored log paths find it.
        self.path: Path | str = Path(os.path.abspath(location))
        # What another process opens (a job worker): the path, or the full URL (with any password).
        self.location = str(self.path)
        version = _check_file(self.path)
        # must_exist: a command about rows that must be there already creates no file.
        if (readonly or must_exist) and not self.path.exists():
            raise MissingStoreError(f"{self.path}: no such database (a search or `orchard demo` creates it)")
        if readonly:
            if version != schema.SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} (this Orchard reads {schema.SCHEMA_VERSION}); "
                    "run any `orchard` command once to migrate it"
                )
            try:
                self.con = SQLiteConnection(sqlite3.connect(_readonly_uri(self.path), uri=True, timeout=30.0,
                                                            isolation_level=None), str(self.path))
                self._check_tables()
            except sqlite3.DatabaseError as e:
                raise StoreError(f"{self.path}: corrupt or unreadable database ({e})") from None
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = SQLiteConnection(sqlite3.connect(self.path, timeout=30.0, isolation_level=None), str(self.path))
            self.con.execute("PRAGMA journal_mode=WAL")
            self.con.execute("PRAGMA synchronous=NORMAL")
            # A checkpoint (copy the WAL into the file, fsync) after ~40 MiB of WAL, not SQLite's ~4 MiB:
            # the search's writer spent a quarter of its commit time in them (docs/decisions.md,
            # "The store writer merges a batch's writes and checkpoints less often").
            self.con.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            self.con.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            self._check_tables()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: corrupt or unreadable database ({e})") from None

    def _open_postgres(self, url: str, readonly: bool, must_exist: bool) -> None:
        """The PostgreSQL counterpart of opening a file: the same checks before anything is written
        (an Orchard schema at a version this code reads), then the same migrations."""
        self.location, self.path = url, postgres.redact(url)  # `path` names the store in messages
        self.con = postgres.PgConnection(url, readonly=readonly)
        try:
            version = self._pg_version()
            if (readonly or must_exist) and version == 0:
                raise MissingStoreError(f"{self.path}: no Orchard database there yet (a search or `orchard demo` creates it)")
            if readonly and version != schema.SCHEMA_VERSION:
                raise StoreError(f"{self.path}: schema version {version} (this Orchard reads {schema.SCHEMA_VERSION}); "
                                 "run any `orchard` command once to migrate it")
            if not readonly:
                self._migrate()
            self._check_tables()
        except BaseException:
            self.con.close()
            raise

    def _pg_version(self) -> int:
        tables = self.con.table_names()
        if not tables:
            return 0
        if "meta" not in tables:
            raise StoreError(f"{self.path}: a PostgreSQL schema, but not Orchard's (no meta table)")
        meta = dict(self.con.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP_ID:
            raise StoreError(f"{self.path}: a PostgreSQL schema, but not Orchard's (app={meta.get('app')!r})")
        version = int(meta.get("schema_version", "0"))
        if version > schema.SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version} is newer than this Orchard "
                             f"({schema.SCHEMA_VERSION}); upgrade")
        return version

    def table_names(self) -> set[str]:
        if self.dialect == "postgresql":
            return self.con.table_names()
        return {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _check_tables(self) -> None:
        """A database at the current version that lacks one of its tables was damaged by hand:
        say so once, here, instead of failing in whichever query meets the gap first."""
        have = self.table_names()
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
    def transaction(self) -> Iterator[Any]:
        """One write transaction. Nested inside another (a command that saves pairs and samples
        together), it is a savepoint of the outer one, so everything commits or nothing does.
        On PostgreSQL it holds the store's write lock, as `BEGIN IMMEDIATE` does on SQLite."""
        if self.dialect == "postgresql" and not self.con.in_transaction:
            self.con.begin()
            try:
                yield self.con
            except BaseException:
                self.con.rollback()
                raise
            self.con.commit()
            return
        if self.con.in_transaction:
            self.con.execute("SAVEPOINT nested")
            try:
                yield self.con
            except BaseException:
                if self.con.in_transaction:  # a lost server connection took the whole transaction with it
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

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that all see one committed state (a copy of a store that is being written to)."""
        if self.dialect == "postgresql":
            self.con.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        else:
            self.con.execute("BEGIN")
        try:
            yield
        finally:
            if getattr(self.con, "broken", False):
                self.con.rollback()
            else:
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
                            for part in self._dialect_ddl(statement):
                                con.execute(part)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),))

    def _dialect_ddl(self, statement: str) -> list[str]:
        return postgres.translate_ddl(statement) if self.dialect == "postgresql" else [statement]

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
