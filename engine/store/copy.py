"""`orchard db copy SRC DST`: move a whole store between SQLite and PostgreSQL (either direction).

The destination must be empty (no rows in any table: it is created and migrated if new); the
source is read in one consistent snapshot, the destination written in ONE transaction, and the row
count of every table is compared before that transaction commits: a copy is complete or absent.
Tables are copied in migration order (a table's references point to earlier tables). Only the
columns of this Orchard's own schema are named, quoted, in the SQL (never a name read from the
source: a crafted source file's column name would be SQL run on the destination); a source table
with a column the schema lacks, or lacking one it has, is refused before anything is written (the
source is at the current schema version, so a real store always matches)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from engine.store import postgres, schema
from engine.store.connection import Connection
from engine.store.records import StoreError

CHUNK = 1000


def copy_order() -> list[str]:
    """Every table of the current schema, in the order the migrations create them."""
    names = re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", "".join(sql for _, sql in schema.MIGRATIONS))
    return [n for n in dict.fromkeys(names) if n in schema._schema_tables()]


def known_columns() -> dict[str, list[str]]:
    """{table: its columns} as the migrations create them (applied to an in-memory SQLite)."""
    con = sqlite3.connect(":memory:")
    try:
        for _, sql in schema.MIGRATIONS:
            con.executescript(sql)
        return {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")] for t in copy_order()}
    finally:
        con.close()


def _check_columns(source: Connection, table: str, known: list[str]) -> None:
    have = [d[0] for d in source.con.execute(f"SELECT * FROM {table} LIMIT 0").description]
    extra = [c for c in have if c not in known]
    missing = [c for c in known if c not in have]
    if extra or missing:
        what = f"has column {extra[0][:80]!r} that" if extra else f"lacks column {missing[0]!r} that"
        raise StoreError(f"{source.path}: table {table} {what} Orchard's schema "
                         f"{'does not have' if extra else 'has'}: not an Orchard store; nothing copied")


def copy_store(src: str | Path, dst: str | Path) -> dict[str, int]:
    """Copy every row of `src` into the empty store `dst`; returns {table: rows copied}."""
    if str(src) == str(dst):
        raise StoreError(f"{src}: source and destination are the same store")
    dst_file = None if postgres.is_url(dst) else Path(dst)
    created = dst_file is not None and not dst_file.exists()
    try:
        with Connection(src, readonly=True) as source, Connection(dst) as target:
            return _copy(source, target)
    except BaseException:
        if created and dst_file is not None:  # a new file that got no data: leave no empty store behind
            for suffix in ("", "-wal", "-shm"):
                dst_file.with_name(dst_file.name + suffix).unlink(missing_ok=True)
        raise


def _copy(source: Connection, target: Connection) -> dict[str, int]:
    tables = copy_order()
    full = [t for t in tables if target.con.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()]
    if full:
        raise StoreError(f"{target.path}: destination is not empty (rows in {', '.join(full)}); "
                         "copy into a new file or an empty database")
    counts: dict[str, int] = {}
    known = known_columns()
    with source.snapshot(), target.transaction() as out:
        for table in tables:
            _check_columns(source, table, known[table])
        for table in tables:
            counts[table] = int(source.con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            columns = ", ".join(f'"{c}"' for c in known[table])  # our names: \w+, from schema.MIGRATIONS
            cur = source.con.execute(f"SELECT {columns} FROM {table}")
            insert = f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(known[table]))})"
            while rows := cur.fetchmany(CHUNK):
                out.executemany(insert, rows)
        if target.dialect == "postgresql":
            postgres.reset_identities(target.con)
        for table in tables:
            have = int(out.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            if have != counts[table]:
                raise StoreError(f"{target.path}: table {table} has {have} rows after the copy, the source "
                                 f"{counts[table]}: nothing was copied")
    # Planner statistics for the new rows now: without them PostgreSQL plans the runs list's per-run node
    # counts as nested scans (10.4 s for 500 runs, 0.09 s after ANALYZE; docs/experiments.md, store reads),
    # and autovacuum gathers them only later. SQLite's planner needs none for these reads.
    if target.dialect == "postgresql":
        target.con.execute("ANALYZE")
    return counts
