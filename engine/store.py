"""Persistence: the one module that knows SQL (SQLite in WAL mode).

Runs, trees and nodes (observations deduplicated by content hash). Each finished simulation is
committed in ONE transaction (its new nodes, the visit counts and values along its path, the
simulation row), so a killed process loses at most the simulation in progress and resumes from a
consistent tree. The schema is versioned; migrations run in order on open. A file that is not an
Orchard database is refused before anything is written to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from engine import paths
from engine.actions import CompositeAction, FormatError, parse
from engine.datasets.pairs import PAIR_KINDS, Pair
from engine.datasets.samples import Sample
from engine.envs.base import TaskSpec
from engine.search.tree import Node, SearchTree, Simulation

APP_ID = "orchard"
SQLITE_MAGIC = b"SQLite format 3\x00"

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            env TEXT NOT NULL,
            model TEXT NOT NULL,
            config TEXT NOT NULL,
            task_ids TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            stats TEXT
        );
        CREATE TABLE trees (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(id),
            position INTEGER NOT NULL,
            task_id TEXT NOT NULL,
            goal TEXT NOT NULL,
            context TEXT NOT NULL,
            split TEXT NOT NULL,
            simulations INTEGER NOT NULL DEFAULT 0,
            solved INTEGER NOT NULL DEFAULT 0,
            UNIQUE (run_id, task_id)
        );
        CREATE TABLE observations (
            hash TEXT PRIMARY KEY,
            text TEXT NOT NULL
        );
        CREATE TABLE nodes (
            tree_id INTEGER NOT NULL REFERENCES trees(id),
            node_id INTEGER NOT NULL,
            parent_id INTEGER,
            depth INTEGER NOT NULL,
            action TEXT,
            raw TEXT,
            format_error TEXT,
            obs_hash TEXT NOT NULL REFERENCES observations(hash),
            n INTEGER NOT NULL,
            value_sum REAL NOT NULL,
            q_critic REAL,
            critic_rank INTEGER,
            critic_reason TEXT,
            logprob REAL,
            reward REAL,
            progress REAL,
            terminal TEXT,
            gen_ms REAL,
            env_ms REAL,
            n_tokens INTEGER,
            PRIMARY KEY (tree_id, node_id)
        );
        CREATE TABLE simulations (
            tree_id INTEGER NOT NULL REFERENCES trees(id),
            idx INTEGER NOT NULL,
            path TEXT NOT NULL,
            reward REAL NOT NULL,
            rollout TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (tree_id, idx)
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE pairs (
            id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(id),
            tree_id INTEGER REFERENCES trees(id),
            task_id TEXT NOT NULL,
            node_id INTEGER NOT NULL,
            chosen_node INTEGER NOT NULL,
            rejected_node INTEGER NOT NULL,
            kind TEXT NOT NULL,
            prompt TEXT NOT NULL,
            chosen TEXT NOT NULL,
            rejected TEXT NOT NULL,
            q_chosen REAL NOT NULL,
            q_rejected REAL NOT NULL,
            logprob_chosen REAL,
            logprob_rejected REAL,
            depth INTEGER NOT NULL,
            status TEXT NOT NULL,
            version INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            updated_by TEXT NOT NULL
        );
        CREATE INDEX pairs_by_run ON pairs (run_id, kind, status);
        CREATE INDEX pairs_by_task ON pairs (run_id, task_id, depth);
        CREATE TABLE pair_history (
            pair_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            at REAL NOT NULL,
            who TEXT NOT NULL,
            action TEXT NOT NULL,
            before TEXT,
            after TEXT,
            PRIMARY KEY (pair_id, version)
        );
        CREATE TABLE samples (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            run_id TEXT REFERENCES runs(id),
            task_id TEXT NOT NULL,
            source TEXT NOT NULL,
            data TEXT NOT NULL,
            status TEXT NOT NULL,
            version INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            updated_by TEXT NOT NULL
        );
        CREATE INDEX samples_by_kind ON samples (kind, status);
        CREATE INDEX samples_by_run ON samples (run_id, kind);
        CREATE TABLE sample_history (
            sample_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            at REAL NOT NULL,
            who TEXT NOT NULL,
            action TEXT NOT NULL,
            before TEXT,
            after TEXT,
            PRIMARY KEY (sample_id, version)
        );
        """,
    ),
    (
        3,
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            config TEXT NOT NULL,
            state TEXT NOT NULL,
            device TEXT NOT NULL,
            pid INTEGER,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            heartbeat_at REAL,
            progress TEXT NOT NULL,
            log_path TEXT,
            output_path TEXT,
            error TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX jobs_by_state ON jobs (state, device, created_at);
        CREATE TABLE job_metrics (
            job_id TEXT NOT NULL REFERENCES jobs(id),
            seq INTEGER NOT NULL,
            step INTEGER,
            at REAL NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (job_id, seq)
        );
        CREATE TABLE models (
            path TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            parent TEXT,
            job_id TEXT,
            data_ids TEXT NOT NULL,
            config TEXT NOT NULL,
            metrics TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE TABLE evaluations (
            id TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            env TEXT NOT NULL,
            split TEXT NOT NULL,
            task_ids TEXT NOT NULL,
            mode TEXT NOT NULL,
            config TEXT NOT NULL,
            metrics TEXT NOT NULL,
            episodes TEXT NOT NULL,
            job_id TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX evaluations_by_model ON evaluations (model, created_at);
        CREATE TABLE iterations (
            loop_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            method TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (loop_id, idx)
        );
        """,
    ),
    (
        4,
        """
        CREATE TABLE node_media (
            tree_id INTEGER NOT NULL REFERENCES trees(id),
            node_id INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (tree_id, node_id, kind)
        );
        """,
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
JPEG_MAGIC = b"\xff\xd8\xff"


class StoreError(RuntimeError):
    """The database cannot be used (not Orchard's, corrupt, too new, unknown run)."""


@dataclass(frozen=True)
class RunInfo:
    id: str
    name: str
    env: str
    model: str
    config: dict[str, Any]
    task_ids: list[str]
    status: str
    created_at: float
    updated_at: float
    stats: dict[str, Any]
    trees: int = 0
    simulations: int = 0
    nodes: int = 0
    solved: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def default_db_path() -> Path:
    """$ORCHARD_DB, else `$ORCHARD_HOME/orchard.db`, else `data/orchard.db` (engine.paths)."""
    return paths.db_path()


def _check_file(path: Path) -> int:
    """Refuse a file that is not SQLite, or SQLite that is not ours, without writing to it.
    Returns the file's schema version (0 for a new or empty file)."""
    if path.is_dir():
        raise StoreError(f"{path}: a folder, not a database file")
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise StoreError(f"{path}: not an Orchard database (not a SQLite file)")
    # Even a read-only look at a WAL-mode file creates its -wal / -shm companions: a file that is
    # refused gets them removed again, so a refusal leaves the folder as it was.
    companions = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    existed = [c.exists() for c in companions]
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                return 0
            if "meta" not in tables:
                raise StoreError(f"{path}: a SQLite database, but not Orchard's (no meta table)")
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        finally:
            con.close()
        if meta.get("app") != APP_ID:
            raise StoreError(f"{path}: a SQLite database, but not Orchard's (app={meta.get('app')!r})")
        version = int(meta.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {version} is newer than this Orchard ({SCHEMA_VERSION}); "
                             "upgrade")
    except (sqlite3.DatabaseError, StoreError, ValueError) as e:
        for companion, was_there in zip(companions, existed, strict=True):
            if not was_there:
                companion.unlink(missing_ok=True)
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"{path}: corrupt or unreadable database ({e})") from None
    return version


def _simulation(path: list[int], reward: float, rollout: Any) -> Simulation:
    """A stored simulation: `rollout` is its commands (a list), or, for a rollout that succeeded,
    {"commands": [...], "turns": [[model text, observation], ...]} (same column, no migration)."""
    if isinstance(rollout, dict):
        turns = tuple((str(t[0]), str(t[1])) for t in rollout.get("turns", ()))
        return Simulation(tuple(path), reward, tuple(rollout.get("commands", ())), turns)
    return Simulation(tuple(path), reward, tuple(rollout))


def _schema_tables() -> set[str]:
    """The tables the migrations create (read from MIGRATIONS when called, as tests shorten it)."""
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", "".join(sql for _, sql in MIGRATIONS)))


def _obs_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


class Store:
    """A connection to one Orchard database. Not shared across threads; one writer process.

    `readonly=True` (the dashboard's reads) never writes, locks or migrates: it needs an existing
    database at the current schema version and reads beside a running search (WAL)."""

    def __init__(self, path: str | Path | None = None, readonly: bool = False, must_exist: bool = False) -> None:
        # Absolute, so job workers (started in the repository root) and stored log paths find it.
        self.path = Path(os.path.abspath(path if path is not None else default_db_path()))
        version = _check_file(self.path)
        # must_exist: a command about rows that must be there already creates no file.
        if (readonly or must_exist) and not self.path.exists():
            raise StoreError(f"{self.path}: no such database (a search or `orchard demo` creates it)")
        if readonly:
            if version != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} (this Orchard reads {SCHEMA_VERSION}); "
                    "run any `orchard` command once to migrate it"
                )
            try:
                self.con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
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
            for version, sql in MIGRATIONS:
                if version > current:
                    for statement in sql.split(";"):
                        if statement.strip():
                            con.execute(statement)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),))

    @property
    def schema_version(self) -> int:
        return int(self.con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    # --- runs --------------------------------------------------------------------------------

    def create_run(
        self, name: str, env: str, model: str, config: dict[str, Any], tasks: list[TaskSpec]
    ) -> str:
        run_id = uuid.uuid4().hex[:10]
        now = time.time()
        with self.transaction() as con:
            con.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, name, env, model, json.dumps(config), json.dumps([t.id for t in tasks]), "running", now, now, None),
            )
            con.executemany(
                "INSERT INTO trees (run_id, position, task_id, goal, context, split) VALUES (?,?,?,?,?,?)",
                [(run_id, i, t.id, t.goal, t.context, t.split) for i, t in enumerate(tasks)],
            )
        return run_id

    def set_run_status(self, run_id: str, status: str, stats: dict[str, Any] | None = None) -> None:
        with self.transaction() as con:
            if stats is None:
                con.execute("UPDATE runs SET status=?, updated_at=? WHERE id=?", (status, time.time(), run_id))
            else:
                con.execute(
                    "UPDATE runs SET status=?, updated_at=?, stats=? WHERE id=?",
                    (status, time.time(), json.dumps(stats), run_id),
                )

    def find_run(self, key: str) -> str:
        """A run id from an id, a unique id prefix or a unique name."""
        rows = self.con.execute(
            "SELECT id FROM runs WHERE id=? OR name=? OR id LIKE ? ORDER BY created_at", (key, key, f"{key}%")
        ).fetchall()
        ids = list(dict.fromkeys(r[0] for r in rows))
        if key in ids:
            return key
        if not ids:
            raise StoreError(f"no run {key!r} in {self.path}")
        if len(ids) > 1:
            raise StoreError(f"run {key!r} is ambiguous in {self.path}: {', '.join(ids)}")
        return ids[0]

    def runs(self) -> list[RunInfo]:
        rows = self.con.execute(
            """SELECT r.id, r.name, r.env, r.model, r.config, r.task_ids, r.status, r.created_at, r.updated_at,
                      r.stats, COUNT(t.id), COALESCE(SUM(t.simulations), 0), COALESCE(SUM(t.solved), 0),
                      (SELECT COUNT(*) FROM nodes n JOIN trees t2 ON n.tree_id = t2.id WHERE t2.run_id = r.id)
               FROM runs r LEFT JOIN trees t ON t.run_id = r.id GROUP BY r.id ORDER BY r.created_at"""
        ).fetchall()
        return [
            RunInfo(
                id=r[0], name=r[1], env=r[2], model=r[3], config=json.loads(r[4]), task_ids=json.loads(r[5]),
                status=r[6], created_at=r[7], updated_at=r[8], stats=json.loads(r[9]) if r[9] else {},
                trees=r[10], simulations=r[11], solved=r[12], nodes=r[13],
            )
            for r in rows
        ]

    def run(self, run_id: str) -> RunInfo:
        for info in self.runs():
            if info.id == run_id:
                return info
        raise StoreError(f"no run {run_id!r} in {self.path}")

    # --- trees -------------------------------------------------------------------------------

    def tree_ids(self, run_id: str) -> list[tuple[int, str]]:
        """(tree id, task id) in run order."""
        return [
            (r[0], r[1])
            for r in self.con.execute("SELECT id, task_id FROM trees WHERE run_id=? ORDER BY position", (run_id,))
        ]

    def tree_id(self, run_id: str, task_id: str) -> int:
        row = self.con.execute("SELECT id FROM trees WHERE run_id=? AND task_id=?", (run_id, task_id)).fetchone()
        if row is None:
            known = ", ".join(t for _, t in self.tree_ids(run_id)[:10])
            raise StoreError(f"run {run_id} has no task {task_id!r} (tasks: {known}...)")
        return row[0]

    def save_simulation(self, tree_id: int, tree: SearchTree, sim: Simulation, first_new: int) -> None:
        """One transaction: nodes created since `first_new`, the values along the path, the row."""
        new = tree.nodes[first_new:]
        touched = {0, *sim.path} - {n.id for n in new}
        with self.transaction() as con:
            con.executemany(
                "INSERT OR IGNORE INTO observations VALUES (?, ?)",
                [(_obs_hash(n.observation), n.observation) for n in new],
            )
            con.executemany(
                "INSERT INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        tree_id, n.id, n.parent, n.depth,
                        json.dumps(n.action.to_dict()) if n.action else None,
                        n.raw, n.format_error, _obs_hash(n.observation), n.N, n.value_sum,
                        n.Q_critic, n.critic_rank, n.critic_reason, n.logprob, n.reward, n.progress,
                        n.terminal, n.gen_ms, n.env_ms, n.n_tokens,
                    )
                    for n in new
                ],
            )
            con.executemany(
                "UPDATE nodes SET n=?, value_sum=? WHERE tree_id=? AND node_id=?",
                [(tree.nodes[i].N, tree.nodes[i].value_sum, tree_id, i) for i in sorted(touched)],
            )
            con.execute(
                "INSERT INTO simulations VALUES (?,?,?,?,?,?)",
                (tree_id, len(tree.simulations) - 1, json.dumps(list(sim.path)), sim.reward,
                 json.dumps({"commands": list(sim.rollout), "turns": [list(t) for t in sim.turns]}
                            if sim.turns else list(sim.rollout)), time.time()),
            )
            con.execute(
                "UPDATE trees SET simulations=?, solved=? WHERE id=?",
                (len(tree.simulations), int(tree.solved()), tree_id),
            )
            con.executemany(  # terminal-page screenshots (web env): JPEG bytes only, kept out of `nodes`
                "INSERT OR REPLACE INTO node_media VALUES (?,?,'screenshot',?)",
                [(tree_id, n.id, n.screenshot) for n in new
                 if isinstance(n.screenshot, bytes) and n.screenshot.startswith(JPEG_MAGIC)],
            )

    def load_tree(self, tree_id: int) -> SearchTree | None:
        """The committed tree, or None when its root was never written."""
        t = self.con.execute("SELECT task_id, goal, context, split FROM trees WHERE id=?", (tree_id,)).fetchone()
        if t is None:
            raise StoreError(f"no tree {tree_id}")
        task = TaskSpec(id=t[0], goal=t[1], context=t[2], split=t[3])
        rows = self.con.execute(
            """SELECT n.node_id, n.parent_id, n.depth, n.action, n.raw, n.format_error, o.text, n.n, n.value_sum,
                      n.q_critic, n.critic_rank, n.critic_reason, n.logprob, n.reward, n.progress, n.terminal,
                      n.gen_ms, n.env_ms, n.n_tokens
               FROM nodes n JOIN observations o ON o.hash = n.obs_hash
               WHERE n.tree_id=? ORDER BY n.node_id""",
            (tree_id,),
        ).fetchall()
        if not rows:
            return None
        nodes = []
        for i, r in enumerate(rows):
            if r[0] != i:
                raise StoreError(f"tree {tree_id}: node ids not contiguous at {i} (found {r[0]})")
            nodes.append(
                Node(
                    id=r[0], parent=r[1], depth=r[2], observation=r[6],
                    action=CompositeAction.from_dict(json.loads(r[3])) if r[3] else None,
                    raw=r[4], format_error=r[5], N=r[7], value_sum=r[8], Q_critic=r[9], critic_rank=r[10],
                    critic_reason=r[11], logprob=r[12], reward=r[13], progress=r[14], terminal=r[15],
                    gen_ms=r[16] or 0.0, env_ms=r[17] or 0.0, n_tokens=r[18] or 0,
                )
            )
        for n in nodes:
            if n.parent is not None:
                nodes[n.parent].children.append(n.id)
        sims = [
            _simulation(json.loads(r[0]), r[1], json.loads(r[2]))
            for r in self.con.execute(
                "SELECT path, reward, rollout FROM simulations WHERE tree_id=? ORDER BY idx", (tree_id,)
            )
        ]
        return SearchTree(task=task, nodes=nodes, simulations=sims)

    def node_screenshot(self, tree_id: int, node_id: int) -> bytes | None:
        """The JPEG stored with a terminal node (None when it has none); not loaded with the tree."""
        row = self.con.execute(
            "SELECT data FROM node_media WHERE tree_id=? AND node_id=? AND kind='screenshot'", (tree_id, node_id)
        ).fetchone()
        return bytes(row[0]) if row else None

    # --- datasets ----------------------------------------------------------------------------
    # Preference pairs and SFT samples with curation (status, version, history). Rebuilding
    # upserts: new ids are created, untouched rows are refreshed, rows a person has curated are
    # kept exactly as they are, and untouched rows the new build no longer produces are pruned.
    # Every curation write names the version it was based on; a stale one is refused.

    def save_pairs(
        self, run_id: str, pairs: Sequence[Pair], kinds: Sequence[str] = PAIR_KINDS, who: str = "orchard"
    ) -> SaveReport:
        """Upsert a run's pairs of `kinds` in one transaction (see the section comment)."""
        prompts: dict[int, str] = {}

        def content(p: Pair) -> tuple:
            if id(p.prompt) not in prompts:
                prompts[id(p.prompt)] = json.dumps(p.prompt)
            return (p.tree_id, p.task_id, p.node_id, p.chosen_node, p.rejected_node, p.kind, prompts[id(p.prompt)],
                    p.chosen, p.rejected, p.q_chosen, p.q_rejected, p.logprob_chosen, p.logprob_rejected, p.depth)

        for p in pairs:
            if p.run_id != run_id or p.kind not in kinds:
                raise StoreError(f"pair {p.id} (run {p.run_id}, kind {p.kind}) does not belong to this save")
        with self.transaction() as con:
            marks = ",".join("?" * len(kinds))
            existing = {
                r[0]: r[1:]
                for r in con.execute(
                    f"""SELECT p.id, p.version, {_CURATED.format(table="pair_history", key="pair_id", row="p.id")},
                               p.tree_id, p.task_id, p.node_id, p.chosen_node, p.rejected_node, p.kind, p.prompt,
                               p.chosen, p.rejected, p.q_chosen, p.q_rejected, p.logprob_chosen, p.logprob_rejected,
                               p.depth
                        FROM pairs p WHERE p.run_id=? AND p.kind IN ({marks})""",
                    (run_id, *kinds),
                )
            }
            report, now = SaveReport(), time.time()
            inserts, updates, history = [], [], []
            for p in pairs:
                row = content(p)
                old = existing.pop(p.id, None)
                if old is None:
                    inserts.append((p.id, run_id, *row, "pending", 1, now, who))
                    history.append((p.id, 1, now, who, "create", None, json.dumps({"status": "pending"})))
                    report.created += 1
                elif old[1]:
                    report.kept += 1
                elif tuple(old[2:]) == row:
                    report.unchanged += 1
                else:
                    version = old[0] + 1
                    updates.append((*row, version, now, who, p.id))
                    history.append((p.id, version, now, who, "rebuild", None, None))
                    report.updated += 1
            con.executemany(
                """INSERT INTO pairs (id, run_id, tree_id, task_id, node_id, chosen_node, rejected_node, kind, prompt,
                   chosen, rejected, q_chosen, q_rejected, logprob_chosen, logprob_rejected, depth, status, version,
                   updated_at, updated_by) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                inserts,
            )
            con.executemany(
                """UPDATE pairs SET tree_id=?, task_id=?, node_id=?, chosen_node=?, rejected_node=?, kind=?, prompt=?,
                   chosen=?, rejected=?, q_chosen=?, q_rejected=?, logprob_chosen=?, logprob_rejected=?, depth=?,
                   version=?, updated_at=?, updated_by=? WHERE id=?""",
                updates,
            )
            con.executemany("INSERT INTO pair_history VALUES (?,?,?,?,?,?,?)", history)
            stale = [(pid,) for pid, old in existing.items() if not old[1]]
            report.stale_curated = len(existing) - len(stale)
            con.executemany("DELETE FROM pairs WHERE id=?", stale)
            con.executemany("DELETE FROM pair_history WHERE pair_id=?", stale)
            report.pruned = len(stale)
        return report

    def pairs(self, limit: int | None = None, offset: int = 0, order: str = "tree", **filters: Any) -> list[Pair]:
        """Pairs matching `filters` (see `_pair_where`), in `order`: "tree" (run, task, node),
        "gap" (largest Q gap first) or "updated" (most recently changed first)."""
        if order not in _PAIR_ORDERS:
            raise StoreError(f"unknown pair order {order!r} (expected one of {', '.join(_PAIR_ORDERS)})")
        where, args = _pair_where(filters)
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = self.con.execute(
            f"SELECT {_PAIR_COLUMNS} FROM pairs WHERE {where} ORDER BY {_PAIR_ORDERS[order]}{page}", args
        ).fetchall()
        return [_pair_from_row(r) for r in rows]

    def pair(self, pair_id: str) -> Pair:
        row = self.con.execute(f"SELECT {_PAIR_COLUMNS} FROM pairs WHERE id=?", (pair_id,)).fetchone()
        if row is None:
            raise StoreError(f"no pair {pair_id!r}")
        return _pair_from_row(row)

    def pair_counts(self, **filters: Any) -> dict[str, int]:
        """How many pairs match `filters`, per status, plus "total"."""
        where, args = _pair_where(filters)
        counts = dict.fromkeys(CURATION_STATUSES, 0)
        counts.update(self.con.execute(f"SELECT status, COUNT(*) FROM pairs WHERE {where} GROUP BY status", args))
        counts["total"] = sum(counts.values())
        return counts

    def pair_history(self, pair_id: str) -> list[HistoryEntry]:
        return _history(self.con, "pair_history", "pair_id", pair_id)

    def set_pair_status(self, pair_id: str, status: str, who: str, expected_version: int) -> Pair:
        """Approve, reject or reset (`pending`) one pair, if nobody changed it since `expected_version`."""
        action = _status_action(status)
        with self.transaction() as con:
            old = _current(con, "pairs", "pair", pair_id, expected_version)
            _write(con, "pairs", "pair_history", "pair_id", pair_id, old, who, action,
                   {"status": old["status"]}, {"status": status}, {"status": status})
        return self.pair(pair_id)

    def edit_pair(self, pair_id: str, chosen: str, rejected: str, who: str, expected_version: int) -> Pair:
        """Replace a step pair's texts; each changed text must parse as a composite action."""
        with self.transaction() as con:
            old = _current(con, "pairs", "pair", pair_id, expected_version)
            if old["kind"] != "step":
                raise EditError(f"pair {pair_id} is a {old['kind']} pair: only step pairs can be edited as text")
            for name, text in (("chosen", chosen), ("rejected", rejected)):
                if text != old[name]:
                    parsed = parse(text)
                    if isinstance(parsed, FormatError):
                        raise EditError(f"pair {pair_id}: edited {name} is not a composite action: {parsed.reason}")
            if chosen == rejected:
                raise EditError(f"pair {pair_id}: chosen and rejected would be the same text")
            before = {"chosen": old["chosen"], "rejected": old["rejected"]}
            after = {"chosen": chosen, "rejected": rejected}
            _write(con, "pairs", "pair_history", "pair_id", pair_id, old, who, "edit", before, after,
                   {**after, "status": "edited"})
        return self.pair(pair_id)

    def swap_pair(self, pair_id: str, who: str, expected_version: int) -> Pair:
        """Exchange chosen and rejected (texts, nodes, values, log-probs): the preference was wrong."""
        with self.transaction() as con:
            old = _current(con, "pairs", "pair", pair_id, expected_version)
            names = ("chosen", "chosen_node", "q_chosen", "logprob_chosen")
            swapped = {}
            for a in names:
                b = a.replace("chosen", "rejected")
                swapped[a], swapped[b] = old[b], old[a]
            before = {"chosen_node": old["chosen_node"], "rejected_node": old["rejected_node"]}
            after = {"chosen_node": old["rejected_node"], "rejected_node": old["chosen_node"]}
            _write(con, "pairs", "pair_history", "pair_id", pair_id, old, who, "swap", before, after,
                   {**swapped, "status": "edited"})
        return self.pair(pair_id)

    def bulk_set_pair_status(self, status: str, who: str, **filters: Any) -> int:
        """Set `status` on every pair matching `filters` (one transaction); returns how many changed."""
        action = _status_action(status)
        where, args = _pair_where(filters)
        now = time.time()
        with self.transaction() as con:
            rows = con.execute(f"SELECT id, version, status FROM pairs WHERE {where} AND status != ?",
                               (*args, status)).fetchall()
            con.executemany("UPDATE pairs SET status=?, version=?, updated_at=?, updated_by=? WHERE id=?",
                            [(status, v + 1, now, who, pid) for pid, v, _ in rows])
            con.executemany(
                "INSERT INTO pair_history VALUES (?,?,?,?,?,?,?)",
                [(pid, v + 1, now, who, action, json.dumps({"status": s}), json.dumps({"status": status}))
                 for pid, v, s in rows],
            )
        return len(rows)

    def save_samples(
        self, samples: Sequence[Sample], prune_run: str | None = None, prune_kinds: Sequence[str] = (),
        who: str = "orchard",
    ) -> SaveReport:
        """Upsert samples in one transaction; with `prune_run`, untouched samples of that run and
        `prune_kinds` that are not in `samples` are deleted (a rebuild's leftovers)."""
        with self.transaction() as con:
            ids = [s.id for s in samples]
            existing: dict[str, tuple] = {}
            curated = _CURATED.format(table="sample_history", key="sample_id", row="s.id")
            query = f"SELECT s.id, s.version, {curated}, s.kind, s.run_id, s.task_id, s.source, s.data FROM samples s"
            for chunk in range(0, len(ids), 500):
                part = ids[chunk : chunk + 500]
                for r in con.execute(f"{query} WHERE s.id IN ({','.join('?' * len(part))})", part):
                    existing[r[0]] = r[1:]
            if prune_run is not None and prune_kinds:
                marks = ",".join("?" * len(prune_kinds))
                for r in con.execute(f"{query} WHERE s.run_id=? AND s.kind IN ({marks})", (prune_run, *prune_kinds)):
                    existing.setdefault(r[0], r[1:])
            report, now = SaveReport(), time.time()
            inserts, updates, history = [], [], []
            for s in samples:
                row = (s.kind, s.run_id, s.task.id, json.dumps(s.source), json.dumps(s.data()))
                old = existing.pop(s.id, None)
                if old is None:
                    inserts.append((s.id, *row, "pending", 1, now, who))
                    history.append((s.id, 1, now, who, "create", None, json.dumps({"status": "pending"})))
                    report.created += 1
                elif old[1]:
                    report.kept += 1
                elif tuple(old[2:]) == row:
                    report.unchanged += 1
                else:
                    updates.append((*row, old[0] + 1, now, who, s.id))
                    history.append((s.id, old[0] + 1, now, who, "rebuild", None, None))
                    report.updated += 1
            con.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?,?,?,?,?)", inserts)
            con.executemany(
                "UPDATE samples SET kind=?, run_id=?, task_id=?, source=?, data=?, version=?, updated_at=?, "
                "updated_by=? WHERE id=?",
                updates,
            )
            con.executemany("INSERT INTO sample_history VALUES (?,?,?,?,?,?,?)", history)
            stale = [(sid,) for sid, old in existing.items() if not old[1]]
            report.stale_curated = len(existing) - len(stale)
            con.executemany("DELETE FROM samples WHERE id=?", stale)
            con.executemany("DELETE FROM sample_history WHERE sample_id=?", stale)
            report.pruned = len(stale)
        return report

    def samples(self, limit: int | None = None, offset: int = 0, **filters: Any) -> list[Sample]:
        """Samples matching `filters` (run_id, task_id, kind, status; kind/status may be lists)."""
        where, args = _sample_where(filters)
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        rows = self.con.execute(
            f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE {where} ORDER BY kind, run_id, task_id, id{page}", args
        ).fetchall()
        return [_sample_from_row(r) for r in rows]

    def sample(self, sample_id: str) -> Sample:
        row = self.con.execute(f"SELECT {_SAMPLE_COLUMNS} FROM samples WHERE id=?", (sample_id,)).fetchone()
        if row is None:
            raise StoreError(f"no sample {sample_id!r}")
        return _sample_from_row(row)

    def sample_counts(self, **filters: Any) -> dict[str, int]:
        where, args = _sample_where(filters)
        counts = dict.fromkeys(CURATION_STATUSES, 0)
        counts.update(self.con.execute(f"SELECT status, COUNT(*) FROM samples WHERE {where} GROUP BY status", args))
        counts["total"] = sum(counts.values())
        return counts

    def sample_history(self, sample_id: str) -> list[HistoryEntry]:
        return _history(self.con, "sample_history", "sample_id", sample_id)

    def set_sample_status(self, sample_id: str, status: str, who: str, expected_version: int) -> Sample:
        action = _status_action(status)
        with self.transaction() as con:
            old = _current(con, "samples", "sample", sample_id, expected_version)
            _write(con, "samples", "sample_history", "sample_id", sample_id, old, who, action,
                   {"status": old["status"]}, {"status": status}, {"status": status})
        return self.sample(sample_id)

    def set_turn_loss(self, sample_id: str, turn: int, loss: bool | None, who: str, expected_version: int) -> Sample:
        """Set one turn's loss flag (True / False / None = unspecified)."""
        if loss not in (True, False, None):
            raise EditError(f"sample {sample_id}: loss must be true, false or null, got {loss!r}")
        with self.transaction() as con:
            old = _current(con, "samples", "sample", sample_id, expected_version)
            data = json.loads(old["data"])
            if not 0 <= turn < len(data["turns"]):
                raise EditError(f"sample {sample_id} has no turn {turn} (it has {len(data['turns'])})")
            before = {"turn": turn, "loss": data["turns"][turn]["loss"]}
            data["turns"][turn]["loss"] = loss
            _write(con, "samples", "sample_history", "sample_id", sample_id, old, who, "edit", before,
                   {"turn": turn, "loss": loss}, {"data": json.dumps(data), "status": "edited"})
        return self.sample(sample_id)

    # --- training ----------------------------------------------------------------------------
    # Training jobs (state machine queued -> running -> succeeded | failed | cancelled; queued ->
    # cancelled), their progress and metric stream, the models they produced, evaluations of
    # models, and iteration-loop records. Jobs run in their own processes that write here through
    # their own connections (WAL): the job's state lives in the store, so a dashboard restart loses
    # nothing, and a job whose process died is detected by its runner (engine.train.jobs).

    def create_job(self, kind: str, config: dict[str, Any], device: str, name: str | None = None,
                   log_dir: str | Path | None = None) -> JobInfo:
        """A new queued job; its log file goes to `log_dir` (default: `jobs/` beside the database)."""
        job_id = uuid.uuid4().hex[:10]
        logs = Path(log_dir) if log_dir is not None else paths.jobs_dir(self.path)
        now = time.time()
        with self.transaction() as con:
            con.execute(
                "INSERT INTO jobs (id, kind, name, config, state, device, created_at, progress, log_path) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (job_id, kind, name or f"{kind}-{job_id}", json.dumps(config), "queued", device, now, "{}",
                 str(logs / f"{job_id}.log")),
            )
        return self.job(job_id)

    def job(self, job_id: str) -> JobInfo:
        row = self.con.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise StoreError(f"no job {job_id!r} in {self.path}")
        return _job_from_row(row)

    def find_job(self, key: str) -> str:
        """A job id from an id or a unique id prefix."""
        ids = [r[0] for r in self.con.execute("SELECT id FROM jobs WHERE id LIKE ? ORDER BY created_at",
                                              (f"{key}%",))]
        if key in ids:
            return key
        if not ids:
            raise StoreError(f"no job {key!r} in {self.path}")
        if len(ids) > 1:
            raise StoreError(f"job {key!r} is ambiguous: {', '.join(ids)}")
        return ids[0]

    def jobs(self, state: str | Sequence[str] | None = None, device: str | None = None) -> list[JobInfo]:
        """Jobs, oldest first, optionally only those in `state` (one or several) on `device`."""
        where, args = ["1=1"], []
        if state is not None:
            _in("state", state, where, args)
        if device is not None:
            where.append("device=?")
            args.append(device)
        rows = self.con.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY created_at, id", args
        ).fetchall()
        return [_job_from_row(r) for r in rows]

    def claim_next_job(self, device: str) -> JobInfo | None:
        """Atomically move the oldest queued job of `device` to running, if none runs there now."""
        with self.transaction() as con:
            busy = con.execute("SELECT 1 FROM jobs WHERE device=? AND state='running'", (device,)).fetchone()
            if busy:
                return None
            row = con.execute("SELECT id FROM jobs WHERE device=? AND state='queued' ORDER BY created_at, id LIMIT 1",
                              (device,)).fetchone()
            if row is None:
                return None
            now = time.time()
            con.execute("UPDATE jobs SET state='running', started_at=?, heartbeat_at=? WHERE id=?",
                        (now, now, row[0]))
        return self.job(row[0])

    def set_job_pid(self, job_id: str, pid: int) -> None:
        with self.transaction() as con:
            con.execute("UPDATE jobs SET pid=?, heartbeat_at=? WHERE id=?", (pid, time.time(), job_id))

    def update_job_progress(self, job_id: str, progress: dict[str, Any]) -> None:
        """Replace the job's progress (step, total, eta_s, phase, ...) and beat its heartbeat."""
        with self.transaction() as con:
            con.execute("UPDATE jobs SET progress=?, heartbeat_at=? WHERE id=?",
                        (json.dumps(progress), time.time(), job_id))

    def add_job_metrics(self, job_id: str, data: dict[str, Any], step: int | None = None) -> None:
        """Append one metrics record (a trainer log line: loss, reward margins, ...)."""
        with self.transaction() as con:
            seq = con.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM job_metrics WHERE job_id=?", (job_id,)).fetchone()
            con.execute("INSERT INTO job_metrics VALUES (?,?,?,?,?)",
                        (job_id, seq[0], step, time.time(), json.dumps(data)))

    def job_metrics(self, job_id: str) -> list[dict[str, Any]]:
        """The job's metric records in order, each with `step` and `at` added."""
        return [
            {**json.loads(d), "step": step, "at": at}
            for step, at, d in self.con.execute(
                "SELECT step, at, data FROM job_metrics WHERE job_id=? ORDER BY seq", (job_id,))
        ]

    def finish_job(self, job_id: str, state: str, error: str | None = None, output_path: str | None = None,
                   expect: Sequence[str] = ("running",)) -> bool:
        """Move a job from one of `expect` to a final `state`; False when it was not in `expect`
        (e.g. already marked failed by a runner that found its process dead)."""
        if state not in ("succeeded", "failed", "cancelled"):
            raise StoreError(f"job state {state!r} is not final (succeeded, failed, cancelled)")
        marks = ",".join("?" * len(expect))
        with self.transaction() as con:
            cur = con.execute(
                f"UPDATE jobs SET state=?, finished_at=?, error=COALESCE(?, error), "
                f"output_path=COALESCE(?, output_path) WHERE id=? AND state IN ({marks})",
                (state, time.time(), error, output_path, job_id, *expect),
            )
            return cur.rowcount == 1

    def request_job_cancel(self, job_id: str) -> JobInfo:
        """Flag a job for cancellation; a queued job is cancelled at once, a running one by its runner."""
        with self.transaction() as con:
            con.execute("UPDATE jobs SET cancel_requested=1 WHERE id=?", (job_id,))
            con.execute("UPDATE jobs SET state='cancelled', finished_at=? WHERE id=? AND state='queued'",
                        (time.time(), job_id))
        return self.job(job_id)

    def save_model(self, record: ModelRecord) -> None:
        """Record (or replace) a trained model folder's lineage, data ids and metrics."""
        with self.transaction() as con:
            con.execute(
                "INSERT OR REPLACE INTO models VALUES (?,?,?,?,?,?,?,?,?)",
                (record.path, record.name, record.kind, record.parent, record.job_id, json.dumps(record.data_ids),
                 json.dumps(record.config), json.dumps(record.metrics), record.created_at or time.time()),
            )

    def models(self) -> list[ModelRecord]:
        rows = self.con.execute(f"SELECT {_MODEL_COLUMNS} FROM models ORDER BY created_at").fetchall()
        return [_model_from_row(r) for r in rows]

    def model_record(self, path: str) -> ModelRecord:
        row = self.con.execute(f"SELECT {_MODEL_COLUMNS} FROM models WHERE path=?", (path,)).fetchone()
        if row is None:
            raise StoreError(f"no model {path!r} in {self.path}")
        return _model_from_row(row)

    def save_evaluation(self, model: str, env: str, split: str, task_ids: Sequence[str], mode: str,
                        config: dict[str, Any], metrics: dict[str, Any], episodes: Sequence[dict[str, Any]],
                        job_id: str | None = None) -> str:
        eval_id = uuid.uuid4().hex[:10]
        with self.transaction() as con:
            con.execute(
                "INSERT INTO evaluations VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (eval_id, model, env, split, json.dumps(list(task_ids)), mode, json.dumps(config),
                 json.dumps(metrics), json.dumps(list(episodes)), job_id, time.time()),
            )
        return eval_id

    def evaluations(self, model: str | None = None, with_episodes: bool = False) -> list[dict[str, Any]]:
        """Evaluations, oldest first (optionally of one model); per-episode rows on request."""
        cols = "id, model, env, split, task_ids, mode, config, metrics, job_id, created_at" + (
            ", episodes" if with_episodes else "")
        where, args = ("WHERE model=?", (model,)) if model is not None else ("", ())
        out = []
        for r in self.con.execute(f"SELECT {cols} FROM evaluations {where} ORDER BY created_at", args):
            row = {"id": r[0], "model": r[1], "env": r[2], "split": r[3], "task_ids": json.loads(r[4]), "mode": r[5],
                   "config": json.loads(r[6]), "metrics": json.loads(r[7]), "job_id": r[8], "created_at": r[9]}
            if with_episodes:
                row["episodes"] = json.loads(r[10])
            out.append(row)
        return out

    def node_token_counts(self, keys: Sequence[tuple[int | None, int]]) -> dict[tuple[int | None, int], int]:
        """{(tree id, node id): generated token count} for the given nodes (the DPO trainer checks
        that a stored log-prob covers exactly the tokens it will score)."""
        out: dict[tuple[int | None, int], int] = {}
        by_tree: dict[int, list[int]] = {}
        for tree_id, node_id in keys:
            if tree_id is not None:
                by_tree.setdefault(tree_id, []).append(node_id)
        for tree_id, nodes in by_tree.items():
            for chunk in range(0, len(nodes), 500):
                part = nodes[chunk : chunk + 500]
                rows = self.con.execute(
                    f"SELECT node_id, n_tokens FROM nodes WHERE tree_id=? AND node_id IN ({','.join('?' * len(part))})",
                    (tree_id, *part),
                )
                out.update({(tree_id, r[0]): r[1] for r in rows if r[1] is not None})
        return out

    def save_iteration(self, loop_id: str, idx: int, method: str, data: dict[str, Any]) -> None:
        """One iteration of a training loop (its run, data counts, model, scores), replaced if present."""
        with self.transaction() as con:
            con.execute("INSERT OR REPLACE INTO iterations VALUES (?,?,?,?,?)",
                        (loop_id, idx, method, json.dumps(data), time.time()))

    def iterations(self, loop_id: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE loop_id=?", (loop_id,)) if loop_id is not None else ("", ())
        return [
            {"loop_id": r[0], "idx": r[1], "method": r[2], **json.loads(r[3]), "created_at": r[4]}
            for r in self.con.execute(
                f"SELECT loop_id, idx, method, data, created_at FROM iterations {where} ORDER BY created_at, idx", args)
        ]


# --- datasets: module-level helpers of the Store's datasets section ---------------------------

CURATION_STATUSES = ("pending", "approved", "rejected", "edited")
_STATUS_ACTIONS = {"approved": "approve", "rejected": "reject", "pending": "reset"}
# A row is curated once its history has anything but its creation and automatic rebuilds.
_CURATED = "EXISTS (SELECT 1 FROM {table} h WHERE h.{key} = {row} AND h.action NOT IN ('create', 'rebuild'))"
_PAIR_COLUMNS = (
    "id, kind, run_id, tree_id, task_id, node_id, chosen_node, rejected_node, prompt, chosen, rejected, q_chosen, "
    "q_rejected, logprob_chosen, logprob_rejected, depth, status, version, updated_at, updated_by"
)
_PAIR_ORDERS = {
    "tree": "run_id, task_id, node_id, id",
    "gap": "q_chosen - q_rejected DESC, id",
    "updated": "updated_at DESC, id",
}
_SAMPLE_COLUMNS = "id, kind, run_id, source, data, status, version, updated_at, updated_by"


class ConflictError(StoreError):
    """A curation write based on a version that someone else has since changed."""


class EditError(StoreError):
    """A curation edit that is refused (unparseable action, unknown turn, wrong kind of row)."""


@dataclass
class SaveReport:
    """What a save did: created, refreshed (updated), identical (unchanged), curated rows left
    as they were (kept), untouched leftovers deleted (pruned), curated leftovers kept (stale_curated)."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    kept: int = 0
    pruned: int = 0
    stale_curated: int = 0

    def __str__(self) -> str:
        return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.__dict__.items() if v) or "nothing changed"


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    at: float
    who: str
    action: str
    before: Any
    after: Any


def _status_action(status: str) -> str:
    if status not in _STATUS_ACTIONS:
        raise EditError(f"status {status!r} cannot be set directly (use one of {', '.join(_STATUS_ACTIONS)}; "
                        "'edited' comes from editing)")
    return _STATUS_ACTIONS[status]


def _in(column: str, value: Any, where: list[str], args: list[Any]) -> None:
    values = [value] if isinstance(value, str) else list(value)
    where.append(f"{column} IN ({','.join('?' * len(values))})")
    args.extend(values)


def _pair_where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    """SQL for pair filters: run_id, task_id, kind, status (str or list), depth_min, depth_max,
    min_gap (Q(chosen) - Q(rejected) at least this), node_id."""
    known = {"run_id", "task_id", "kind", "status", "depth_min", "depth_max", "min_gap", "node_id"}
    unknown = set(filters) - known
    if unknown:
        raise StoreError(f"unknown pair filter(s): {', '.join(sorted(unknown))}")
    where, args = ["1=1"], []
    for key in ("run_id", "task_id", "node_id"):
        if filters.get(key) is not None:
            where.append(f"{key}=?")
            args.append(filters[key])
    for key in ("kind", "status"):
        if filters.get(key) is not None:
            _in(key, filters[key], where, args)
    for key, sql in (("depth_min", "depth >= ?"), ("depth_max", "depth <= ?"), ("min_gap", "q_chosen - q_rejected >= ?")):
        if filters.get(key) is not None:
            where.append(sql)
            args.append(filters[key])
    return " AND ".join(where), args


def _sample_where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    unknown = set(filters) - {"run_id", "task_id", "kind", "status"}
    if unknown:
        raise StoreError(f"unknown sample filter(s): {', '.join(sorted(unknown))}")
    where, args = ["1=1"], []
    for key in ("run_id", "task_id"):
        if filters.get(key) is not None:
            where.append(f"{key}=?")
            args.append(filters[key])
    for key in ("kind", "status"):
        if filters.get(key) is not None:
            _in(key, filters[key], where, args)
    return " AND ".join(where), args


def _pair_from_row(r: tuple) -> Pair:
    return Pair(
        id=r[0], kind=r[1], run_id=r[2], tree_id=r[3], task_id=r[4], node_id=r[5], chosen_node=r[6],
        rejected_node=r[7], prompt=json.loads(r[8]), chosen=r[9], rejected=r[10], q_chosen=r[11], q_rejected=r[12],
        logprob_chosen=r[13], logprob_rejected=r[14], depth=r[15], status=r[16], version=r[17], updated_at=r[18],
        updated_by=r[19],
    )


def _sample_from_row(r: tuple) -> Sample:
    return Sample.from_data(r[0], r[1], json.loads(r[4]), run_id=r[2], source=json.loads(r[3]), status=r[5],
                            version=r[6], updated_at=r[7], updated_by=r[8])


def _current(con: sqlite3.Connection, table: str, noun: str, row_id: str, expected_version: int) -> dict[str, Any]:
    """The row as a dict, if it is still at `expected_version` (inside the writer's transaction)."""
    cur = con.execute(f"SELECT * FROM {table} WHERE id=?", (row_id,))
    row = cur.fetchone()
    if row is None:
        raise StoreError(f"no {noun} {row_id!r}")
    old = dict(zip([d[0] for d in cur.description], row))
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


# --- training: module-level helpers of the Store's training section ---------------------------

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
FINAL_JOB_STATES = ("succeeded", "failed", "cancelled")
_JOB_COLUMNS = ("id, kind, name, config, state, device, pid, created_at, started_at, finished_at, heartbeat_at, "
                "progress, log_path, output_path, error, cancel_requested")
_MODEL_COLUMNS = "path, name, kind, parent, job_id, data_ids, config, metrics, created_at"


@dataclass(frozen=True)
class JobInfo:
    """A training (or evaluation / iteration) job as stored. `progress`: step, total, eta_s, phase."""

    id: str
    kind: str
    name: str
    config: dict[str, Any]
    state: str
    device: str
    pid: int | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    progress: dict[str, Any]
    log_path: str | None
    output_path: str | None
    error: str | None
    cancel_requested: bool

    @property
    def final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ModelRecord:
    """A trained model folder: where it came from (parent model, job, data ids) and its metrics."""

    path: str
    name: str
    kind: str
    parent: str | None = None
    job_id: str | None = None
    data_ids: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _job_from_row(r: tuple) -> JobInfo:
    return JobInfo(id=r[0], kind=r[1], name=r[2], config=json.loads(r[3]), state=r[4], device=r[5], pid=r[6],
                   created_at=r[7], started_at=r[8], finished_at=r[9], heartbeat_at=r[10],
                   progress=json.loads(r[11]) if r[11] else {}, log_path=r[12], output_path=r[13], error=r[14],
                   cancel_requested=bool(r[15]))


def _model_from_row(r: tuple) -> ModelRecord:
    return ModelRecord(path=r[0], name=r[1], kind=r[2], parent=r[3], job_id=r[4], data_ids=json.loads(r[5]),
                       config=json.loads(r[6]), metrics=json.loads(r[7]), created_at=r[8])
