"""A tree's shape and numbers without its texts: what laying out and drawing a tree needs.

Why: a 100k-node tree read whole (`Store.load_tree`: observations, actions, completions) costs
seconds, and a live tree would be read again after every simulation. The Tree explorer reads a
`TreeShape` from the store's skeleton instead (`Store.tree_skeleton`), grows it with the nodes
added since (`extended`), and reads texts only for the nodes it draws or shows
(`Store.load_nodes`). A shape is never changed once built (it is shared between sessions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.store import TreeSkeleton
from engine.tree_nodes import SearchTree


@dataclass(frozen=True)
class TreeShape:
    """Aligned per-node columns in node-id order (plain lists: the layout walks them node by node).
    `q_critic` is NaN where a node has no critic score; values follow `Node` (docs/algorithms.md §2)."""

    task_id: str
    goal: str
    simulations: int
    solved: bool
    parent: list[int | None]
    depth: list[int]
    N: list[int]
    value_sum: list[float]
    q_critic: list[float]
    critic_rank: list[int | None]
    terminal: list[str | None]
    children: list[list[int]]

    def __len__(self) -> int:
        return len(self.parent)

    @classmethod
    def from_skeleton(cls, sk: TreeSkeleton) -> TreeShape:
        """A shape of a whole tree's skeleton (ids 0..n-1); shares the skeleton's lists, so the
        skeleton must not be changed after (the store builds a new one per read)."""
        children: list[list[int]] = [[] for _ in sk.node_id]
        for i, p in enumerate(sk.parent):
            if p is not None:
                children[p].append(i)
        nan = math.nan
        return cls(
            task_id=sk.task_id, goal=sk.goal, simulations=sk.simulations, solved=sk.solved,
            parent=sk.parent, depth=sk.depth, N=sk.n, value_sum=sk.value_sum,
            q_critic=[nan if q is None else q for q in sk.q_critic],
            critic_rank=sk.critic_rank, terminal=sk.terminal, children=children,
        )

    @classmethod
    def from_tree(cls, tree: SearchTree) -> TreeShape:
        """The shape of a tree already in memory (tests, the Trajectories page)."""
        nodes = tree.nodes
        return cls(
            task_id=tree.task.id, goal=tree.task.goal, simulations=len(tree.simulations), solved=tree.solved(),
            parent=[n.parent for n in nodes], depth=[n.depth for n in nodes], N=[n.N for n in nodes],
            value_sum=[n.value_sum for n in nodes],
            q_critic=[math.nan if n.Q_critic is None else n.Q_critic for n in nodes],
            critic_rank=[n.critic_rank for n in nodes], terminal=[n.terminal for n in nodes],
            children=[list(n.children) for n in nodes],
        )

    def extended(self, new: TreeSkeleton, visits: tuple[list[int], list[float]]) -> TreeShape:
        """This shape with the nodes of `new` (ids from len(self) on) appended and every node's
        visits replaced by `visits` (N, value_sum of all nodes, as `Store.tree_visits` reads them).
        The children lists of untouched nodes are shared with this shape, never changed."""
        if new.node_id and new.node_id[0] != len(self):
            raise ValueError(f"new nodes start at {new.node_id[0]}, expected {len(self)}")
        if len(visits[0]) != len(self) + len(new):
            raise ValueError(f"visits for {len(visits[0])} nodes, the shape has {len(self) + len(new)}")
        children = list(self.children)
        copied: set[int] = set()
        for i, p in zip(new.node_id, new.parent):
            children.append([])
            if p is not None:
                if p not in copied and p < len(self):
                    children[p] = list(children[p])
                    copied.add(p)
                children[p].append(i)
        return TreeShape(
            task_id=new.task_id, goal=new.goal, simulations=new.simulations, solved=new.solved,
            parent=self.parent + new.parent, depth=self.depth + new.depth, N=list(visits[0]),
            value_sum=list(visits[1]),
            q_critic=self.q_critic + [math.nan if q is None else float(q) for q in new.q_critic],
            critic_rank=self.critic_rank + new.critic_rank, terminal=self.terminal + new.terminal,
            children=children,
        )

    def q_mcts(self, ids: np.ndarray | None = None) -> np.ndarray:
        """Q~ (eq. 8 running mean; 0 before any visit) of `ids` (all nodes by default)."""
        n = np.asarray(self.N, dtype=np.float64)
        s = np.asarray(self.value_sum, dtype=np.float64)
        if ids is not None:
            n, s = n[ids], s[ids]
        return np.divide(s, n, out=np.zeros_like(s), where=n > 0)

    def value(self, alpha: float, ids: np.ndarray | None = None) -> np.ndarray:
        """Eq. 10 (`Node.value`): alpha Q~ + (1 - alpha) Q^, Q~ alone without a critic score."""
        qm = self.q_mcts(ids)
        qc = np.asarray(self.q_critic, dtype=np.float64)
        if ids is not None:
            qc = qc[ids]
        return np.where(np.isnan(qc), qm, alpha * qm + (1.0 - alpha) * qc)

    def node_value(self, v: int, alpha: float) -> float:
        qm = self.value_sum[v] / self.N[v] if self.N[v] else 0.0
        qc = self.q_critic[v]
        return qm if math.isnan(qc) else alpha * qm + (1.0 - alpha) * qc

    def best_path(self, alpha: float = 0.5) -> list[int]:
        """`SearchTree.best_path`: greedy descent by eq. 10 among visited children."""
        out, v = [], 0
        while self.children[v]:
            visited = [c for c in self.children[v] if self.N[c] > 0]
            if not visited:
                break
            v = max(visited, key=lambda c: (self.node_value(c, alpha), self.N[c]))
            out.append(v)
        return out

    def path(self, v: int) -> list[int]:
        """Node ids from the root's child down to `v` (empty for the root), as `SearchTree.path`."""
        out = []
        while self.parent[v] is not None:
            out.append(v)
            v = self.parent[v]  # type: ignore[assignment]
        return out[::-1]


def as_shape(tree: SearchTree | TreeShape) -> TreeShape:
    return tree if isinstance(tree, TreeShape) else TreeShape.from_tree(tree)
