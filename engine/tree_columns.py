"""One search tree as columns (docs/algorithms.md §2), and the tree algorithms, written once.

A tree is aligned per-node columns in node-id order (ids 0..n-1, parents created before their
children): `parent`, `depth`, visits `N`, `value_sum` (so Q~ = value_sum / N), the critic's `q_critic`
(Q^) and `critic_rank`, `terminal`, and each node's `children`. Texts (observations, actions,
completions) and pictures are not columns: they are read by node id when a node is shown
(`Store.load_nodes`). In the spirit of mctx's batched tree: numbers in columns, algorithms over them.

Who builds one: the store reads a tree's rows without texts (`NodeRows`, `Store.tree_skeleton`) and
`TreeColumns.from_rows` makes the tree (`extended` grows it by the rows added since); the search's
own tree of mutable nodes hands out the same columns (`SearchTree.columns()`, engine/tree_nodes.py).
The algorithms (value under alpha, best path, path to a node, the nodes a re-rooting keeps, subtree
sizes) are functions over "what a node's parent / children / visits / value is", so the columns and
the search's node objects run the same code. This module imports nothing of the engine: the ground floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

# --- the algorithms (one node's numbers, or the tree seen through accessors) ----------------------------


def q_mcts(value_sum: float, visits: int) -> float:
    """Q~: the running mean of eq. 8 (0 before any visit)."""
    return value_sum / visits if visits else 0.0


def value(value_sum: float, visits: int, q_critic: float | None, alpha: float) -> float:
    """Eq. 10: alpha * Q~ + (1 - alpha) * Q^; Q~ alone when there is no critic score (None or NaN)."""
    qm = q_mcts(value_sum, visits)
    if q_critic is None or math.isnan(q_critic):
        return qm
    return alpha * qm + (1.0 - alpha) * q_critic


def path(parent_of: Callable[[int], int | None], v: int) -> list[int]:
    """Node ids from the root's child down to `v` (empty for the root)."""
    out: list[int] = []
    p = parent_of(v)
    while p is not None:
        out.append(v)
        v, p = p, parent_of(p)
    return out[::-1]


def best_child(children_of: Callable[[int], Sequence[int]], visits_of: Callable[[int], int],
               value_of: Callable[[int], float], v: int) -> int | None:
    """The visited child of `v` with the highest eq. 10 value (ties: more visits, then the older
    child; children in id order); None when no child of `v` was visited."""
    visited = [c for c in children_of(v) if visits_of(c) > 0]
    return max(visited, key=lambda c: (value_of(c), visits_of(c))) if visited else None


def best_path(children_of: Callable[[int], Sequence[int]], visits_of: Callable[[int], int],
              value_of: Callable[[int], float]) -> list[int]:
    """Greedy descent from the root by `best_child`: the path the dashboard highlights and runs are
    compared by (MCTS at inference commits to its first step)."""
    out: list[int] = []
    v = best_child(children_of, visits_of, value_of, 0)
    while v is not None:
        out.append(v)
        v = best_child(children_of, visits_of, value_of, v)
    return out


def reroot_ids(parent_of: Callable[[int], int | None], children_of: Callable[[int], Sequence[int]],
               v: int) -> list[int]:
    """The nodes a tree re-rooted at `v` keeps, in id order: the path root..v (each ancestor with only
    its path child) and the whole subtree below `v` (MCTS at inference searches such a copy)."""
    keep = [0, *path(parent_of, v)]
    stack = list(children_of(v))
    while stack:
        c = stack.pop()
        keep.append(c)
        stack.extend(children_of(c))
    return sorted(set(keep))


def subtree_sizes(parent: Sequence[int | None]) -> list[int]:
    """Nodes in each node's subtree, itself included (ids are created parents first)."""
    size = [1] * len(parent)
    for v in range(len(parent) - 1, 0, -1):
        p = parent[v]
        if p is not None:
            size[p] += size[v]
    return size


def children_lists(parent: Sequence[int | None]) -> list[list[int]]:
    """Each node's children in id order, from the parent column."""
    children: list[list[int]] = [[] for _ in parent]
    for i, p in enumerate(parent):
        if p is not None:
            children[p].append(i)
    return children


# --- the columns ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRows:
    """Node rows as columns, texts left out: the nodes with ids `node_id` (contiguous), as the store
    holds them (`Store.tree_skeleton`: all of a tree's nodes, or those added after a node id), with
    the tree's own counts (`simulations`, `solved`). Missing numbers are None, as stored; the field
    names are the tree's (`TreeColumns`)."""

    task_id: str
    goal: str
    simulations: int
    solved: bool
    node_id: list[int]
    parent: list[int | None]
    depth: list[int]
    N: list[int]
    value_sum: list[float]
    q_critic: list[float | None]
    critic_rank: list[int | None]
    terminal: list[str | None]

    def __len__(self) -> int:
        return len(self.node_id)

    @property
    def n(self) -> list[int]:
        """`N` under the store's column name (older callers)."""
        return self.N


class HasColumns(Protocol):
    """A tree that hands out its columns (the search's `SearchTree`)."""

    def columns(self) -> TreeColumns: ...


@dataclass(frozen=True)
class TreeColumns:
    """A whole tree as aligned columns in node-id order (plain lists: the layout walks them node by
    node; numpy for the vectorised values). `q_critic` is NaN where a node has no critic score. Never
    changed once built (the dashboard shares one between sessions)."""

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
    def from_tree(cls, tree: TreeColumns | HasColumns) -> TreeColumns:
        """The columns of `tree`: itself when it is columns already, else `tree.columns()` (a snapshot
        of the search's tree of nodes, `SearchTree.columns()`)."""
        return tree if isinstance(tree, TreeColumns) else tree.columns()

    @classmethod
    def from_rows(cls, rows: NodeRows) -> TreeColumns:
        """The tree of a whole tree's rows (ids 0..n-1); shares the rows' lists, so the rows must not
        be changed after (the store builds new ones per read)."""
        if rows.node_id and rows.node_id[0] != 0:
            raise ValueError(f"rows start at node {rows.node_id[0]}, not at the root")
        nan = math.nan
        return cls(
            task_id=rows.task_id, goal=rows.goal, simulations=rows.simulations, solved=rows.solved,
            parent=rows.parent, depth=rows.depth, N=rows.N, value_sum=rows.value_sum,
            q_critic=[nan if q is None else q for q in rows.q_critic],
            critic_rank=rows.critic_rank, terminal=rows.terminal, children=children_lists(rows.parent),
        )

    def extended(self, new: NodeRows, visits: tuple[list[int], list[float]]) -> TreeColumns:
        """This tree with the rows `new` (ids from len(self) on) appended and every node's visits
        replaced by `visits` (N, value_sum of all nodes, as `Store.tree_visits` reads them). The
        children lists of untouched nodes are shared with this tree, never changed."""
        if new.node_id and new.node_id[0] != len(self):
            raise ValueError(f"new nodes start at {new.node_id[0]}, expected {len(self)}")
        if len(visits[0]) != len(self) + len(new):
            raise ValueError(f"visits for {len(visits[0])} nodes, the tree has {len(self) + len(new)}")
        children = list(self.children)
        copied: set[int] = set()
        for i, p in zip(new.node_id, new.parent):
            children.append([])
            if p is not None:
                if p not in copied and p < len(self):
                    children[p] = list(children[p])
                    copied.add(p)
                children[p].append(i)
        return TreeColumns(
            task_id=new.task_id, goal=new.goal, simulations=new.simulations, solved=new.solved,
            parent=self.parent + new.parent, depth=self.depth + new.depth, N=list(visits[0]),
            value_sum=list(visits[1]),
            q_critic=self.q_critic + [math.nan if q is None else float(q) for q in new.q_critic],
            critic_rank=self.critic_rank + new.critic_rank, terminal=self.terminal + new.terminal,
            children=children,
        )

    # --- values ---------------------------------------------------------------------------------

    def q_mcts(self, ids: np.ndarray | None = None) -> np.ndarray:
        """Q~ (`q_mcts`) of `ids` (all nodes by default), vectorised."""
        import numpy as np

        n = np.asarray(self.N, dtype=np.float64)
        s = np.asarray(self.value_sum, dtype=np.float64)
        if ids is not None:
            n, s = n[ids], s[ids]
        return np.divide(s, n, out=np.zeros_like(s), where=n > 0)

    def value(self, alpha: float, ids: np.ndarray | None = None) -> np.ndarray:
        """Eq. 10 (`value`) of `ids` (all nodes by default), vectorised."""
        import numpy as np

        qm = self.q_mcts(ids)
        qc = np.asarray(self.q_critic, dtype=np.float64)
        if ids is not None:
            qc = qc[ids]
        return np.where(np.isnan(qc), qm, alpha * qm + (1.0 - alpha) * qc)

    def node_value(self, v: int, alpha: float) -> float:
        """Eq. 10 of node `v`."""
        return value(self.value_sum[v], self.N[v], self.q_critic[v], alpha)

    # --- the algorithms on this tree -------------------------------------------------------------

    def best_path(self, alpha: float = 0.5) -> list[int]:
        return best_path(self.children.__getitem__, self.N.__getitem__, lambda c: self.node_value(c, alpha))

    def path(self, v: int) -> list[int]:
        return path(self.parent.__getitem__, v)

    def subtree_sizes(self) -> list[int]:
        return subtree_sizes(self.parent)

    def reroot(self, v: int) -> tuple[TreeColumns, int]:
        """This tree re-rooted at `v` (`reroot_ids`), renumbered in id order; and `v`'s new id."""
        keep = reroot_ids(self.parent.__getitem__, self.children.__getitem__, v)
        new_id = {old: i for i, old in enumerate(keep)}
        parent = [None if self.parent[old] is None else new_id[self.parent[old]] for old in keep]  # type: ignore[index]
        return TreeColumns(
            task_id=self.task_id, goal=self.goal, simulations=0,
            solved=any(self.terminal[old] == "success" for old in keep), parent=parent, depth=[self.depth[old] for old in keep], N=[self.N[old] for old in keep],
            value_sum=[self.value_sum[old] for old in keep], q_critic=[self.q_critic[old] for old in keep],
            critic_rank=[self.critic_rank[old] for old in keep], terminal=[self.terminal[old] for old in keep],
            children=children_lists(parent),
        ), new_id[v]
