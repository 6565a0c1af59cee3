"""Optimistic concurrency for curated rows (pairs, samples): every row has a version; a write names
the version it was based on, is refused with ConflictError when the row has moved on since, and
bumps the version and appends a history entry in the same transaction."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from engine.store import columns
from engine.store.records import HistoryEntry, StoreError

_COLUMNS = {"pairs": columns.PAIRS, "samples": columns.SAMPLES}  # the curated tables' one column lists


class ConflictError(StoreError):
    """A curation write based on a version that someone else has since changed."""


def _current(con: sqlite3.Connection, table: str, noun: str, row_id: str, expected_version: int) -> dict[str, Any]:
    """The row as a dict, if it is still at `expected_version` (inside the writer's transaction)."""
    names = _COLUMNS[table]
    row = con.execute(f"SELECT {columns.select(names)} FROM {table} WHERE id=?", (row_id,)).fetchone()
    if row is None:
        raise StoreError(f"no {noun} {row_id!r}")
    old = columns.named(names, row)
    if old["version"] != expected_version:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(old["updated_at"]))
        raise ConflictError(f"{noun} {row_id} was changed by {old['updated_by']} at {at}; reload "
                            f"(you had version {expected_version}, it is now {old['version']})")
    return old


def _write(con: sqlite3.Connection, table: str, history: str, key: str, row_id: str, old: dict[str, Any], who: str,
           action: str, before: Any, after: Any, changes: dict[str, Any]) -> None:
    version, now = old["version"] + 1, time.time()
    sets = ", ".join(f"{c}=?" for c in changes)
    con.execute(f"UPDATE {table} SET {sets}, version=?, updated_at=?, updated_by=? WHERE id=?",
                (*changes.values(), version, now, who, row_id))
    con.execute(f"INSERT INTO {history} ({key}, version, at, who, action, before, after) VALUES (?,?,?,?,?,?,?)",
                (row_id, version, now, who, action, json.dumps(before), json.dumps(after)))


def _history(con: sqlite3.Connection, table: str, key: str, row_id: str) -> list[HistoryEntry]:
    rows = con.execute(f"SELECT version, at, who, action, before, after FROM {table} WHERE {key}=? ORDER BY version",
                       (row_id,))
    return [HistoryEntry(v, at, who, action, json.loads(b) if b else None, json.loads(a) if a else None)
            for v, at, who, action, b, a in rows]
