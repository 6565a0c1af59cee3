"""The search tree of Agent Q (arXiv 2408.07199) as the search grows it: a list of mutable nodes,
each an agent history, edges composite actions (docs/algorithms.md §2; its JSON form `orchard.tree/1`, §6.2).

The values of an edge (h, a) live on the child node it leads to. `N` and `value_sum` are the only
fields that change after a node is created (backpropagation); everything else is written once.
The tree's numbers as columns (`SearchTree.columns()`) and the tree algorithms (eq. 10 value, best
path, path, re-rooting) are engine/tree_columns.py's: these nodes run the same functions.
On the ground floor (no search, no store): the search grows it, the store saves and loads it, the
data builders and the dashboard read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.actions import CompositeAction, render
from engine.envs.base import TaskSpec
from engine.prompts import HistoryStep
from engine.tree_columns import TreeColumns, best_child, best_path, path, q_mcts, reroot_ids, value

TERMINALS = ("success", "failure", "depth_limit", "format_error", "stopped")
FORMAT = "orchard.tree/1"


@dataclass
class Node:
    id: int
    parent: int | None
    depth: int
    observation: str
    action: CompositeAction | None = None
    raw: str | None = None  # the model's full completion
    format_error: str | None = None
    N: int = 0
    value_sum: float = 0.0
    Q_critic: float | None = None
    critic_rank: int | None = None
    critic_reason: str | None = None
    logprob: float | None = None
    reward: float | None = None
    progress: float | None = None
    terminal: str | None = None
    gen_ms: float = 0.0  # this completion's share of its batched generation call
    env_ms: float = 0.0
    n_tokens: int = 0
    author: str = "policy"  # "policy", or "human" for a node a person added from the tree
    children: list[int] = field(default_factory=list)
    screenshot: bytes | None = field(default=None, repr=False)  # JPEG of a terminal page (web env), stored apart

    @property
    def Q_mcts(self) -> float:
        """Q~: the running mean of eq. 8 (0 before any visit)."""
        return q_mcts(self.value_sum, self.N)

    def value(self, alpha: float) -> float:
        """Eq. 10: alpha * Q~ + (1 - alpha) * Q^ (Q~ alone when there is no critic score)."""
        return value(self.value_sum, self.N, self.Q_critic, alpha)


def link_children(nodes: list[Node]) -> list[Node]:
    """Fill in each node's `children` from the others' `parent` (nodes in id order, read or copied
    without their children), in id order; returns `nodes`."""
    for n in nodes:
        if n.parent is not None:
            nodes[n.parent].children.append(n.id)
    return nodes


@dataclass(frozen=True)
class Simulation:
    """One finished simulation: the tree path (root's child .. node rolled out from), the reward,
    and the rollout's commands beyond the tree (rollout states are not added to the tree).
    A rollout that reached success also keeps its steps whole in `turns` — (the model's text, the
    observation that followed) per step — so the successful trajectory exists as data (RFT rows,
    Agent-R good trajectories) although its steps are not tree nodes."""

    path: tuple[int, ...]
    reward: float
    rollout: tuple[str, ...] = ()
    turns: tuple[tuple[str, str], ...] = ()


@dataclass
class SearchTree:
    task: TaskSpec
    nodes: list[Node]
    simulations: list[Simulation] = field(default_factory=list)

    @classmethod
    def new(cls, task: TaskSpec, first_observation: str) -> SearchTree:
        return cls(task=task, nodes=[Node(id=0, parent=None, depth=0, observation=first_observation)])

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def add_child(self, parent: Node, **fields: Any) -> Node:
        node = Node(id=len(self.nodes), parent=parent.id, depth=parent.depth + 1, **fields)
        self.nodes.append(node)
        parent.children.append(node.id)
        return node

    def path(self, node: Node) -> list[Node]:
        """Nodes from the root's child down to `node` (empty for the root)."""
        nodes = self.nodes
        return [nodes[i] for i in path(lambda v: nodes[v].parent, node.id)]

    def history(self, node: Node) -> list[HistoryStep]:
        """Earlier steps up to and including `node`'s action, as prompts show them."""
        return [HistoryStep(n.action, n.observation) for n in self.path(node) if n.action is not None]

    def action_text(self, node_id: int) -> str | None:
        """The composite action text of the edge into `node_id`: the model's own completion when
        recorded (its log-prob belongs to that text), else the canonical rendering; None for neither."""
        node = self.nodes[node_id]
        if node.raw is not None:
            return node.raw
        return render(node.action) if node.action is not None else None

    def step_text(self, node_id: int) -> str:
        """The step into `node_id` as the value model reads it (and the PRM rows render it): the composite
        action (`action_text`), then the observation the env answered; ValueError for neither text nor action."""
        action = self.action_text(node_id)
        if action is None:
            raise ValueError(f"task {self.task.id} node {node_id}: neither a completion nor an action")
        return f"{action}\nOBSERVATION: {self.nodes[node_id].observation}"

    def commands(self, node: Node) -> list[str]:
        """The env commands that lead from reset to `node` (format errors step nothing)."""
        return [n.action.command for n in self.path(node) if n.action is not None and not n.format_error]

    def backpropagate(self, path: list[int], reward: float) -> None:
        """Eq. 8 on every edge of the path; the root counts the simulation too."""
        for nid in (0, *path):
            node = self.nodes[nid]
            node.N += 1
            node.value_sum += reward

    def best_path(self, alpha: float = 0.5) -> list[int]:
        """Greedy descent by eq. 10 value among visited children (the path the dashboard highlights)."""
        nodes = self.nodes
        return best_path(lambda v: nodes[v].children, lambda v: nodes[v].N, lambda v: nodes[v].value(alpha))

    def best_child(self, node_id: int, alpha: float = 0.5) -> int | None:
        """The visited child of `node_id` with the highest eq. 10 value (`best_path`'s step; None when
        no child was visited): the move MCTS at inference commits to."""
        nodes = self.nodes
        return best_child(lambda v: nodes[v].children, lambda v: nodes[v].N, lambda v: nodes[v].value(alpha), node_id)

    def columns(self) -> TreeColumns:
        """This tree's numbers as columns, a snapshot (later visits do not change it): what the
        dashboard draws and the shared tree algorithms run on (`TreeColumns.from_rows` makes the
        same from the store's rows)."""
        nodes, nan = self.nodes, math.nan
        return TreeColumns(
            task_id=self.task.id, goal=self.task.goal, simulations=len(self.simulations), solved=self.solved(),
            parent=[n.parent for n in nodes], depth=[n.depth for n in nodes], N=[n.N for n in nodes],
            value_sum=[n.value_sum for n in nodes],
            q_critic=[nan if n.Q_critic is None else n.Q_critic for n in nodes],
            critic_rank=[n.critic_rank for n in nodes], terminal=[n.terminal for n in nodes],
            children=[list(n.children) for n in nodes],
        )

    def solved(self) -> bool:
        return any(n.terminal == "success" for n in self.nodes) or any(
            s.reward >= 1.0 for s in self.simulations
        )

    def check_invariants(self) -> list[str]:
        """docs/algorithms.md §6 invariants; returns the violations (empty when consistent)."""
        problems = []
        counts = [0] * len(self.nodes)
        sums = [0.0] * len(self.nodes)
        for s in self.simulations:
            for nid in s.path:
                counts[nid] += 1
                sums[nid] += s.reward
        for n in self.nodes:
            child_n = sum(self.nodes[c].N for c in n.children)
            if n.N < child_n:
                problems.append(f"node {n.id}: N={n.N} < sum of children's N={child_n}")
            if n.parent is not None:
                if n.N != counts[n.id]:
                    problems.append(f"node {n.id}: N={n.N} but {counts[n.id]} simulations pass through it")
                elif n.N and not math.isclose(n.value_sum, sums[n.id], abs_tol=1e-9):
                    problems.append(f"node {n.id}: value sum {n.value_sum} != {sums[n.id]}")
                if n.parent >= len(self.nodes) or n.id not in self.nodes[n.parent].children:
                    problems.append(f"node {n.id}: orphan (parent {n.parent})")
            problems += self._rank_problems(n)
        if self.root.N != len(self.simulations):
            problems.append(f"root: N={self.root.N} but {len(self.simulations)} simulations")
        return problems

    def _rank_problems(self, parent: Node) -> list[str]:
        """Critic ranks of one expansion's K candidates: readable ones hold distinct ranks, format
        errors tie last at K-1 (docs/decisions.md "Format-error candidates and the critic"). K counts
        the ranked children: a human branch holds no rank until its parent is expanded again."""
        kids = [self.nodes[c] for c in parent.children]
        ranked = [(n, n.critic_rank) for n in kids if n.critic_rank is not None]
        k = len(ranked)
        out = [f"node {n.id}: critic rank {r} outside 0..{k - 1}" for n, r in ranked if not 0 <= r < k]
        out += [f"node {n.id}: format error with critic rank {r}, not {k - 1} (tied last)"
                for n, r in ranked if n.format_error and r != k - 1]
        readable = [r for n, r in ranked if not n.format_error]
        if len(readable) != len(set(readable)):
            out.append(f"node {parent.id}: children share critic ranks {sorted(readable)}")
        return out

    # --- interchange -----------------------------------------------------------------------

    def to_json(self, run: dict[str, Any], alpha: float = 0.5) -> dict[str, Any]:
        """The `orchard.tree/1` document (docs/algorithms.md §6)."""
        return {
            "format": FORMAT,
            "run": run,
            "task": {"id": self.task.id, "goal": self.task.goal},
            "nodes": [
                {
                    "id": n.id,
                    "parent": n.parent,
                    "depth": n.depth,
                    "action": n.action.to_dict() if n.action else None,
                    "raw": n.raw,
                    "format_error": n.format_error,
                    "observation": n.observation,
                    "N": n.N,
                    "Q_mcts": n.Q_mcts,
                    "Q_critic": n.Q_critic,
                    "Q": n.value(alpha),
                    "critic_rank": n.critic_rank,
                    "critic_reason": n.critic_reason,
                    "logprob": n.logprob,
                    "reward": n.reward,
                    "progress": n.progress,
                    "terminal": n.terminal,
                    "author": n.author,
                }
                for n in self.nodes
            ],
            "simulations": [
                {"path": list(s.path), "reward": s.reward, "rollout": list(s.rollout),
                 **({"turns": [list(t) for t in s.turns]} if s.turns else {})}
                for s in self.simulations
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SearchTree:
        """Rebuild a tree from an `orchard.tree/1` document (Q_mcts * N gives the value sums)."""
        if doc.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} document (format={doc.get('format')!r})")
        task = TaskSpec(id=str(doc["task"]["id"]), goal=doc["task"]["goal"])
        nodes = []
        for i, d in enumerate(doc["nodes"]):
            if d["id"] != i:
                raise ValueError(f"nodes[{i}]: id {d['id']} out of order (ids must be 0..n-1)")
            nodes.append(
                Node(
                    id=i,
                    parent=d["parent"],
                    depth=d["depth"],
                    observation=d["observation"],
                    action=CompositeAction.from_dict(d["action"]) if d.get("action") else None,
                    raw=d.get("raw"),
                    format_error=d.get("format_error"),
                    N=d["N"],
                    value_sum=d["Q_mcts"] * d["N"],
                    Q_critic=d.get("Q_critic"),
                    critic_rank=d.get("critic_rank"),
                    critic_reason=d.get("critic_reason"),
                    logprob=d.get("logprob"),
                    reward=d.get("reward"),
                    progress=d.get("progress"),
                    terminal=d.get("terminal"),
                    author=str(d.get("author") or "policy"),
                )
            )
        link_children(nodes)
        sims = [Simulation(tuple(s["path"]), s["reward"], tuple(s.get("rollout", ())),
                           tuple((str(t[0]), str(t[1])) for t in s.get("turns", ()))) for s in doc["simulations"]]
        return cls(task=task, nodes=nodes, simulations=sims)

    def to_networkx(self, alpha: float = 0.5):
        """A networkx DiGraph (parent -> child) with scalar node attributes (GraphML-safe)."""
        import networkx as nx

        g = nx.DiGraph(task=self.task.id, goal=self.task.goal)
        for n in self.nodes:
            attrs = {
                "depth": n.depth,
                "N": n.N,
                "Q_mcts": n.Q_mcts,
                "Q": n.value(alpha),
                "observation": n.observation,
                "command": n.action.command if n.action else "",
                "thought": n.action.thought if n.action else "",
                "terminal": n.terminal or "",
                "format_error": n.format_error or "",
                "author": n.author,
            }
            for key in ("Q_critic", "critic_rank", "logprob", "reward", "progress"):
                value = getattr(n, key)
                if value is not None:
                    attrs[key] = value
            g.add_node(n.id, **attrs)
            if n.parent is not None:
                g.add_edge(n.parent, n.id)
        return g


def reroot(tree: SearchTree, node_id: int) -> tuple[SearchTree, int]:
    """A copy of `tree` keeping the path root..node (each ancestor with only its path child) and the
    subtree below `node_id` (`reroot_ids`); returns (tree, the node's new id). Node ids stay
    creation-ordered; the copy has no simulations."""
    old = tree.nodes
    keep = reroot_ids(lambda v: old[v].parent, lambda v: old[v].children, node_id)
    new_id = {o: i for i, o in enumerate(keep)}
    nodes = []
    for o in keep:
        n = old[o]
        nodes.append(Node(**{k: v for k, v in n.__dict__.items() if k not in ("children", "id", "parent")},
                          id=new_id[o], parent=new_id[n.parent] if n.parent is not None else None))
    link_children(nodes)
    return SearchTree(task=tree.task, nodes=nodes, simulations=[]), new_id[node_id]
