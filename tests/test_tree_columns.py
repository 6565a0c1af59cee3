"""The tree algorithms written once (engine/tree_columns.py), on a tree small enough to work by hand,
run on the columns and on the search's tree of nodes alike.

    node  parent  N  value_sum  Q^    terminal     Q~     Q (alpha 0.5)          Q (1.0)  Q (0.0)
    0     -       4  2.0        -     -            0.5    0.5                    0.5      0.5
    1     0       3  1.0        0.9   -            1/3    1/6 + 0.45 = 0.61667   1/3      0.9
    2     0       1  1.0        0.1   -            1.0    0.5 + 0.05 = 0.55      1.0      0.1
    3     1       2  0.0        -     -            0.0    0.0                    0.0      0.0
    4     1       1  1.0        -     success      1.0    1.0                    1.0      1.0
    5     3       1  0.0        -     failure      0.0    0.0                    0.0      0.0
    6     2       0  0.0        -     -            0.0    0.0 (never visited)    0.0      0.0
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.envs.base import TaskSpec
from engine.tree_columns import NodeRows, TreeColumns, best_path, path, reroot_ids, value
from engine.tree_nodes import SearchTree, Simulation, reroot

PARENT = [None, 0, 0, 1, 1, 3, 2]
N = [4, 3, 1, 2, 1, 1, 0]
SUMS = [2.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
Q_CRITIC = [None, 0.9, 0.1, None, None, None, None]
RANK = [None, 0, 1, None, None, None, None]
TERMINAL = [None, None, None, None, "success", "failure", None]
VALUES = {0.5: [0.5, 1 / 6 + 0.45, 0.55, 0.0, 1.0, 0.0, 0.0],
          1.0: [0.5, 1 / 3, 1.0, 0.0, 1.0, 0.0, 0.0],
          0.0: [0.5, 0.9, 0.1, 0.0, 1.0, 0.0, 0.0]}
BEST = {0.5: [1, 4], 1.0: [2], 0.0: [1, 4]}  # alpha 1.0: node 2 wins, and its only child was never visited


def rows(ids: range = range(7)) -> NodeRows:
    return NodeRows(task_id="t", goal="g", simulations=4, solved=True, node_id=list(ids),
                    parent=[PARENT[i] for i in ids], depth=[_depth(i) for i in ids], N=[N[i] for i in ids],
                    value_sum=[SUMS[i] for i in ids], q_critic=[Q_CRITIC[i] for i in ids],
                    critic_rank=[RANK[i] for i in ids], terminal=[TERMINAL[i] for i in ids])


def _depth(v: int) -> int:
    return 0 if PARENT[v] is None else 1 + _depth(PARENT[v])  # type: ignore[arg-type]


def search_tree() -> SearchTree:
    tree = SearchTree.new(TaskSpec(id="t", goal="g"), "start")
    for i in range(1, 7):
        tree.add_child(tree.nodes[PARENT[i]], observation=f"obs {i}", N=N[i], value_sum=SUMS[i],  # type: ignore[index]
                       Q_critic=Q_CRITIC[i], critic_rank=RANK[i], terminal=TERMINAL[i])
    tree.root.N, tree.root.value_sum = N[0], SUMS[0]
    tree.simulations = [Simulation((1, 4), 1.0), Simulation((1, 3, 5), 0.0), Simulation((1, 3), 0.0),
                        Simulation((2,), 1.0)]
    assert tree.check_invariants() == []
    return tree


@pytest.mark.parametrize("alpha", sorted(VALUES))
def test_values_and_best_path_by_hand(alpha: float) -> None:
    cols = TreeColumns.from_rows(rows())
    assert np.allclose(cols.value(alpha), VALUES[alpha])
    assert np.allclose(cols.value(alpha, np.array([2, 1])), [VALUES[alpha][2], VALUES[alpha][1]])
    assert [cols.node_value(v, alpha) for v in range(7)] == pytest.approx(VALUES[alpha])
    assert cols.best_path(alpha) == BEST[alpha]
    tree = search_tree()  # the search's nodes run the same algorithms
    assert [n.value(alpha) for n in tree.nodes] == pytest.approx(VALUES[alpha])
    assert tree.best_path(alpha) == BEST[alpha]
    assert tree.best_child(0, alpha) == BEST[alpha][0] and tree.best_child(BEST[alpha][0], alpha) == (BEST[alpha][1:] or [None])[0]
    assert tree.best_child(2, alpha) is None and tree.best_child(6, alpha) is None  # 6: never visited; a leaf


def test_q_mcts_and_a_missing_critic_score() -> None:
    cols = TreeColumns.from_rows(rows())
    assert np.allclose(cols.q_mcts(), [0.5, 1 / 3, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert math.isnan(cols.q_critic[0]) and cols.q_critic[1] == 0.9  # NaN in the columns, None in the rows
    assert value(1.0, 2, None, 0.3) == value(1.0, 2, math.nan, 0.3) == 0.5
    assert value(0.0, 0, 0.8, 0.25) == pytest.approx(0.6)  # unvisited: Q~ = 0, the critic's share stays


def test_best_path_ties_go_to_more_visits_then_the_older_child() -> None:
    children = {0: [1, 2, 3], 1: [], 2: [], 3: []}
    visits = {0: 6, 1: 2, 2: 4, 3: 4}
    assert best_path(children.__getitem__, visits.__getitem__, lambda v: 0.5) == [2]
    assert best_path(children.__getitem__, visits.__getitem__, lambda v: 1.0 if v == 1 else 0.5) == [1]


def test_path_to_a_node() -> None:
    cols = TreeColumns.from_rows(rows())
    assert cols.path(5) == [1, 3, 5] and cols.path(6) == [2, 6] and cols.path(0) == []
    tree = search_tree()
    assert [n.id for n in tree.path(tree.nodes[5])] == [1, 3, 5]
    assert path({0: None, 1: 0}.__getitem__, 1) == [1]


def test_reroot_keeps_the_path_and_the_subtree_by_hand() -> None:
    cols = TreeColumns.from_rows(rows())
    assert reroot_ids(cols.parent.__getitem__, cols.children.__getitem__, 3) == [0, 1, 3, 5]
    assert reroot_ids(cols.parent.__getitem__, cols.children.__getitem__, 1) == [0, 1, 3, 4, 5]
    assert reroot_ids(cols.parent.__getitem__, cols.children.__getitem__, 0) == list(range(7))

    rooted, v = cols.reroot(3)
    assert v == 2 and len(rooted) == 4
    assert rooted.parent == [None, 0, 1, 2] and rooted.children == [[1], [2], [3], []]
    assert rooted.depth == [0, 1, 2, 3] and rooted.N == [4, 3, 2, 1] and rooted.terminal[3] == "failure"
    assert rooted.critic_rank == [None, 0, None, None] and rooted.q_critic[1] == 0.9
    assert rooted.simulations == 0 and not rooted.solved  # the success leaf (node 4) is not kept

    tree, nid = reroot(search_tree(), 3)  # the search's copy keeps the same nodes, texts included
    assert nid == 2 and [n.observation for n in tree.nodes] == ["start", "obs 1", "obs 3", "obs 5"]
    assert tree.columns() == rooted


def test_subtree_sizes_by_hand() -> None:
    assert TreeColumns.from_rows(rows()).subtree_sizes() == [7, 4, 2, 2, 1, 1, 1]


def test_the_search_tree_columns_equal_the_rows_read() -> None:
    tree = search_tree()
    assert tree.columns() == TreeColumns.from_rows(rows())
    assert TreeColumns.from_tree(tree) == tree.columns() and TreeColumns.from_tree(tree.columns()) == tree.columns()
    assert rows().n == rows().N == N  # the store's column name reads the same column
    assert tree.columns().children == [n.children for n in tree.nodes]


def test_grown_by_the_rows_added_since() -> None:
    first = TreeColumns.from_rows(rows(range(4)))
    grown = first.extended(rows(range(4, 7)), (N, SUMS))
    assert grown == TreeColumns.from_rows(rows())
    assert first.children == [[1, 2], [3], [], []]  # the older tree is not changed
    with pytest.raises(ValueError, match="start at 5"):
        first.extended(rows(range(5, 7)), (N, SUMS))
    with pytest.raises(ValueError, match="not at the root"):
        TreeColumns.from_rows(rows(range(2, 7)))
