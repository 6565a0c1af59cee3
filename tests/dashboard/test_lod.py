"""Level of detail (dashboard.lod): the budget holds, the selected node's path and children are always
drawn, and the hexagons' counts add up to exactly the nodes not drawn."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard import lod
from dashboard.layout import layout_tree
from engine.envs.base import TaskSpec
from engine.tree_nodes import SearchTree


def random_tree(n: int, seed: int, window: int = 40) -> SearchTree:
    """n nodes, random shape (parents among the newest `window` nodes: small windows make deep trees),
    visits backpropagated along random paths (N of a parent >= its child's)."""
    rng = random.Random(seed)
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    while len(tree.nodes) < n:
        parent = tree.nodes[rng.randrange(max(0, len(tree.nodes) - window), len(tree.nodes))]
        for _ in range(rng.randint(1, 4)):
            if len(tree.nodes) < n:
                tree.add_child(parent, observation="o")
        leaf = tree.nodes[-1]
        tree.backpropagate([p.id for p in tree.path(leaf)], rng.random())
    return tree


def check_drawn(tree: SearchTree, opened: frozenset[int], budget: int, focus: int | None) -> None:
    shown = lod.visible_ids(tree, opened)
    assert len(set(shown)) == len(shown)
    chain = [0, *(n.id for n in tree.path(tree.nodes[focus]))] if focus is not None else []
    forced = 1 + sum(len(tree.nodes[v].children) for v in chain)
    assert len(shown) <= max(budget, forced), "budget exceeded beyond the focus path"
    if focus is not None:
        assert set(chain) <= set(shown) and set(tree.nodes[focus].children) <= set(shown)
    lay = layout_tree(tree, opened=opened)
    assert sorted(lay.ids.tolist()) == sorted(shown)
    assert len(lay) + int(lay.hidden.sum()) == len(tree.nodes)  # every node drawn or counted once
    for v, h in zip(lay.ids.tolist(), lay.hidden.tolist(), strict=True):
        assert (h > 0) == (bool(tree.nodes[v].children) and v not in opened)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32 - 1), st.integers(1, 200), st.booleans())
def test_budget_focus_path_and_counts(n: int, seed: int, budget: int, with_focus: bool) -> None:
    tree = random_tree(n, seed)
    focus = random.Random(seed).randrange(n) if with_focus else None
    check_drawn(tree, lod.choose_open(tree, budget, focus), budget, focus)


def test_a_small_tree_is_drawn_whole_and_a_big_one_fills_the_budget() -> None:
    small = random_tree(300, 1)
    opened = lod.choose_open(small, 3000)
    assert len(lod.visible_ids(small, opened)) == 300
    assert layout_tree(small, opened=opened).ids.tolist() == layout_tree(small).ids.tolist()
    big = random_tree(20_000, 2)
    shown = lod.visible_ids(big, lod.choose_open(big, 1000))
    assert 900 <= len(shown) <= 1000  # whole sibling groups (1-4 nodes) until the next one does not fit


def test_most_visited_subtrees_are_drawn_first() -> None:
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    a, b = (tree.add_child(tree.root, observation=o) for o in "ab")
    for parent in (a, b):
        for _ in range(3):
            tree.add_child(parent, observation="c")
    tree.backpropagate([a.id], 1.0)
    for _ in range(5):
        tree.backpropagate([b.id], 0.0)
    opened = lod.choose_open(tree, 6)  # root + a, b + one group of three
    assert opened == {0, b.id}


def test_the_focus_subtree_goes_first_and_past_the_budget() -> None:
    tree = random_tree(5000, 3)
    deep = max(tree.nodes, key=lambda n: (n.depth, n.id))
    opened = lod.choose_open(tree, 50, focus=deep.id)
    check_drawn(tree, opened, 50, deep.id)
    folder = next(n for n in tree.nodes if len(n.children) >= 2 and n.N >= 1 and n.id > 100)
    opened = lod.choose_open(tree, 400, focus=folder.id)
    shown = set(lod.visible_ids(tree, opened))
    below = {c for c in folder.children if tree.nodes[c].children}
    assert below and below <= opened, "the focus's subtree is opened before the rest of the tree"
    assert lod.fully_shown(tree, opened, folder.id) and folder.id in shown


def test_depth_limit_and_collapse_are_respected() -> None:
    tree = random_tree(2000, 4)
    opened = lod.choose_open(tree, 3000, max_depth=2, collapsed=[tree.root.children[0]])
    shown = lod.visible_ids(tree, opened)
    assert max(tree.nodes[v].depth for v in shown) <= 2
    assert tree.root.children[0] not in opened
    folded = tree.root.children[0]
    hidden_child = tree.nodes[folded].children[0] if tree.nodes[folded].children else None
    if hidden_child is not None:  # the selected node below a fold stays hidden (the user folded it)
        opened = lod.choose_open(tree, 3000, focus=hidden_child, collapsed=[folded])
        assert hidden_child not in lod.visible_ids(tree, opened)
        assert not lod.fully_shown(tree, opened, hidden_child, collapsed={folded})


@pytest.mark.parametrize("n", [100_000])
def test_choosing_is_fast_on_a_big_tree(n: int) -> None:
    import time

    tree = random_tree(n, 5, window=n)  # depth ~ log n, as a search's depth limit keeps it
    t = time.perf_counter()
    opened = lod.choose_open(tree, lod.DEFAULT_BUDGET, focus=n - 1)
    lay = layout_tree(tree, opened=opened)
    took = time.perf_counter() - t
    assert len(lay) <= lod.DEFAULT_BUDGET + 200
    assert took < 2.0, f"level of detail + layout took {took:.2f} s at {n} nodes"
