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
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from engine.actions import CompositeAction
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
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


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
    """`$ORCHARD_HOME/orchard.db`, else `data/orchard.db` in the repository."""
    home = os.environ.get("ORCHARD_HOME")
    base = Path(home) if home else Path(__file__).resolve().parent.parent / "data"
    return base / "orchard.db"


def _check_file(path: Path) -> None:
    """Refuse a file that is not SQLite, or SQLite that is not ours, without writing to it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise StoreError(f"{path}: not an Orchard database (not a SQLite file)")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                return
            if "meta" not in tables:
                raise StoreError(f"{path}: a SQLite database, but not Orchard's (no meta table)")
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path}: corrupt or unreadable database ({e})") from None
    if meta.get("app") != APP_ID:
        raise StoreError(f"{path}: a SQLite database, but not Orchard's (app={meta.get('app')!r})")
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {version} is newer than this Orchard ({SCHEMA_VERSION}); upgrade")


def _obs_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


class Store:
    """A connection to one Orchard database. Not shared across threads; one writer process."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        _check_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.con.execute("PRAGMA journal_mode=WAL")
            self.con.execute("PRAGMA synchronous=NORMAL")
            self.con.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: corrupt or unreadable database ({e})") from None

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
                 json.dumps(list(sim.rollout)), time.time()),
            )
            con.execute(
                "UPDATE trees SET simulations=?, solved=? WHERE id=?",
                (len(tree.simulations), int(tree.solved()), tree_id),
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
            Simulation(tuple(json.loads(r[0])), r[1], tuple(json.loads(r[2])))
            for r in self.con.execute(
                "SELECT path, reward, rollout FROM simulations WHERE tree_id=? ORDER BY idx", (tree_id,)
            )
        ]
        return SearchTree(task=task, nodes=nodes, simulations=sims)
