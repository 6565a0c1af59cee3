"""Reads for the dashboard, through the engine's Store API only, cached per database version.

Why the version token: a search may be writing to the same database while people look at it. The
token changes with every committed simulation (SQLite in WAL mode writes the -wal file first), so
cached reads are reused between reruns and refreshed as soon as something new is committed.

The dashboard never creates a database: a missing or empty file is reported, not opened.
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from engine.search.tree import SearchTree
from engine.store import RunInfo, Store, StoreError, default_db_path

DB_ENV = "ORCHARD_DB"
NO_RUNS = "No runs yet — run `make run` to search the demo tasks, then reload this page."


def db_path() -> Path:
    """`$ORCHARD_DB` when set, else the engine's default database."""
    value = os.environ.get(DB_ENV)
    return Path(value).expanduser() if value else default_db_path()


def db_version(path: Path) -> tuple[int, ...]:
    """Changes whenever a transaction is committed to `path` (main file or its write-ahead log).
    An empty WAL counts as none: a read-only reader may create one without changing anything."""
    out: list[int] = []
    for p in (path, path.with_name(path.name + "-wal")):
        try:
            st_ = p.stat()
            out += [st_.st_mtime_ns, st_.st_size] if st_.st_size else [0, 0]
        except FileNotFoundError:
            out += [0, 0]
    return tuple(out)


def db_problem(path: Path) -> tuple[str, str] | None:
    """("empty", message) when there is nothing to show, ("error", one line) when the file is
    unusable, None when there are runs to show."""
    if not path.exists() or path.stat().st_size == 0:
        return "empty", NO_RUNS
    try:
        runs = list_runs(str(path), db_version(path))
    except StoreError as e:
        return "error", str(e).splitlines()[0]
    if not runs:
        return "empty", NO_RUNS
    return None


@st.cache_data(show_spinner=False, max_entries=16)
def list_runs(path: str, version: tuple[int, ...]) -> list[RunInfo]:
    """All runs, oldest first (`version` is only the cache key)."""
    with Store(path, readonly=True) as store:
        return store.runs()


@st.cache_data(show_spinner=False, max_entries=64)
def tree_index(path: str, run_id: str, version: tuple[int, ...]) -> list[tuple[int, str]]:
    """(tree id, task id) of a run, in run order."""
    with Store(path, readonly=True) as store:
        return store.tree_ids(run_id)


def read_tree(path: str, tree_id: int) -> SearchTree | None:
    """Uncached read (the benchmark times this)."""
    with Store(path, readonly=True) as store:
        return store.load_tree(tree_id)


# cache_resource, not cache_data: a 100k-node tree is never mutated here, and unpickling a copy on
# every rerun (what cache_data does) would cost more than the layout.
@st.cache_resource(show_spinner=False, max_entries=6)
def load_tree(path: str, tree_id: int, version: tuple[int, ...]) -> SearchTree | None:
    """The committed tree (None until its root is written); shared, treat as read-only."""
    return read_tree(path, tree_id)


@st.cache_data(show_spinner=False, max_entries=64)
def resolve_run(path: str, key: str, version: tuple[int, ...]) -> str | None:
    """The run id for `key` (id, unique id prefix or name), None when unknown or ambiguous."""
    with Store(path, readonly=True) as store:
        try:
            return store.find_run(key)
        except StoreError:
            return None
