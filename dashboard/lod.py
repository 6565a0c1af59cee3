"""Level of detail: which part of a big tree the Tree explorer draws.

Why: drawing all of a 100k-node tree sends tens of MB to the browser and takes seconds to draw,
while a person looks at a few thousand marks at most. So the page draws at most `budget` nodes:
the selected node's path from the root with its children (always), then the most-visited subtrees
first (visits N, then shallower first). A node whose children are not drawn is one marker that
counts what it hides; selecting it makes it the focus, and its subtree is drawn first next time.

A node's children are drawn all together or not at all, so siblings are never split and the
layout stays a true picture of the branching.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection

from engine.tree_columns import TreeColumns
from engine.tree_nodes import SearchTree

DEFAULT_BUDGET = 3000  # markers drawn at most (plus the focus path's siblings if they exceed it)


def subtree_sizes(tree: SearchTree | TreeColumns) -> list[int]:
    """Nodes in each node's subtree, itself included (`TreeColumns.subtree_sizes`)."""
    return TreeColumns.from_tree(tree).subtree_sizes()


def choose_open(
    tree: SearchTree | TreeColumns,
    budget: int = DEFAULT_BUDGET,
    focus: int | None = None,
    max_depth: int | None = None,
    collapsed: Collection[int] = (),
) -> frozenset[int]:
    """The nodes whose children are drawn. The drawn nodes are the root and the children of these.

    Nodes below `collapsed` nodes or deeper than `max_depth` are never drawn (the user asked so).
    The path to `focus` and its children are opened first, even past the budget; then the focus's
    subtree, then the rest, most visits first, for as long as whole sibling groups fit.
    """
    shape = TreeColumns.from_tree(tree)
    children, depth, visits, parent = shape.children, shape.depth, shape.N, shape.parent
    folded = set(collapsed)
    limit = max_depth if max_depth is not None else len(shape)

    def openable(v: int) -> bool:
        return bool(children[v]) and v not in folded and depth[v] < limit

    opened: set[int] = set()
    shown = 1
    chain: list[int] = []
    if focus is not None and 0 <= focus < len(shape):
        v: int | None = focus
        while v is not None:
            chain.append(v)
            v = parent[v]
        chain.reverse()
        for v in chain:
            if not openable(v):
                break
            opened.add(v)
            shown += len(children[v])

    heap: list[tuple[int, int, int, int]] = []
    focused: set[int] = set()  # queued nodes inside the focus's subtree

    def push(start: int, inside: bool) -> None:
        stack = [(start, inside)]
        while stack:  # through the already opened nodes (the focus path) to the ones that can open
            v, inside = stack.pop()
            inside = inside or v == focus
            if v in opened:
                stack.extend((c, inside) for c in children[v])
            elif openable(v):
                if inside:
                    focused.add(v)
                heapq.heappush(heap, (0 if inside else 1, -visits[v], depth[v], v))

    push(0, False)
    while heap and shown < budget:
        _, _, _, v = heapq.heappop(heap)
        k = len(children[v])
        if shown + k > budget:
            continue  # a smaller sibling group elsewhere may still fit
        opened.add(v)
        shown += k
        for c in children[v]:
            push(c, v in focused)
    return frozenset(opened)


def visible_ids(tree: SearchTree | TreeColumns, opened: Collection[int]) -> list[int]:
    """The drawn nodes for `opened` (breadth-first from the root)."""
    children = TreeColumns.from_tree(tree).children
    out = [0]
    for v in out:
        if v in opened:
            out.extend(children[v])
    return out


def fully_shown(tree: SearchTree | TreeColumns, opened: Collection[int], node: int, max_depth: int | None = None,
                collapsed: Collection[int] = ()) -> bool:
    """Whether `node` is drawn with its children (or cannot be: a leaf, folded or at the depth limit);
    when not, the page makes it the focus."""
    shape = TreeColumns.from_tree(tree)
    drawn = node == 0 or shape.parent[node] in opened
    can_open = bool(shape.children[node]) and node not in collapsed and (
        max_depth is None or shape.depth[node] < max_depth)
    return drawn and (node in opened or not can_open)
