"""Two search trees of one task side by side (issue 28 item 3): aligned by the path of commands,
with per-depth visits and successes of each, the two best paths drawn together, and the first depth
where they part.

Two nodes match when the command strings along their paths from the root are equal (a format-error
step counts as a step with no command, so it matches only another format error there); the ids of
two trees never match (each search numbers its own nodes). Each tree's best path is its own
`SearchTree.best_path` under its own run's alpha (eq. 10).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.tree_nodes import Node, SearchTree

Key = tuple[str | None, ...]  # the command of each step from the root (None: a format error)


def step_command(node: Node) -> str | None:
    """The env command `node`'s step took (None for the root and a format error), as `SearchTree.commands`."""
    return node.action.command if node.action is not None and not node.format_error else None


def command_paths(tree: SearchTree) -> list[Key]:
    """Every node's command path, by node id. Built from each parent's (a parent's id is smaller than
    its children's), so a deep tree costs one step per node, not one walk per node."""
    out: list[Key] = []
    for n in tree.nodes:
        out.append(() if n.parent is None else (*out[n.parent], step_command(n)))
    return out


def align(a: SearchTree, b: SearchTree) -> list[tuple[int, int]]:
    """(node of `a`, node of `b`) for every two nodes with equal command paths, in `a`'s id order
    (siblings that took the same command match every node of the other tree on that path)."""
    in_b: dict[Key, list[int]] = {}
    for nid, key in enumerate(command_paths(b)):
        in_b.setdefault(key, []).append(nid)
    return [(na, nb) for na, key in enumerate(command_paths(a)) for nb in in_b.get(key, ())]


@dataclass(frozen=True)
class DepthRow:
    """One depth of the comparison. Visits: the sum of N of the tree's nodes at this depth (the
    simulations whose tree path reaches it; the root's N at depth 0). Successes: those simulations
    that ended with reward >= 1. `shared`: command paths of this depth that both trees hold. `a_best`
    / `b_best`: the command of each tree's best path at this depth ("" where the path has ended,
    None where its step is a format error). `parted`: the best paths differ at this depth or above."""

    depth: int
    a_visits: int
    a_successes: int
    b_visits: int
    b_successes: int
    shared: int
    a_best: str | None
    b_best: str | None
    parted: bool

    @staticmethod
    def rate(successes: int, visits: int) -> float | None:
        return successes / visits if visits else None


@dataclass(frozen=True)
class TreeComparison:
    rows: list[DepthRow]
    a_best: list[int]  # node ids of each tree's best path (root's child first)
    b_best: list[int]
    first_parting: int | None  # the first depth where the best paths' commands differ; None: equal paths
    matched: int  # nodes of `a` with a command path `b` holds too (the root included)


def _per_depth(tree: SearchTree, depths: int) -> tuple[list[int], list[int]]:
    visits, successes = [0] * depths, [0] * depths
    for n in tree.nodes:
        visits[n.depth] += n.N
    for s in tree.simulations:
        if s.reward >= 1.0:  # success, as `SearchTree.solved` reads a simulation
            for d in range(len(s.path) + 1):
                successes[d] += 1
    return visits, successes


def _best_commands(tree: SearchTree, best: list[int], depths: int) -> list[str | None]:
    return [""] + [step_command(tree.nodes[i]) for i in best] + [""] * (depths - 1 - len(best))


def compare_trees(a: SearchTree, b: SearchTree, alpha_a: float = 0.5, alpha_b: float = 0.5) -> TreeComparison:
    """The two trees depth by depth (0 = the root) down to the deeper tree's deepest node."""
    if a.task.id != b.task.id:
        raise ValueError(f"trees of different tasks: {a.task.id!r} and {b.task.id!r}")
    depths = 1 + max(n.depth for n in (*a.nodes, *b.nodes))
    a_visits, a_succ = _per_depth(a, depths)
    b_visits, b_succ = _per_depth(b, depths)
    keys_a, keys_b = command_paths(a), command_paths(b)
    shared_keys = set(keys_a) & set(keys_b)
    shared = [0] * depths
    for key in shared_keys:
        shared[len(key)] += 1
    a_best, b_best = a.best_path(alpha_a), b.best_path(alpha_b)
    ca, cb = _best_commands(a, a_best, depths), _best_commands(b, b_best, depths)
    first = next((d for d in range(1, depths) if ca[d] != cb[d]), None)
    rows = [DepthRow(d, a_visits[d], a_succ[d], b_visits[d], b_succ[d], shared[d], ca[d], cb[d],
                     first is not None and d >= first) for d in range(depths)]
    matched = sum(1 for key in keys_a if key in shared_keys)
    return TreeComparison(rows, a_best, b_best, first, matched)
