"""Runs, trees and simulations: each finished simulation is committed in ONE transaction (its new
nodes, the visit counts and values along its path, the simulation row), so a killed process loses
at most the simulation in progress and resumes from a consistent tree. Observations are stored
once per content hash."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import namedtuple
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.actions import CompositeAction
from engine.envs.base import TaskSpec
from engine.store import columns
from engine.store.columns import named, select
from engine.store.connection import Connection, _valid_text
from engine.store.records import RunInfo, StoreError, TreeSummary
from engine.tree_columns import NodeRows
from engine.tree_nodes import Node, SearchTree, Simulation, link_children

JPEG_MAGIC = b"\xff\xd8\xff"
NODES_PER_QUERY = 500  # ids bound in one IN (...): far below SQLite's and PostgreSQL's limits
NODE_COLUMNS = ("tree_id, node_id, parent_id, depth, action, raw, format_error, obs_hash, n, value_sum, q_critic, "
                "critic_rank, critic_reason, logprob, reward, progress, terminal, gen_ms, env_ms, n_tokens, author")
_NODE_N = NODE_COLUMNS.split(", ").index("n")  # a node row's visit count; its value sum follows
# save_simulations' statements, built once
_INSERT_OBSERVATIONS = columns.insert("observations", columns.OBSERVATION_ROW, "INSERT OR IGNORE")
_INSERT_NODES = f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES ({','.join('?' * len(NODE_COLUMNS.split(', ')))})"
_UPDATE_VALUES = "UPDATE nodes SET n=?, value_sum=? WHERE tree_id=? AND node_id=?"
_UPDATE_RANKS = "UPDATE nodes SET q_critic=?, critic_rank=?, critic_reason=? WHERE tree_id=? AND node_id=?"
_INSERT_SIMULATIONS = columns.insert("simulations", columns.SIMULATION_ROW)
_UPDATE_TREES = "UPDATE trees SET simulations=?, solved=? WHERE id=?"
_INSERT_MEDIA = columns.insert("node_media", columns.NODE_MEDIA_ROW, "INSERT OR REPLACE", "?,?,'screenshot',?")
KNOWN_OBSERVATIONS = 200_000  # hashes a writer remembers as stored (~20 MB); past that it starts over


def _check_parent(tree_id: int, node_id: int, parent: Any) -> None:
    """A stored node's parent is an earlier node (the root has none): what this code writes, and what
    every walk to the root relies on to end (a cycle of parents would loop for ever)."""
    if node_id == 0 and parent is None:
        return
    if not (isinstance(parent, int) and 0 <= parent < node_id):
        raise StoreError(f"tree {tree_id}, node {node_id}: parent {str(parent)[:20]!r} is not an earlier node")


def _simulation(path: list[int], reward: float, rollout: Any) -> Simulation:
    """A stored simulation: `rollout` is its commands (a list), or, for a rollout that succeeded,
    {"commands": [...], "turns": [[model text, observation], ...]} (same column, no migration)."""
    if isinstance(rollout, dict):
        turns = tuple((str(t[0]), str(t[1])) for t in rollout.get("turns", ()))
        return Simulation(tuple(path), reward, tuple(rollout.get("commands", ())), turns)
    return Simulation(tuple(path), reward, tuple(rollout))


# load_tree's and load_nodes' SELECT: a node's columns and its observation's text.
_NODE_SELECT = f"{select(columns.NODES, 'n')}, o.text"
_NODE_ROW = (*columns.NODES, "observation")


# A node row by name as a named tuple, not a dict: load_tree maps every node of a tree (100k rows),
# and `_make` costs a fifth of `dict(zip(...))` per row (docs/decisions.md, "Store rows by name").
_NodeRow = namedtuple("_NodeRow", _NODE_ROW)  # type: ignore[misc]


_ROW_ERRORS = (KeyError, TypeError, AttributeError, ValueError, IndexError)  # a row not as this code writes it


def _unreadable(where: str, e: Exception) -> StoreError:
    """The one-line error for a stored row this code cannot read, naming where it is."""
    return StoreError(f"{where}: unreadable ({type(e).__name__}: {str(e)[:80]})")


def _read_node(tree_id: int, node_id: object, row: Sequence[Any]) -> Node:
    """`_node`, where a row not as this code writes it is a one-line StoreError naming tree and node."""
    try:
        return _node(row)
    except _ROW_ERRORS as e:
        raise _unreadable(f"tree {tree_id}, node {node_id}", e) from None


def _node(row: Sequence[Any]) -> Node:
    """A node from a row of `_NODE_SELECT`."""
    r: Any = _NodeRow._make(row)  # fields from _NODE_ROW (mypy cannot see them)
    return Node(
        id=r.node_id, parent=r.parent_id, depth=r.depth, observation=r.observation,
        action=CompositeAction.from_dict(json.loads(r.action)) if r.action else None,
        raw=r.raw, format_error=r.format_error, N=r.n, value_sum=r.value_sum, Q_critic=r.q_critic,
        critic_rank=r.critic_rank, critic_reason=r.critic_reason, logprob=r.logprob, reward=r.reward,
        progress=r.progress, terminal=r.terminal, gen_ms=r.gen_ms or 0.0, env_ms=r.env_ms or 0.0,
        n_tokens=r.n_tokens or 0, author=r.author or "policy",
    )


_RUN_ROW = (*columns.RUNS, "trees", "simulations", "solved", "nodes")  # _run_infos' SELECT: a run and its counts


def _run_info(r: dict[str, Any]) -> RunInfo:
    return RunInfo(
        id=r["id"], name=r["name"], env=r["env"], model=r["model"], config=json.loads(r["config"]),
        task_ids=json.loads(r["task_ids"]), status=r["status"], created_at=r["created_at"],
        updated_at=r["updated_at"], stats=json.loads(r["stats"]) if r["stats"] else {},
        # PostgreSQL: SUM is NUMERIC
        trees=int(r["trees"]), simulations=int(r["simulations"]), solved=int(r["solved"]), nodes=int(r["nodes"]),
    )


def _obs_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class SimulationRows:
    """What one finished simulation writes, taken when it finished (`simulation_rows`): the tree goes on
    growing in memory, and these rows stay what was true then until `save_simulations` commits them."""

    observations: list[tuple[Any, ...]]
    nodes: list[tuple[Any, ...]]
    values: list[tuple[Any, ...]]
    ranks: list[tuple[Any, ...]]
    simulation: tuple[Any, ...]
    tree: tuple[Any, ...]
    media: list[tuple[Any, ...]]


def simulation_rows(tree_id: int, tree: SearchTree, sim: Simulation, first_new: int,
                    reranked: Sequence[int] = ()) -> SimulationRows:
    """The rows of `sim`, tree `tree`'s newest simulation: nodes created since `first_new`, the visit
    counts and value sums along its path, the critic's new ranks of older nodes `reranked`, the
    simulation row and the tree's counts."""
    new = tree.nodes[first_new:]
    touched = {0, *sim.path} - {n.id for n in new}
    hashes = [_obs_hash(n.observation) for n in new]  # once a node: its observation row and its own row
    return SimulationRows(
        observations=[(h, n.observation) for h, n in zip(hashes, new, strict=True)],
        nodes=[
            (
                tree_id, n.id, n.parent, n.depth,
                json.dumps(n.action.to_dict()) if n.action else None,
                n.raw, n.format_error, h, n.N, n.value_sum,
                n.Q_critic, n.critic_rank, n.critic_reason, n.logprob, n.reward, n.progress,
                n.terminal, n.gen_ms, n.env_ms, n.n_tokens, n.author,
            )
            for h, n in zip(hashes, new, strict=True)
        ],
        values=[(tree.nodes[i].N, tree.nodes[i].value_sum, tree_id, i) for i in sorted(touched)],
        ranks=[(tree.nodes[i].Q_critic, tree.nodes[i].critic_rank, tree.nodes[i].critic_reason, tree_id, i)
               for i in sorted(set(reranked)) if i < first_new],
        simulation=(tree_id, len(tree.simulations) - 1, json.dumps(list(sim.path)), sim.reward,
                    json.dumps({"commands": list(sim.rollout), "turns": [list(t) for t in sim.turns]}
                               if sim.turns else list(sim.rollout)), time.time()),
        tree=(len(tree.simulations), int(tree.solved()), tree_id),
        media=[(tree_id, n.id, n.screenshot) for n in new
               if isinstance(n.screenshot, bytes) and n.screenshot.startswith(JPEG_MAGIC)],
    )


def _merged_writes(batch: Sequence[SimulationRows], known: set[str]) -> tuple[list[tuple[Any, ...]], ...]:
    """The rows `batch` writes, merged so that each is written once, in what one statement per table
    leaves in the database when it runs after every INSERT of the batch: observations, nodes, visit
    counts, critic ranks, simulations, tree counts, media. An observation whose hash is in `known`
    (committed before) or already in the batch is left out (INSERT OR IGNORE keeps the first; same
    hash, same text); a node's latest (N, value_sum) of the batch goes into its INSERT row when the
    batch creates it, otherwise into one UPDATE; a tree's latest counts into one UPDATE (a later
    simulation of a tree holds its newer counts, as UPDATEs run in order would leave them)."""
    observations: list[tuple[Any, ...]] = []
    seen: set[str] = set()
    nodes: list[tuple[Any, ...]] = []
    created: dict[tuple[Any, Any], int] = {}  # (tree id, node id) -> its row in `nodes`
    for b in batch:
        for row in b.observations:
            if row[0] not in known and row[0] not in seen:
                seen.add(row[0])
                observations.append(row)
        for row in b.nodes:
            created[(row[0], row[1])] = len(nodes)
            nodes.append(row)
    values: dict[tuple[Any, Any], tuple[Any, ...]] = {}  # (tree id, node id) -> its latest UPDATE
    for b in batch:
        for row in b.values:
            key = (row[2], row[3])
            at = created.get(key)
            if at is None:
                values[key] = row
            else:
                node = nodes[at]
                nodes[at] = (*node[:_NODE_N], row[0], row[1], *node[_NODE_N + 2:])
    trees = {b.tree[-1]: b.tree for b in batch}  # tree id -> its latest counts
    return (observations, nodes, list(values.values()), [r for b in batch for r in b.ranks],
            [b.simulation for b in batch], list(trees.values()), [r for b in batch for r in b.media])


class RunsStore(Connection):
    """Runs, their trees and simulations."""

    # Hashes of observations this connection has committed (`save_simulations`), at most
    # KNOWN_OBSERVATIONS: created on the first save.
    _stored_observations: set[str] | None = None

    # --- runs --------------------------------------------------------------------------------

    def create_run(
        self, name: str, env: str, model: str, config: dict[str, Any], tasks: list[TaskSpec]
    ) -> str:
        _valid_text(name, "run name")
        run_id = uuid.uuid4().hex[:10]
        now = time.time()
        with self.transaction() as con:
            con.execute(
                columns.insert("runs", columns.RUN_ROW),
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

    def claim_run(self, run_id: str) -> str | None:
        """Mark the run running unless it is already, in one compare-and-set: its status before, or None
        when it is running (two steering jobs on one run: only one passes, before either loads a model)."""
        with self.transaction() as con:
            row = con.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None or row[0] == "running":
                return None
            cur = con.execute("UPDATE runs SET status='running', updated_at=? WHERE id=? AND status=?",
                              (time.time(), run_id, row[0]))
            return str(row[0]) if cur.rowcount == 1 else None

    def find_run(self, key: str) -> str:
        """A run id from an id, a unique id prefix or a unique name. The prefix is compared as
        text (substr), not as a LIKE pattern: `%` or `_` typed by a user must not match every run."""
        if not key:
            raise StoreError("empty run id: name a run (id, id prefix or name; `orchard runs` lists them)")
        _valid_text(key, "run")
        rows = self.con.execute(
            "SELECT id FROM runs WHERE id=? OR name=? OR substr(id, 1, ?)=? ORDER BY created_at",
            (key, key, len(key), key.lower()),  # ids are lower-case hex; LIKE ignored case, so does this
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
        return self._run_infos()

    def run(self, run_id: str) -> RunInfo:
        """One run by its exact id, read alone (a WHERE on the id, not a scan of every run)."""
        if isinstance(run_id, str):
            _valid_text(run_id, "run id")  # a lone surrogate: one line, not the driver's UnicodeEncodeError
            for info in self._run_infos("WHERE r.id = ?", (run_id,)):
                return info
        raise StoreError(f"no run {run_id!r} in {self.path}")

    def _run_infos(self, where: str = "", params: tuple[Any, ...] = ()) -> list[RunInfo]:
        """The runs (all, or those `where` selects) in creation order with their counts, in one query."""
        rows = self.con.execute(
            f"""SELECT {select(columns.RUNS, 'r')}, COUNT(t.id), COALESCE(SUM(t.simulations), 0),
                      COALESCE(SUM(t.solved), 0),
                      (SELECT COUNT(*) FROM nodes n JOIN trees t2 ON n.tree_id = t2.id WHERE t2.run_id = r.id)
               FROM runs r LEFT JOIN trees t ON t.run_id = r.id {where} GROUP BY r.id ORDER BY r.created_at""",
            params,
        ).fetchall()
        return [_run_info(named(_RUN_ROW, row)) for row in rows]

    # --- trees -------------------------------------------------------------------------------

    def tree_ids(self, run_id: str) -> list[tuple[int, str]]:
        """(tree id, task id) in run order."""
        return [
            (tree_id, task_id)
            for tree_id, task_id in self.con.execute("SELECT id, task_id FROM trees WHERE run_id=? ORDER BY position",
                                                     (run_id,))
        ]

    def tree_summaries(self, run_id: str) -> list[TreeSummary]:
        """Every tree of the run in run order with its counts (nodes, success leaves, depth): one query,
        for a run overview and a task picker."""
        tree = select(columns.TREES, "t")
        rows = self.con.execute(
            f"""SELECT {tree}, COUNT(n.node_id),
                      COALESCE(SUM(CASE WHEN n.terminal = 'success' THEN 1 ELSE 0 END), 0), COALESCE(MAX(n.depth), 0)
               FROM trees t LEFT JOIN nodes n ON n.tree_id = t.id WHERE t.run_id=?
               GROUP BY {tree} ORDER BY t.position""",
            (run_id,),
        ).fetchall()
        out = []
        for row in rows:
            r = named((*columns.TREES, "nodes", "successes", "max_depth"), row)
            out.append(TreeSummary(tree_id=r["id"], task_id=r["task_id"], goal=r["goal"],
                                   simulations=int(r["simulations"]), solved=bool(r["solved"]), nodes=int(r["nodes"]),
                                   successes=int(r["successes"]), max_depth=int(r["max_depth"])))
        return out

    def _tree(self, tree_id: int) -> dict[str, Any]:
        """The `trees` row of `tree_id`, by column name."""
        row = self.con.execute(f"SELECT {select(columns.TREES)} FROM trees WHERE id=?", (tree_id,)).fetchone()
        if row is None:
            raise StoreError(f"no tree {tree_id}")
        return named(columns.TREES, row)

    def tree_id(self, run_id: str, task_id: str) -> int:
        row = self.con.execute("SELECT id FROM trees WHERE run_id=? AND task_id=?", (run_id, task_id)).fetchone()
        if row is None:
            known = ", ".join(t for _, t in self.tree_ids(run_id)[:10])
            raise StoreError(f"run {run_id} has no task {task_id!r} (tasks: {known}...)")
        return row[0]

    def save_simulation(self, tree_id: int, tree: SearchTree, sim: Simulation, first_new: int,
                        reranked: Sequence[int] = ()) -> None:
        """One transaction: nodes created since `first_new`, the values along the path, the row, and
        the critic's new ranks of older nodes `reranked` (siblings ranked again with "more candidates")."""
        self.save_simulations([simulation_rows(tree_id, tree, sim, first_new, reranked)])

    def save_simulations(self, batch: Sequence[SimulationRows]) -> None:
        """Simulations taken with `simulation_rows`, in order, in ONE transaction (one commit, one fsync
        on SQLite, for every simulation a scheduler round finished). The tables end as if each
        simulation's rows were written in turn; the writes are merged first (`_merged_writes`): one
        statement list per table, a node's visit count and value sum written once (with its row when
        the batch also creates it), a tree's counts once, an observation once and not at all when this
        connection has committed it already (observations are never deleted)."""
        if not batch:
            return
        known = self._stored_observations
        if known is None:
            known = self._stored_observations = set()
        observations, nodes, values, ranks, simulations, trees, media = _merged_writes(batch, known)
        nested = self.con.in_transaction  # an outer transaction may still roll back: remember nothing then
        with self.transaction() as con:
            if observations:
                con.executemany(_INSERT_OBSERVATIONS, observations)
            if nodes:
                con.executemany(_INSERT_NODES, nodes)
            if values:
                con.executemany(_UPDATE_VALUES, values)
            if ranks:
                con.executemany(_UPDATE_RANKS, ranks)
            con.executemany(_INSERT_SIMULATIONS, simulations)
            con.executemany(_UPDATE_TREES, trees)
            if media:  # terminal-page screenshots (web env): JPEG bytes only, kept out of `nodes`
                con.executemany(_INSERT_MEDIA, media)
        if not nested:
            if len(known) + len(observations) > KNOWN_OBSERVATIONS:
                known.clear()
            known.update(h for h, _ in observations)

    def load_tree(self, tree_id: int) -> SearchTree | None:
        """The committed tree, or None when its root was never written."""
        t = self._tree(tree_id)
        task = TaskSpec(id=t["task_id"], goal=t["goal"], context=t["context"], split=t["split"])
        rows = self.con.execute(
            f"""SELECT {_NODE_SELECT} FROM nodes n JOIN observations o ON o.hash = n.obs_hash
               WHERE n.tree_id=? ORDER BY n.node_id""",
            (tree_id,),
        ).fetchall()
        if not rows:
            return None
        nodes = []
        for i, r in enumerate(rows):
            node = _read_node(tree_id, i, r)
            if node.id != i:
                raise StoreError(f"tree {tree_id}: node ids not contiguous at {i} (found {node.id})")
            _check_parent(tree_id, i, node.parent)
            nodes.append(node)
        link_children(nodes)
        sims = []
        for k, (path, reward, rollout) in enumerate(self.con.execute(
                f"SELECT {select(columns.SIMULATIONS)} FROM simulations WHERE tree_id=? ORDER BY idx", (tree_id,))):
            try:
                sims.append(_simulation(json.loads(path), reward, json.loads(rollout)))
            except _ROW_ERRORS as e:
                raise _unreadable(f"tree {tree_id}, simulation {k}", e) from None
        return SearchTree(task=task, nodes=nodes, simulations=sims)

    # --- partial reads (the dashboard: numbers for drawing, texts for the few nodes shown) ----------

    def tree_skeleton(self, tree_id: int, after: int = -1) -> NodeRows:
        """The numbers of the nodes with id > `after` (all of them by default), no texts, as rows
        (`TreeColumns.from_rows` makes the tree of them; engine/tree_columns.py): a live view
        that has read up to node `after` reads only what was added since (ids grow, never reused).
        Visits of the older nodes change too: `tree_visits` reads those."""
        t = self._tree(tree_id)
        rows = self.con.execute(
            f"SELECT {select(columns.NODE_SKELETON)} FROM nodes WHERE tree_id=? AND node_id>? ORDER BY node_id",
            (tree_id, after),
        ).fetchall()
        cols = named(columns.NODE_SKELETON, [list(c) for c in zip(*rows)] if rows else [[] for _ in columns.NODE_SKELETON])
        ids = cols["node_id"]
        if ids != list(range(after + 1, after + 1 + len(rows))):
            at = next(i for i, v in enumerate(ids, after + 1) if v != i)
            raise StoreError(f"tree {tree_id}: node ids not contiguous at {at} (found {ids[at - after - 1]})")
        for i, parent in zip(ids, cols["parent_id"], strict=True):
            _check_parent(tree_id, i, parent)
        return NodeRows(
            task_id=t["task_id"], goal=t["goal"], simulations=t["simulations"], solved=bool(t["solved"]),
            node_id=ids, parent=cols["parent_id"], depth=cols["depth"], N=cols["n"], value_sum=cols["value_sum"],
            q_critic=cols["q_critic"], critic_rank=cols["critic_rank"], terminal=cols["terminal"],
        )

    def tree_visits(self, tree_id: int) -> tuple[list[int], list[float]]:
        """(N, value_sum) of every node in id order: the only node fields that change after a node
        is written (backpropagation), re-read by a live view together with the new nodes."""
        rows = self.con.execute(
            "SELECT n, value_sum FROM nodes WHERE tree_id=? ORDER BY node_id", (tree_id,)
        ).fetchall()
        return [n for n, _ in rows], [value_sum for _, value_sum in rows]

    def load_nodes(self, tree_id: int, ids: Iterable[int]) -> dict[int, Node]:
        """The full nodes `ids` (texts, action, observation), by id; ids not in the tree are left
        out. Their `children` are not filled in (the skeleton has the shape)."""
        wanted = sorted(set(ids))
        out: dict[int, Node] = {}
        for start in range(0, len(wanted), NODES_PER_QUERY):
            chunk = wanted[start:start + NODES_PER_QUERY]
            rows = self.con.execute(
                f"""SELECT {_NODE_SELECT} FROM nodes n JOIN observations o ON o.hash = n.obs_hash
                   WHERE n.tree_id=? AND n.node_id IN ({','.join('?' * len(chunk))})""",
                (tree_id, *chunk),
            ).fetchall()
            for r in rows:
                node = _read_node(tree_id, r[0], r)
                out[node.id] = node
        return out

    def node_texts(self, tree_id: int) -> list[tuple[int, CompositeAction | None, str | None]]:
        """(node id, composite action, raw completion) of every node, for a text search over the
        tree; no observations."""
        out = []
        for node_id, action, raw in self.con.execute(
                "SELECT node_id, action, raw FROM nodes WHERE tree_id=? ORDER BY node_id", (tree_id,)):
            try:
                out.append((node_id, CompositeAction.from_dict(json.loads(action)) if action else None, raw))
            except _ROW_ERRORS as e:
                raise _unreadable(f"tree {tree_id}, node {node_id}: its action", e) from None
        return out

    def human_nodes(self, tree_id: int) -> list[int]:
        """Ids of the nodes a person added from the tree (author "human"), in id order."""
        return [r[0] for r in self.con.execute(
            "SELECT node_id FROM nodes WHERE tree_id=? AND author='human' ORDER BY node_id", (tree_id,))]

    def human_node_count(self, run_id: str) -> int:
        """How many nodes of the run's trees a person added (author "human"): the Loop view's column."""
        row = self.con.execute(
            "SELECT COUNT(*) FROM nodes JOIN trees ON trees.id = nodes.tree_id "
            "WHERE trees.run_id=? AND nodes.author='human'", (run_id,)).fetchone()
        return int(row[0]) if row else 0

    def node_screenshot(self, tree_id: int, node_id: int) -> bytes | None:
        """The JPEG stored with a terminal node (None when it has none); not loaded with the tree."""
        row = self.con.execute(
            "SELECT data FROM node_media WHERE tree_id=? AND node_id=? AND kind='screenshot'", (tree_id, node_id)
        ).fetchone()
        return bytes(row[0]) if row else None
