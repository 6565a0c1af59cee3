"""The Tree explorer's text-free tree (`dashboard.shape`): read whole or grown by the nodes a search
added since, it holds the same numbers, values (eq. 10) and best path as the whole tree."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from dash_fixtures import copy_store, grow_tree

from dashboard import data
from engine.store import Store
from engine.tree_columns import TreeColumns as TreeShape
from engine.tree_nodes import SearchTree


def same(shape: TreeShape, tree: SearchTree) -> None:
    nodes = tree.nodes
    assert len(shape) == len(nodes)
    assert shape.parent == [n.parent for n in nodes] and shape.depth == [n.depth for n in nodes]
    assert shape.N == [n.N for n in nodes] and shape.value_sum == [n.value_sum for n in nodes]
    assert shape.children == [n.children for n in nodes]
    assert shape.terminal == [n.terminal for n in nodes] and shape.critic_rank == [n.critic_rank for n in nodes]
    assert [None if math.isnan(q) else q for q in shape.q_critic] == [n.Q_critic for n in nodes]
    for alpha in (0.0, 0.3, 1.0):
        assert np.allclose(shape.value(alpha), [n.value(alpha) for n in nodes])
        assert shape.best_path(alpha) == tree.best_path(alpha)
    assert np.allclose(shape.q_mcts(), [n.Q_mcts for n in nodes])
    assert shape.simulations == len(tree.simulations) and shape.solved == tree.solved()
    leaf = len(nodes) - 1
    assert shape.path(leaf) == [n.id for n in tree.path(nodes[leaf])]


def test_shape_read_whole_and_grown_equals_the_tree(store_db, tmp_path: Path) -> None:
    source, runs = store_db
    db = copy_store(source, tmp_path / "live.db")
    with Store(db, readonly=True) as store:
        tree_id = store.tree_id(runs["main"], "goal-4")
        tree = store.load_tree(tree_id)
    first = data.read_shape(str(db), tree_id)
    same(first, tree)
    assert TreeShape.from_tree(tree) == first
    old_children = [list(c) for c in first.children]

    parent = max(n.id for n in tree.nodes if n.action is not None)
    grow_tree(db, runs["main"], "goal-4", parent=parent, n=3)
    grow_tree(db, runs["main"], "goal-4", parent=0, n=2)
    grown = data.read_shape(str(db), tree_id, since=first)
    with Store(db, readonly=True) as store:
        now = store.load_tree(tree_id)
    same(grown, now)
    assert first.children == old_children  # the older shape (shared between sessions) is unchanged


def test_a_tree_that_does_not_continue_the_older_shape_is_read_whole(store_db) -> None:
    path, runs = store_db
    with Store(path, readonly=True) as store:
        trees = sorted((len(store.load_tree(t).nodes), t) for t, _ in store.tree_ids(runs["main"]))
        (_, small_id), (_, big_id) = trees[0], trees[-1]
        big = store.load_tree(big_id)
    other = data.read_shape(str(path), small_id)
    assert len(other) < len(big.nodes)  # its ids would look like a prefix of the big tree's
    same(data.read_shape(str(path), big_id, since=other), big)
