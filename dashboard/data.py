"""Reads for the dashboard, through the engine's Store API only (reached through dashboard/store.py),
cached per database version.

Why the version token: a search may be writing to the same database while people look at it. The
token changes with every committed simulation (SQLite in WAL mode writes the -wal file first), so
cached reads are reused between reruns and refreshed as soon as something new is committed.

The dashboard never creates a database: a missing or empty file is reported, not opened.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec

import streamlit as st

from dashboard.store import (
    HistoryEntry,
    MissingStoreError,
    RunInfo,
    Store,
    StoreError,
    TreeSummary,
    data_version,
    redact,
    scrub,
)
from engine import paths
from engine.actions import CompositeAction
from engine.datasets.pairs import Pair
from engine.datasets.samples import Sample
from engine.tree_columns import TreeColumns
from engine.tree_nodes import Node, SearchTree

DB_ENV = paths.DB_ENV
NO_RUNS = "No runs yet — run `make run` to search the demo tasks, then reload this page."


P = ParamSpec("P")


def show_store_error(error: StoreError) -> None:
    """A row the store cannot read (edited outside Orchard, written by another version): one line, as text."""
    st.error("The database holds something this page cannot read.")
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    st.code(redact(scrub(line, db_path())), language=None, wrap_lines=True)


def store_errors_shown(fn: Callable[P, None]) -> Callable[P, None]:
    """`fn`, showing a StoreError with `show_store_error` instead of a traceback: for page bodies and for
    fragments, whose exceptions Streamlit shows itself before the app's own catch could see them."""
    @functools.wraps(fn)
    def shown(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except StoreError as e:
            show_store_error(e)
    return shown


def db_path() -> Path | str:
    """`$ORCHARD_DB` when set, else the engine's default database (engine.paths, as the CLI);
    a `postgresql://` URL stays a string."""
    return paths.db_path()


def shown_db(path: Path | str) -> str:
    """The database as a page shows it: every password masked (engine.store.credentials), also for
    an anonymous visitor on a dashboard that listens beyond loopback."""
    return redact(path)


Version = tuple[int | str, ...]  # what db_version returns: the cache key of every read


def has_data(path: Path | str) -> bool:
    """Is there a store to read at `path` (a server URL always; a file only when not empty)?"""
    if paths.is_db_url(path):
        return True
    file = Path(path)
    return file.exists() and file.stat().st_size > 0


def db_version(path: Path | str) -> Version:
    """Changes whenever a transaction is committed to `path` (main file or its write-ahead log).
    An empty WAL counts as none: a read-only reader may create one without changing anything.
    On a PostgreSQL server: its write-ahead-log position (engine.store.data_version)."""
    if paths.is_db_url(path):
        return data_version(str(path))
    out: list[int | str] = []
    file = Path(path)
    for p in (file, file.with_name(file.name + "-wal")):
        try:
            st_ = p.stat()
            out += [st_.st_mtime_ns, st_.st_size] if st_.st_size else [0, 0]
        except FileNotFoundError:
            out += [0, 0]
    return tuple(out)


def db_problem(path: Path | str, need_runs: bool = True) -> tuple[str, str] | None:
    """("empty", message) when there is nothing to show, ("error", one line) when the file is
    unusable, None when the page can show it. Pages of data that need no search run (imported
    refinement data, jobs, evaluations) pass `need_runs=False`."""
    if not has_data(path):
        return "empty", NO_RUNS
    try:
        runs = list_runs(str(path), db_version(path))
    except MissingStoreError:
        return "empty", NO_RUNS
    except StoreError as e:
        return "error", redact(scrub(str(e).splitlines()[0], path))
    if not runs and need_runs:
        return "empty", NO_RUNS
    return None


@st.cache_data(show_spinner=False, max_entries=16)
def list_runs(path: str, version: Version) -> list[RunInfo]:
    """All runs, oldest first (`version` is only the cache key)."""
    with Store(path, readonly=True) as store:
        return store.runs()


@st.cache_data(show_spinner=False, max_entries=64)
def tree_index(path: str, run_id: str, version: Version) -> list[tuple[int, str]]:
    """(tree id, task id) of a run, in run order."""
    with Store(path, readonly=True) as store:
        return store.tree_ids(run_id)


@st.cache_data(show_spinner=False, max_entries=32)
def tree_summaries(path: str, run_id: str, version: Version) -> list[TreeSummary]:
    """Every tree of a run with its goal, solved flag and counts, in run order (`Store.tree_summaries`)."""
    with Store(path, readonly=True) as store:
        return store.tree_summaries(run_id)


@st.cache_data(show_spinner=False, max_entries=4)
def tree_export(path: str, run_id: str, tree_id: int, fmt: str, version: Version) -> bytes | None:
    """The tree as `orchard export tree` writes it (`fmt` "json" or "graphml"; engine.search.export),
    None while it has no node."""
    from engine.search.export import tree_graphml, tree_json

    with Store(path, readonly=True) as store:
        tree, info = store.load_tree(tree_id), store.run(run_id)
    if tree is None:
        return None
    return tree_json(tree, info).encode("utf-8") if fmt == "json" else tree_graphml(tree, info)


def read_tree(path: str, tree_id: int) -> SearchTree | None:
    """Uncached read (the benchmark times this)."""
    with Store(path, readonly=True) as store:
        return store.load_tree(tree_id)


# cache_resource, not cache_data: a 100k-node tree is never mutated here, and unpickling a copy on
# every rerun (what cache_data does) would cost more than the layout.
@st.cache_resource(show_spinner=False, max_entries=6)
def load_tree(path: str, tree_id: int, version: Version) -> SearchTree | None:
    """The committed tree (None until its root is written); shared, treat as read-only."""
    return read_tree(path, tree_id)


def read_shape(path: str, tree_id: int, since: TreeColumns | None = None) -> TreeColumns | None:
    """The tree's shape without texts (None until its root is written). With `since` (an older
    shape of the same tree), only the nodes added after it are read, plus every node's visits;
    a tree that does not continue `since` (another task's, or a commit between the two reads) is
    read whole."""
    with Store(path, readonly=True) as store:
        if since is not None and len(since):
            new = store.tree_skeleton(tree_id, after=len(since) - 1)
            visits = store.tree_visits(tree_id)
            if new.task_id == since.task_id and len(visits[0]) == len(since) + len(new):
                return since.extended(new, visits)
        sk = store.tree_skeleton(tree_id)
    return TreeColumns.from_rows(sk) if len(sk) else None


_LAST_SHAPE: dict[tuple[str, int], TreeColumns] = {}  # newest shape read per tree: the base of the next
_SHAPE_LOCK = threading.Lock()


@st.cache_resource(show_spinner=False, max_entries=8)
def load_shape(path: str, tree_id: int, version: Version) -> TreeColumns | None:
    """The committed tree's shape at `version`, shared (never changed). While a search commits, each
    new version reads only what was added since the newest shape read before (`read_shape`)."""
    with _SHAPE_LOCK:
        last = _LAST_SHAPE.get((path, tree_id))
    shape = read_shape(path, tree_id, since=last)
    if shape is not None:
        with _SHAPE_LOCK:
            held = _LAST_SHAPE.get((path, tree_id))
            if held is None or len(held) <= len(shape):
                _LAST_SHAPE[(path, tree_id)] = shape
            if len(_LAST_SHAPE) > 8:
                _LAST_SHAPE.pop(next(iter(_LAST_SHAPE)))
    return shape


def read_nodes(path: str, tree_id: int, ids: Iterable[int]) -> dict[int, Node]:
    """Full nodes `ids` by id, uncached (the figure's hover labels, cached with the figure)."""
    with Store(path, readonly=True) as store:
        return store.load_nodes(tree_id, ids)


@st.cache_data(show_spinner=False, max_entries=64)
def load_nodes(path: str, tree_id: int, ids: tuple[int, ...], version: Version) -> dict[int, Node]:
    """Full nodes `ids` (texts included), by id: the drawn nodes' labels, the inspected node and
    its neighbours."""
    with Store(path, readonly=True) as store:
        return store.load_nodes(tree_id, ids)


def read_node_texts(path: str, tree_id: int) -> list[tuple[int, CompositeAction | None, str | None]]:
    """(node id, action, raw completion) of every node: what a text search over the tree reads."""
    with Store(path, readonly=True) as store:
        return store.node_texts(tree_id)


@st.cache_data(show_spinner=False, max_entries=32)
def human_nodes(path: str, tree_id: int, version: Version) -> frozenset[int]:
    """The tree's human-authored nodes (added from the Tree explorer or `orchard tree add-action`)."""
    with Store(path, readonly=True) as store:
        return frozenset(store.human_nodes(tree_id))


@st.cache_data(show_spinner=False, max_entries=32)
def node_screenshot(path: str, tree_id: int, node_id: int, version: Version) -> bytes | None:
    """The JPEG stored with a terminal node (web env), None when there is none or it is not a JPEG."""
    with Store(path, readonly=True) as store:
        data = store.node_screenshot(tree_id, node_id)
    return data if data and data.startswith(b"\xff\xd8\xff") else None


@st.cache_data(show_spinner=False, max_entries=64)
def resolve_run(path: str, key: str, version: Version) -> str | None:
    """The run id for `key` (id, unique id prefix or name), None when unknown or ambiguous."""
    with Store(path, readonly=True) as store:
        try:
            return store.find_run(key)
        except StoreError:
            return None


# --- datasets (curation pages) ---------------------------------------------------------------------------
# Lists are cached per database version (and cleared after this dashboard's own writes, so a save shows
# at once even within the file system's timestamp granularity). The row being curated and its history
# are read uncached: the version a person acts on must be the one in the database.

Filters = tuple[tuple[str, object], ...]  # store filter keywords, hashable for the cache


def filters(**values: object) -> Filters:
    """Store filters without the unset (None / empty) ones, in a stable order."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items()
                        if v is not None and v != [] and v != ()))


def as_kwargs(f: Filters) -> dict[str, object]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in f}


@st.cache_data(show_spinner=False, max_entries=64)
def pair_page(
    path: str, f: Filters, order: str, limit: int, offset: int, version: Version
) -> list[Pair]:
    """One page of the pairs matching `f`, in `order` ("tree", "gap" or "updated")."""
    with Store(path, readonly=True) as store:
        return store.pairs(limit=limit, offset=offset, order=order, **as_kwargs(f))


@st.cache_data(show_spinner=False, max_entries=64)
def pair_counts(path: str, f: Filters, version: Version) -> dict[str, int]:
    """Pairs matching `f` per curation status, plus "total"."""
    with Store(path, readonly=True) as store:
        return store.pair_counts(**as_kwargs(f))


@st.cache_data(show_spinner=False, max_entries=64)
def sample_page(path: str, f: Filters, limit: int, offset: int, version: Version) -> list[Sample]:
    """One page of the samples matching `f` (kind, run, task, status)."""
    with Store(path, readonly=True) as store:
        return store.samples(limit=limit, offset=offset, **as_kwargs(f))


@st.cache_data(show_spinner=False, max_entries=64)
def sample_counts(path: str, f: Filters, version: Version) -> dict[str, int]:
    with Store(path, readonly=True) as store:
        return store.sample_counts(**as_kwargs(f))


@st.cache_data(show_spinner=False, max_entries=8)
def export_rows(path: str, what: str, f: Filters, version: Version) -> tuple[int, bytes]:
    """(rows, JSONL bytes) of what `orchard export pairs|sft` writes for the items matching `f`: TRL DPO
    rows of the pairs (`what` "pairs"), SFT rows of the samples ("sft"); engine.datasets.formats."""
    from engine.datasets import formats

    kwargs: dict[str, Any] = as_kwargs(f)
    with Store(path, readonly=True) as store:
        if what == "pairs":
            rows = formats.dpo_rows(store.pairs(**kwargs))
        else:
            rows = formats.sft_rows(store.samples(**kwargs))
    return len(rows), formats.jsonl_bytes(rows)


def clear_dataset_caches() -> None:
    """After a curation write by this dashboard."""
    for fn in (pair_page, pair_counts, sample_page, sample_counts):
        fn.clear()


def read_pair(path: str, pair_id: str) -> tuple[Pair, list[HistoryEntry]] | None:
    """The pair as stored now, with its audit history (None: no such pair)."""
    with Store(path, readonly=True) as store:
        try:
            return store.pair(pair_id), store.pair_history(pair_id)
        except StoreError:
            return None


def read_sample(path: str, sample_id: str) -> tuple[Sample, list[HistoryEntry]] | None:
    """The sample as stored now, with its audit history (None: no such sample)."""
    with Store(path, readonly=True) as store:
        try:
            return store.sample(sample_id), store.sample_history(sample_id)
        except StoreError:
            return None
